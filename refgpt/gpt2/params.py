"""GPT-2's parameters: their TransformerLens names and shapes, checked, and the flat layout the
fast ops multiply with.

A Model keeps its weights by TransformerLens state-dict name (``blocks.0.attn.W_Q`` [head,
d_model, d_head] …, ``param_shapes``). The ops multiply with them laid out flat, once per model
(``block_layout``): W_Q [head, d_model, d_head] holds the same numbers as one [d_model,
head·d_head] matrix, so q for every head is one matrix product, and W_Q | W_K | W_V side by side
(``W_QKV``, as GPT-2's checkpoints store them in c_attn) makes q, k and v one product. For
weights read from an HF checkpoint that layout is a view of the stored c_attn matrix, so nothing
is copied (``joined_columns``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.lib.array_utils import byte_bounds

from ..errors import RefGPTError
from ..reference import weights


def param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Every parameter's TransformerLens name and shape (refgpt/reference/weights.py)."""
    return weights.param_shapes(cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_mlp, cfg.d_vocab, cfg.n_ctx)


def checked_params(cfg, params: Mapping, dtype) -> dict[str, np.ndarray]:
    """``params`` with every name and shape of ``param_shapes`` (and optionally ``unembed.b_U``
    [d_vocab]), each a float array in ``dtype`` (no copy when it is one already); a RefGPTError
    naming the first parameter that is missing, unknown, not float or of the wrong shape."""
    expected = param_shapes(cfg)
    optional = {"unembed.b_U": (cfg.d_vocab,)}
    unknown = set(params) - set(expected) - set(optional)
    if unknown:
        raise RefGPTError(f"params: unexpected parameter(s) {sorted(unknown)[:5]}")
    checked = {}
    for name, shape in {**expected, **optional}.items():
        if name not in params:
            if name in optional:
                continue
            raise RefGPTError(f"params: {name!r} is missing")
        array = np.asarray(params[name])
        if array.dtype.kind != "f":
            raise RefGPTError(f"params: {name!r} is {array.dtype}, expected a float array")
        if array.shape != shape:
            raise RefGPTError(f"params: {name!r} has shape {list(array.shape)}, expected {list(shape)}")
        checked[name] = array.astype(dtype, copy=False)
    return checked


def bytes_held(params: Mapping, dtype) -> int:
    """Bytes of the ``params`` arrays already in ``dtype`` (kept as they are, not copied), each
    buffer counted once (a tied W_U is a view of W_E)."""
    buffers = {}
    for array in params.values():
        if isinstance(array, np.ndarray) and array.dtype == dtype:
            start = array.__array_interface__["data"][0]
            buffers[start] = max(buffers.get(start, 0), array.nbytes)
    return sum(buffers.values())


def block_layout(params: Mapping, cfg, L: int):
    """Block L's weights as the ops multiply with them: (ln, attn, mlp) dicts. ln: ln1.w, ln1.b,
    ln2.w, ln2.b; attn: W_QKV [d_model, 3·head·d_head] and b_QKV, with W_Q, W_K, W_V [d_model,
    head·d_head] and b_Q, b_K, b_V [head·d_head] views of them, W_O [head·d_head, d_model], b_O;
    mlp: W_in, b_in, W_out, b_out."""
    p, b = params, f"blocks.{L}."
    d = cfg.d_model
    ln = {k: p[b + k] for k in ("ln1.w", "ln1.b", "ln2.w", "ln2.b")}
    W = [p[b + f"attn.W_{x}"].transpose(1, 0, 2).reshape(d, -1) for x in "QKV"]  # [d_model, head·d_head] each
    biases = [p[b + f"attn.b_{x}"].reshape(-1) for x in "QKV"]  # [head·d_head] each
    attn = {"W_QKV": joined_columns(W), "b_QKV": joined_columns(biases)}  # [d_model, 3·head·d_head], [3·head·d_head]
    n = W[0].shape[-1]
    for i, x in enumerate("QKV"):  # views of the fused matrix: W_Q | W_K | W_V
        attn[f"W_{x}"], attn[f"b_{x}"] = attn["W_QKV"][..., i * n:(i + 1) * n], attn["b_QKV"][i * n:(i + 1) * n]
    attn["W_O"] = p[b + "attn.W_O"].reshape(-1, d)  # [head·d_head, d_model]
    attn["b_O"] = p[b + "attn.b_O"]  # [d_model]
    mlp = {k: p[b + "mlp." + k] for k in ("W_in", "b_in", "W_out", "b_out")}
    return ln, attn, mlp


def joined_columns(parts):
    """[A | B | C] joined along the last axis: a view when the parts already lie side by side in
    one buffer (HF's c_attn holds W_Q | W_K | W_V so), otherwise a copy."""
    first, last = parts[0], parts[-1]
    width = first.shape[-1] * first.itemsize  # bytes of one row of one part
    root = first
    while isinstance(root.base, np.ndarray):
        root = root.base
    adjacent = (
        first.strides[-1] == first.itemsize
        and (first.ndim == 1 or first.strides[0] == len(parts) * width)  # a row of [A | B | C] is contiguous
        and all(p.shape == first.shape and p.strides == first.strides and p.dtype == first.dtype
                and byte_bounds(p)[0] == byte_bounds(first)[0] + i * width for i, p in enumerate(parts))
        and byte_bounds(root)[0] <= byte_bounds(first)[0] and byte_bounds(last)[1] <= byte_bounds(root)[1])
    if adjacent:
        shape = (*first.shape[:-1], len(parts) * first.shape[-1])
        return np.lib.stride_tricks.as_strided(first, shape, first.strides, writeable=False)
    return np.concatenate(parts, axis=-1)
