"""CTranslate2's converted GPT-2 (``model.bin``) read back as a refgpt Model: its int8 weights and
scales dequantized, so a golden is the float64 GPT-2 of exactly the weights CTranslate2 runs.

    model = read_model("ct2-dir")                 # ct2-transformers-converter --quantization int8
    golden.make(model, tokens)                    # the quantized golden of CTranslate2's weights

``model.bin`` (CTranslate2's binary version 6, written by its converter's ``_serialize``): u32
version, the spec's name (u16 length with its NUL, the bytes, NUL), u32 revision, u32 variable
count, then each variable — name, u8 rank, u32 dims, u8 type (0 float32, 1 int8, 2 int16, 3 int32,
4 float16, 5 bfloat16), u32 byte count, the bytes (little-endian) — and u32 alias count with
(alias, target) names. Every count and size is checked against the bytes left; names must be
unique and the file read to its last byte.

An int8 matrix W_q [out, in] comes with ``weight_scale`` [out] = 127 / max|row| (float32), and
stands for W = W_q / scale, computed here in float64 (one rounding, 2⁻⁵³ relative). GPT-2's
layout in CTranslate2: ``decoder/embeddings/weight`` (W_E; the projection is an alias of it),
``decoder/position_encodings/encodings``, per layer ``self_attention/layer_norm`` (ln1, gamma and
beta), ``self_attention/linear_0`` (the fused Q | K | V, [3·d, d], nn.Linear's [out, in]),
``self_attention/linear_1`` (W_O), ``ffn/layer_norm`` (ln2), ``ffn/linear_0`` (W_in), ``ffn/linear_1``
(W_out), and ``decoder/layer_norm`` (ln_final). The file holds no LayerNorm ε when the converter
wrote ``layer_norm_epsilon: null``: then GPT-2's (``eps``, 1e-5 by default) is used, and said in
``model.quantization["layer_norm_epsilon"]``.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np

from ..errors import RefGPTError, as_path
from ..files.checkpoint import expected_shapes, to_circuits
from ..files.whole_file import read_bytes
from ..gpt2.config import Config
from ..model import Model
from .quantized import OpVerdict, int8_linear_bound, op_verdict

_TYPES = {0: np.dtype("<f4"), 1: np.dtype("i1"), 2: np.dtype("<i2"), 3: np.dtype("<i4"), 4: np.dtype("<f2")}
_TYPE_NAMES = {0: "float32", 1: "int8", 2: "int16", 3: "int32", 4: "float16", 5: "bfloat16"}


def read_variables(path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(variables, aliases) of a CTranslate2 ``model.bin``, checked as the module docstring says."""
    path = as_path(path, "CTranslate2 model.bin")
    data = read_bytes(path, "CTranslate2 model.bin")
    at = 0

    def take(n: int, what: str) -> bytes:
        nonlocal at
        if n > len(data) - at:
            raise RefGPTError(f"{path}: truncated CTranslate2 model: {what} at byte {at} runs past its end ({len(data)} bytes)")
        at += n
        return data[at - n:at]

    def number(fmt: str, what: str) -> int:
        return struct.unpack("<" + fmt, take(struct.calcsize(fmt), what))[0]

    def string(what: str) -> str:
        raw = take(number("H", f"the length of {what}"), what)
        if not raw or raw[-1:] != b"\0":
            raise RefGPTError(f"{path}: {what} at byte {at - len(raw)} is not NUL-terminated")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise RefGPTError(f"{path}: {what} is not UTF-8") from None

    version = number("I", "the version")
    if version != 6:
        raise RefGPTError(f"{path}: CTranslate2 binary version {version}; refgpt reads version 6")
    spec = string("the spec name")
    if spec != "TransformerDecoderSpec":
        raise RefGPTError(f"{path}: a {spec!r}; refgpt reads CTranslate2's GPT-2 (TransformerDecoderSpec)")
    number("I", "the revision")
    variables: dict[str, np.ndarray] = {}
    for _ in range(number("I", "the variable count")):
        name = string("a variable name")
        if name in variables:
            raise RefGPTError(f"{path}: variable {name!r} appears twice")
        dims = [number("I", f"the dims of {name!r}") for _ in range(number("B", f"the rank of {name!r}"))]
        code = number("B", f"the type of {name!r}")
        size = number("I", f"the size of {name!r}")
        dtype = _TYPES.get(code)
        if dtype is None:
            raise RefGPTError(f"{path}: variable {name!r} is of type {_TYPE_NAMES.get(code, code)}, which refgpt does not read")
        if size != int(np.prod(dims, dtype=object)) * dtype.itemsize:
            raise RefGPTError(f"{path}: variable {name!r} of shape {dims} ({_TYPE_NAMES[code]}) says {size} bytes")
        variables[name] = np.frombuffer(take(size, name), dtype=dtype).reshape(dims)
    aliases = {}
    for _ in range(number("I", "the alias count")):
        alias, target = string("an alias"), string("an alias target")
        aliases[alias] = target
    if at != len(data):
        raise RefGPTError(f"{path}: {len(data) - at} bytes after the model's last entry")
    return variables, aliases


def read_model(directory, dtype="float64", eps: float = 1e-5) -> Model:
    """The GPT-2 a CTranslate2 directory holds, its int8 matrices dequantized; ``model.quantization``
    maps each stored matrix to its type."""
    directory = as_path(directory, "CTranslate2 directory")
    variables, aliases = read_variables(directory / "model.bin")
    config_path = directory / "config.json"
    config = json.loads(read_bytes(config_path, "CTranslate2 config.json")) if config_path.exists() else {}
    stored_eps = config.get("layer_norm_epsilon") if isinstance(config, dict) else None
    types = {"layer_norm_epsilon": "from the file" if stored_eps is not None else f"not in the file: GPT-2's {eps}"}

    def get(name: str) -> np.ndarray:
        if name not in variables:
            raise RefGPTError(f"{directory / 'model.bin'}: variable {name!r} is missing")
        value = variables[name]
        if value.dtype == np.int8:
            scale = get(name + "_scale").astype(np.float64)  # [out]
            types[name] = "int8"
            return value.astype(np.float64) / scale[:, None]  # [out, in]
        types.setdefault(name, _TYPE_NAMES[[c for c, t in _TYPES.items() if t == value.dtype][0]])
        return value.astype(np.float64)

    W_E = get("decoder/embeddings/weight")  # [d_vocab, d_model]
    n_layers = len({m.group(1) for k in variables if (m := re.match(r"decoder/layer_(\d+)/", k))})
    heads = variables.get("decoder/num_heads")
    if heads is None or heads.size != 1:
        raise RefGPTError(f"{directory / 'model.bin'}: variable 'decoder/num_heads' is missing")
    W_pos = get("decoder/position_encodings/encodings")  # [n_ctx, d_model]
    cfg = Config(d_model=W_E.shape[1], n_layers=n_layers, n_heads=int(heads.reshape(())), d_vocab=W_E.shape[0],
                 d_mlp=variables["decoder/layer_0/ffn/linear_0/bias"].shape[0] if n_layers else 4 * W_E.shape[1],
                 n_ctx=W_pos.shape[0], eps=float(stored_eps) if stored_eps is not None else eps,
                 tie_word_embeddings=aliases.get("decoder/projection/weight") == "decoder/embeddings/weight")
    t = {"wte.weight": W_E, "wpe.weight": W_pos, "ln_f.weight": get("decoder/layer_norm/gamma"),
         "ln_f.bias": get("decoder/layer_norm/beta")}
    if not cfg.tie_word_embeddings:
        t["lm_head.weight"] = get("decoder/projection/weight")
    for L in range(n_layers):
        a, hf = f"decoder/layer_{L}/", f"h.{L}."
        for part, ln in (("self_attention", "ln_1"), ("ffn", "ln_2")):
            t[hf + ln + ".weight"], t[hf + ln + ".bias"] = get(a + part + "/layer_norm/gamma"), get(a + part + "/layer_norm/beta")
        for ct2, key in (("self_attention/linear_0", "attn.c_attn"), ("self_attention/linear_1", "attn.c_proj"),
                         ("ffn/linear_0", "mlp.c_fc"), ("ffn/linear_1", "mlp.c_proj")):
            t[hf + key + ".weight"] = get(a + ct2 + "/weight").T  # nn.Linear's [out, in] → Conv1D's [in, out]
            t[hf + key + ".bias"] = get(a + ct2 + "/bias")
    for key, shape in expected_shapes(cfg).items():
        if t[key].shape != shape:
            raise RefGPTError(f"{directory / 'model.bin'}: {key} (CTranslate2's) has shape {list(t[key].shape)}, "
                              f"expected {list(shape)} from the embeddings and layer 0")
    model = Model(cfg, to_circuits(t, cfg), dtype=dtype, source=directory / "model.bin")
    model.quantization = types
    return model


def judge_int8_logits(directory, logits) -> OpVerdict:
    """CTranslate2 int8's one exposed tensor, its logits [batch, pos, d_vocab], judged locally as the
    product ln_final.out · W_Uᵀ on CTranslate2's own input (refgpt.oracle.quantized.int8_linear_bound).

    That input is not exposed, but an int8 product gives it away: logits·w_scale = (q/a)·W_qᵀ with
    W_q, w_scale read from model.bin, so x̂ = q/a is the least-squares solution over the d_vocab ≥
    d_model equations (W_q has full column rank), a = 127/max|x̂| and q = round(x̂·a) are its integers,
    and a row's scale a is the float32 nearest the least-squares fit of 1/a over the row's logits. The
    verdict then judges the int8 GEMM and its epilogue element by element; a row of logits that is no
    int8 product of these weights (a saturated or wrongly scaled accumulator, a wrong weight scale)
    misses every such reconstruction and is out of bounds. What it cannot see: a bug in the rounding
    of the activations themselves, or one scaling a whole row alike (both change the input the
    reconstruction finds, not the product) — those show in the logits' implementation error."""
    directory = as_path(directory, "CTranslate2 directory")
    variables, aliases = read_variables(directory / "model.bin")
    name = aliases.get("decoder/projection/weight", "decoder/projection/weight")
    W_q, w_scale = variables.get(name), variables.get(name + "_scale")
    if W_q is None or W_q.dtype != np.int8 or w_scale is None:
        raise RefGPTError(f"{directory / 'model.bin'}: the projection ({name}) is not stored as int8 with its scale: "
                          "convert with --quantization int8")
    d_vocab, d_model = W_q.shape
    y = np.asarray(logits, np.float64)
    if y.shape[-1] != d_vocab or d_vocab < d_model:
        raise RefGPTError(f"logits of shape {list(y.shape)} do not fit the projection [{d_vocab}, {d_model}] "
                          "(and the input is recovered only when d_vocab ≥ d_model)")
    rows = y.reshape(-1, d_vocab)  # [rows, d_vocab]
    bias = variables.get("decoder/projection/bias")
    unbiased = rows - (0 if bias is None else bias.astype(np.float64))  # [rows, d_vocab]
    W = W_q.astype(np.float64)  # [d_vocab, d_model]
    scale = w_scale.astype(np.float64)  # [d_vocab]
    x_hat = np.linalg.lstsq(W, (unbiased * scale).T, rcond=None)[0].T  # [rows, d_model]
    peak = np.abs(x_hat).max(axis=1, keepdims=True)  # [rows, 1]
    q = np.rint(x_hat * 127 / np.where(peak > 0, peak, 1))  # [rows, d_model]
    per_a = (q @ W.T) / scale  # [rows, d_vocab]: c / w_scale, the logits times a
    inverse = (unbiased * per_a).sum(axis=1) / np.maximum((per_a * per_a).sum(axis=1), np.finfo(float).tiny)  # [rows]
    a = (1 / np.where(inverse > 0, inverse, 1)).astype(np.float32)  # [rows]: the nearest float32
    reference, bound = int8_linear_bound(q, a, W_q, w_scale, bias)  # [rows, d_vocab]
    return op_verdict("logits", name, "int8", rows, reference, bound)


def int8_logits_notes(directory, logits) -> list[str]:
    """``compare --runtime ctranslate2``'s note on an int8 model's logits (``judge_int8_logits``);
    none for a model whose projection is not int8."""
    variables, aliases = read_variables(as_path(directory, "CTranslate2 directory") / "model.bin")
    name = aliases.get("decoder/projection/weight", "decoder/projection/weight")
    if name not in variables or variables[name].dtype != np.int8:
        return []
    verdict = judge_int8_logits(directory, logits)
    return [f"CTranslate2 int8: the logits judged as an int8 product on the input recovered from them "
            f"(docs/oracle.md): worst error / bound {verdict.worst:.3g} at {list(verdict.where)}, "
            + ("within it" if verdict.ok else "an IMPLEMENTATION ERROR in its int8 GEMM, not the quantization")]


__all__ = ["int8_logits_notes", "judge_int8_logits", "read_model", "read_variables"]
