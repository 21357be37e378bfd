"""GPT-2's forward pass, in NumPy, with a hook point at every intermediate value.

    resid = W_E[tokens] + W_pos[positions]                          the residual stream
    for each block L:
        resid = resid + attn_L(ln1_L(resid))                        resid_pre → resid_mid
        resid = resid + mlp_L(ln2_L(resid))                         resid_mid → resid_post
    logits = ln_final(resid) · W_U                                  [pos, d_vocab]

Each block only ever *adds* to the residual stream, and reads it only through a LayerNorm. The
first fact makes the final stream a sum of components (embeddings, each attn_out, each mlp_out);
the second means every block sees the stream's direction, not its size. refgpt's two properties
(docs/layernorm.md) follow from these two lines.

Computation is in float64 by default, or float32 on request, end to end: no intermediate is ever
promoted or demoted. Every hook point is named as in TransformerLens.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
from numpy.lib.array_utils import byte_bounds

from .tl import hook_points, inputs
from .gpt2.activations import ACTIVATIONS
from .gpt2.attention import attention
from .backward import loss_and_grads
from .tl.cache import ActivationCache
from .tl.circuits import CircuitMethods
from .gpt2.config import Config
from .dtypes import compute_dtype
from .errors import RefGPTError, RefGPTTypeError
from .tl.generation import generate
from .tl.hooks import HookPoint, HookRegistry, HookRun
from .gpt2.kv_cache import KVCache
from .gpt2.layernorm import layer_norm
from .gpt2.loss import lm_cross_entropy_loss
from .gpt2.mlp import mlp
from .tl.text import TextMethods

RETURN_TYPES = ("logits", "loss", "both", None)


class Output(NamedTuple):
    """What ``return_type="both"`` returns, as TransformerLens's ``Output``: ``logits, loss = …``
    or ``.logits``, ``.loss``."""

    logits: np.ndarray
    loss: np.ndarray


def param_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every parameter's TransformerLens name and shape."""
    d, h, dh, m = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp
    shapes = {"embed.W_E": (cfg.d_vocab, d), "pos_embed.W_pos": (cfg.n_ctx, d)}
    for L in range(cfg.n_layers):
        b = f"blocks.{L}."
        shapes.update({b + "ln1.w": (d,), b + "ln1.b": (d,)})
        for x in "QKV":
            shapes.update({b + f"attn.W_{x}": (h, d, dh), b + f"attn.b_{x}": (h, dh)})
        shapes.update({b + "attn.W_O": (h, dh, d), b + "attn.b_O": (d,)})
        shapes.update({b + "ln2.w": (d,), b + "ln2.b": (d,)})
        shapes.update({b + "mlp.W_in": (d, m), b + "mlp.b_in": (m,),
                       b + "mlp.W_out": (m, d), b + "mlp.b_out": (d,)})
    shapes.update({"ln_final.w": (d,), "ln_final.b": (d,), "unembed.W_U": (d, cfg.d_vocab)})
    return shapes


def side_by_side(parts):
    """[A | B | C] joined along the last axis: a view when the parts already lie side by side in
    one buffer (HF's c_attn holds W_Q | W_K | W_V so), otherwise a copy."""
    first, last = parts[0], parts[-1]
    width = first.shape[-1] * first.itemsize  # bytes of one row of one part
    root = first
    while isinstance(root.base, np.ndarray):
        root = root.base
    lay_side_by_side = (
        first.strides[-1] == first.itemsize
        and (first.ndim == 1 or first.strides[0] == len(parts) * width)  # a row of [A | B | C] is contiguous
        and all(p.shape == first.shape and p.strides == first.strides and p.dtype == first.dtype
                and byte_bounds(p)[0] == byte_bounds(first)[0] + i * width for i, p in enumerate(parts))
        and byte_bounds(root)[0] <= byte_bounds(first)[0] and byte_bounds(last)[1] <= byte_bounds(root)[1])
    if lay_side_by_side:
        shape = (*first.shape[:-1], len(parts) * first.shape[-1])
        return np.lib.stride_tricks.as_strided(first, shape, first.strides, writeable=False)
    return np.concatenate(parts, axis=-1)


class Model(TextMethods, HookRegistry, CircuitMethods):
    """A GPT-2: its Config, its parameters in circuits notation, and a hookable forward pass.

    ``params`` maps TransformerLens state-dict names (``blocks.0.attn.W_Q``) to arrays; an optional
    ``unembed.b_U`` [d_vocab] is added to the logits (GPT-2 itself has none). The text methods
    (``to_tokens`` …) are in refgpt/tl/text.py, hook management (``add_hook``, ``hooks`` …) in
    refgpt/tl/hooks.py, input handling (text, padding) in refgpt/tl/inputs.py, the circuit helpers
    (``QK``, ``OV``, ``accumulated_bias`` …) in refgpt/tl/circuits.py.
    """

    def __init__(self, cfg: Config, params: dict[str, np.ndarray], dtype="float64", source=None):
        if not isinstance(cfg, Config):
            raise RefGPTTypeError(f"Model: cfg must be a refgpt.Config, found {type(cfg).__name__}")
        if not isinstance(params, Mapping):
            raise RefGPTTypeError(f"Model: params must be a mapping of name → array, found {type(params).__name__}")
        self.cfg = cfg
        self.dtype = compute_dtype(dtype)
        cfg.check_fits_in_memory(self.dtype.itemsize, held=_bytes_held(params, self.dtype))
        self.source = Path(source) if source is not None else None
        self._tokenizer = None
        self.params = MappingProxyType(self._checked(params))  # read-only: a new model for new weights
        self._blocks = [self._flatten_block(L) for L in range(cfg.n_layers)]
        self.hook_dict = {name: HookPoint(name) for name in hook_points.hook_names(cfg.n_layers, switches="all")}
        self._act = ACTIVATIONS[cfg.act_fn]

    @property
    def hook_names(self) -> list[str]:
        """The hook points the forward pass reaches now (with the cfg switches as they are)."""
        return hook_points.hook_names(self.cfg.n_layers, switches=hook_points.switches_on(self.cfg))

    @property
    def tokenizer(self):
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer):
        """Setting a tokenizer sets ``cfg.default_prepend_bos``: True when it has <|endoftext|>."""
        self._tokenizer = tokenizer
        if tokenizer is not None:
            self.cfg.default_prepend_bos = tokenizer.bos_token_id is not None

    def _checked(self, params):
        expected = param_shapes(self.cfg)
        optional = {"unembed.b_U": (self.cfg.d_vocab,)}
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
            checked[name] = array.astype(self.dtype, copy=False)
        return checked

    def block_weights(self, L):
        """Block L's weights as the forward (and backward) pass multiplies with them: (ln, attn,
        mlp) dicts, ln: ln1.w, ln1.b, ln2.w, ln2.b; attn: W_Q, W_K, W_V [d_model, head·d_head],
        b_Q, b_K, b_V [head·d_head], W_O [head·d_head, d_model], b_O; mlp: W_in, b_in, W_out, b_out.
        Built once, when the model is made: views of ``params`` where the layout allows.
        """
        return self._blocks[L]

    def _flatten_block(self, L):
        """Block L's weights in the layout of ``block_weights``.

        Attention weights are flattened over heads, W_Q [head, d_model, d_head] → [d_model,
        head·d_head] and W_O → [head·d_head, d_model], and W_Q | W_K | W_V side by side are
        ``W_QKV`` [d_model, 3·head·d_head] (b_QKV likewise), so that q, k and v are one matrix
        product. For weights read from an HF checkpoint this is a view of the stored c_attn
        matrix; otherwise it is copied once, here, and W_Q, W_K, W_V are views of it.
        """
        p, b = self.params, f"blocks.{L}."
        d = self.cfg.d_model
        ln = {k: p[b + k] for k in ("ln1.w", "ln1.b", "ln2.w", "ln2.b")}
        W = [p[b + f"attn.W_{x}"].transpose(1, 0, 2).reshape(d, -1) for x in "QKV"]  # [d_model, head·d_head] each
        bias = [p[b + f"attn.b_{x}"].reshape(-1) for x in "QKV"]  # [head·d_head] each
        attn = {"W_QKV": side_by_side(W), "b_QKV": side_by_side(bias)}  # [d_model, 3·head·d_head], [3·head·d_head]
        n = W[0].shape[-1]
        for i, x in enumerate("QKV"):  # views of the fused matrix: W_Q | W_K | W_V
            attn[f"W_{x}"], attn[f"b_{x}"] = attn["W_QKV"][..., i * n:(i + 1) * n], attn["b_QKV"][i * n:(i + 1) * n]
        attn["W_O"] = p[b + "attn.W_O"].reshape(-1, d)  # [head·d_head, d_model]
        attn["b_O"] = p[b + "attn.b_O"]  # [d_model]
        mlp = {k: p[b + "mlp." + k] for k in ("W_in", "b_in", "W_out", "b_out")}
        return ln, attn, mlp

    # ---- the forward pass, TransformerLens's way in (inputs.py) and out ----------------------

    def __call__(self, input, return_type="logits", loss_per_token=False, prepend_bos=None, padding_side=None,
                 start_at_layer=None, tokens=None, attention_mask=None, stop_at_layer=None, past_kv_cache=None,
                 *, past=None, last_only=False):
        """TransformerLens's forward: ``input`` is text, a list of texts (→ [batch, pos] with
        ``prepend_bos``, ``padding_side``) or token ids [pos] / [batch, pos].

        ``return_type``: "logits" ([batch, pos, d_vocab]; [pos, d_vocab] for unbatched ids),
        "loss" (mean next-token loss; [batch, pos − 1] with ``loss_per_token``), "both" (an
        ``Output(logits, loss)``) or None. ``attention_mask`` [batch, pos]: 1 real, 0 pad (refgpt/gpt2/padding.py).
        ``start_at_layer``: ``input`` is the residual stream [batch, pos, d_model] entering that
        block (``tokens`` then give the loss). ``stop_at_layer``: return the stream entering that
        block instead of logits. ``past_kv_cache`` (or ``past``): a KVCache holding the earlier
        positions. ``last_only``: logits of the last position only (refgpt's, for generation).
        """
        return self._run(input, (), return_type, loss_per_token, prepend_bos, padding_side, start_at_layer,
                         tokens, attention_mask, stop_at_layer, past_kv_cache if past is None else past, last_only)[0]

    forward = __call__

    def run_with_hooks(self, *model_args, fwd_hooks=(), bwd_hooks=(), reset_hooks_end=True, clear_contexts=False,
                       **model_kwargs):
        """The forward pass with ``fwd_hooks`` = [(name or predicate, fn(activation, hook)), …]
        added for this pass (refgpt/tl/hooks.py); ``bwd_hooks`` stay for ``loss_and_grads`` only
        with ``reset_hooks_end=False``, as in TransformerLens."""
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts):
            return self(*model_args, **model_kwargs)

    def run_with_cache(self, *model_args, names_filter=None, names=None, remove_batch_dim=False, pos_slice=None,
                       fwd_hooks=(), reset_hooks_end=True, clear_contexts=False, return_cache_object=True,
                       device=None, incl_bwd=False, **model_kwargs):
        """(output, cache). ``names_filter`` (alias ``names``): None (every hook point), a name, a
        list of names, or a predicate. ``remove_batch_dim``: drop the batch axis (batch 1 only).
        ``pos_slice``: keep these positions of every activation (TransformerLens's Slice rules).
        ``incl_bwd`` (with ``return_type="loss"``): also ``name + "_grad"``, ∂loss/∂ each cached
        activation, from ``loss_and_grads``. The other keywords go to the forward pass."""
        if names is not None and names_filter is not None:
            raise RefGPTError("run_with_cache: pass names_filter= or its alias names=, not both")
        selected = self.chosen_names(names_filter if names is None else names, "run_with_cache names_filter")
        try:  # the forward's arguments by name, positional ones too (as TransformerLens: input, return_type, …)
            forward = _FORWARD_SIGNATURE.bind(self, *model_args, **model_kwargs).arguments
        except TypeError as error:
            raise RefGPTTypeError(f"run_with_cache: {error}") from None
        forward.pop("self")
        with self.hooks(fwd_hooks, (), reset_hooks_end, clear_contexts):
            out, cache = self._run(cache_names=selected, **forward)
            if incl_bwd:
                if forward.get("return_type") != "loss":
                    raise RefGPTError("run_with_cache: incl_bwd=True needs return_type='loss' (the gradient of what?)")
                input = forward["input"]
                if inputs.is_text(input):
                    input = self.to_tokens(input, forward.get("prepend_bos"), forward.get("padding_side"))
                grads = self.loss_and_grads(input)
                cache = ActivationCache({**cache.cache_dict, **{n + "_grad": grads.activations[n] for n in selected
                                                                if n in grads.activations}}, self)
        if pos_slice is not None:
            cache = cache.apply_slice_to_pos_dim(pos_slice)
        if remove_batch_dim:
            cache = cache.remove_batch_dim()
        return out, (cache if return_cache_object else cache.cache_dict)

    def loss_and_grads(self, tokens, targets=None):
        """Mean next-token cross-entropy and its gradient for every parameter and every hook point
        (a ``refgpt.backward.Gradients``); ``targets`` default to the next tokens (docs/backward.md).
        Backward hooks on the model (``add_hook(…, dir="bwd")``) see and may replace each
        ∂loss/∂activation as it flows."""
        return loss_and_grads(self, tokens, targets)

    def kv_cache(self, batch: int = 1) -> KVCache:
        """An empty KVCache for incremental decoding of ``batch`` sequences (refgpt/gpt2/kv_cache.py)."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise RefGPTError(f"kv_cache: batch must be a whole number ≥ 1, found {batch!r:.40}")
        return KVCache(self.cfg, batch, self.dtype)

    def generate(self, input="", max_new_tokens: int = 10, **kwargs):
        """TransformerLens's ``generate``: extend text or tokens (see refgpt/tl/generation.py)."""
        return generate(self, input, max_new_tokens, **kwargs)

    def _run(self, input, cache_names=(), return_type="logits", loss_per_token=False, prepend_bos=None,
             padding_side=None, start_at_layer=None, tokens=None, attention_mask=None, stop_at_layer=None,
             past_kv_cache=None, last_only=False, past=None):
        """(output, ActivationCache): read the input (inputs.py), run the forward pass, take the loss."""
        past = past_kv_cache if past is None else past
        if return_type not in RETURN_TYPES:
            raise RefGPTError(f"return_type must be one of {RETURN_TYPES}, found {return_type!r}")
        if past is not None and (start_at_layer not in (None, 0) or stop_at_layer is not None):
            raise RefGPTError("a pass with a KV cache runs every block (the cache holds every layer's keys); "
                              "start_at_layer/stop_at_layer are for passes without one")
        resid = None
        if start_at_layer is None:
            tokens, batched, padding = inputs.tokens_and_padding(self, input, prepend_bos, padding_side, attention_mask, past)
        else:
            resid, batched, tokens, padding = inputs.residual_input(self, input, tokens, attention_mask, past)
        start = past.length if past is not None else 0
        run = HookRun(self.hook_dict, cache_names, start=start, positions=_hook_positions(padding))
        logits = self.forward_pass(tokens, run, past, last_only, padding, start_at_layer, stop_at_layer, resid)
        with np.errstate(over="ignore", invalid="ignore"):
            finite = np.isfinite(np.add.reduce(logits, axis=None))  # one pass over the output (benchmarks/bench_guards.py)
        if not finite:
            self._raise_at_first_non_finite(tokens, past, start, last_only, padding, start_at_layer, stop_at_layer, resid)
        cache = ActivationCache(run.cache, self)
        if stop_at_layer is not None:
            return logits, cache  # the stream entering block stop_at_layer, whatever return_type says (as TL)
        if return_type is None:
            return None, cache
        if return_type == "logits":
            return (logits if batched else logits[0]), cache
        if tokens is None:
            raise RefGPTError(f"return_type={return_type!r} with start_at_layer needs tokens= for the loss")
        loss = lm_cross_entropy_loss(logits, tokens, None if padding is None else padding.mask[:, -tokens.shape[1]:],
                                     per_token=loss_per_token)
        return (loss if return_type == "loss" else Output(logits if batched else logits[0], loss)), cache

    def _raise_at_first_non_finite(self, tokens, past, start, last_only, padding, start_at_layer=None,
                                   stop_at_layer=None, resid=None):
        """The pass's output (the logits, or with stop_at_layer the stream) holds NaN or ±∞ (or only
        its sum overflowed): run the same pass again, checking every hook point after its hooks, and
        raise at the first non-finite one (the −∞ of the causal mask in attention scores is
        expected). The hooks run a second time; a KV cache is rewound first."""
        if past is not None:
            past.length = start  # the cache is rewritten with the same positions
        run = _FirstNonFinite(self.hook_dict, start=start, positions=_hook_positions(padding))
        try:
            logits = self.forward_pass(tokens, run, past, last_only, padding, start_at_layer, stop_at_layer,
                                       resid)  # [batch, pos, d_vocab], or [batch, pos, d_model] with stop_at_layer
        except _NonFinite as found:
            name, index, value = found.args
            raise RefGPTError(f"the forward pass produced {value} at {name} (index {list(index)}) from finite "
                              "input: an overflow of the weights, a hook or an intervention; "
                              f"{self.dtype.name} cannot represent the result") from None
        bad = np.argwhere(~np.isfinite(logits))
        if len(bad):
            where, why = (("the logits", "the unembedding overflowed") if stop_at_layer is None else
                          (f"the stream entering block {stop_at_layer}", "the embedding overflowed"))
            raise RefGPTError(f"the forward pass produced {logits[tuple(bad[0])]} in {where} "
                              f"(index {[int(i) for i in bad[0]]}) from finite input: {why}")

    def forward_pass(self, tokens, point, past=None, last_only=False, padding=None, start_at_layer=None,
                     stop_at_layer=None, resid=None):
        """The forward pass over checked tokens [batch, pos]; ``point`` (a HookRun) is called at
        each hook point; ``past`` a KVCache holding the positions before these, or None; ``padding``
        an inputs.Padding or None. From ``start_at_layer`` on ``resid`` is the stream entering that
        block; with ``stop_at_layer`` the stream entering that block is returned."""
        pos = (tokens if resid is None else resid).shape[1]
        if resid is None:
            resid = self.embed(tokens, point, past.length if past is not None else 0, padding)  # [batch, pos, d_model]
        bias = None if padding is None else padding.bias  # [batch, 1, pos, key]: −∞ on future keys and pads
        for L in range(self.cfg.n_layers)[start_at_layer:stop_at_layer]:
            resid = self.block(L, resid, point, past, bias)  # [batch, pos, d_model]
        if past is not None:
            past.advance(pos)
        if stop_at_layer is not None:
            return resid
        return self.unembed(resid, point, last_only)  # [batch, pos, d_vocab]

    def unembed(self, resid, point, last_only=False):
        """Logits from the final stream: ln_final(resid)·W_U (+ b_U if the model has one)."""
        p = self.params
        final = layer_norm(resid, p["ln_final.w"], p["ln_final.b"], self.cfg.eps, point.scope("ln_final."))  # [batch, pos, d_model]
        if last_only:
            final = final[:, -1:]  # [batch, 1, d_model]
        logits = final @ p["unembed.W_U"]  # [batch, pos, d_vocab]
        if "unembed.b_U" in p:
            logits += p["unembed.b_U"]  # [batch, pos, d_vocab]
        return logits

    def embed(self, tokens, point, start=0, padding=None):
        """The stream entering block 0: W_E[tokens] + W_pos[positions]. Positions run from
        ``start`` (the KV cache's length); in a padded batch from each row's first real token,
        and a pad's position embedding is 0 (refgpt/gpt2/padding.py)."""
        p = self.params
        tokens = point("hook_tokens", tokens) if self.cfg.use_hook_tokens else tokens  # [batch, pos]
        embed = point("hook_embed", p["embed.W_E"][tokens])  # [batch, pos, d_model]
        if padding is None:
            pos_embed = np.broadcast_to(p["pos_embed.W_pos"][start:start + tokens.shape[1]], embed.shape).copy()  # [batch, pos, d_model]
        else:
            pos_embed = p["pos_embed.W_pos"][padding.positions] * padding.real[..., None]  # [batch, pos, d_model]
        return embed + point("hook_pos_embed", pos_embed)  # [batch, pos, d_model]

    def block(self, L, resid, point, past=None, bias=None):
        """Block L: resid_pre → + attn(ln1(resid)) → resid_mid → + mlp(ln2(resid)) → resid_post."""
        b = f"blocks.{L}."
        ln, attn_w, mlp_w = self.block_weights(L)
        cfg = self.cfg
        past_kv = None if past is None else functools.partial(past.extend, L)

        resid_pre = point(b + "hook_resid_pre", resid)  # [batch, pos, d_model]
        if cfg.use_attn_in or cfg.use_split_qkv_input:
            x = self.per_head_inputs(b, resid_pre, ln, point)  # (x_q, x_k, x_v) [batch, pos, head, d_model] each
        else:
            x = layer_norm(resid_pre, ln["ln1.w"], ln["ln1.b"], cfg.eps, point.scope(b + "ln1."))  # [batch, pos, d_model]
        attn_out = attention(x, attn_w, cfg.n_heads, cfg.score_scale(L), point.scope(b + "attn."), past_kv, bias,
                             cfg.use_attn_result)  # [batch, pos, d_model]
        attn_out = point(b + "hook_attn_out", attn_out)  # [batch, pos, d_model]
        resid_mid = point(b + "hook_resid_mid", resid_pre + attn_out)  # [batch, pos, d_model]

        mlp_in = point(b + "hook_mlp_in", resid_mid.copy()) if cfg.use_hook_mlp_in else resid_mid  # [batch, pos, d_model], what ln2 reads
        x = layer_norm(mlp_in, ln["ln2.w"], ln["ln2.b"], cfg.eps, point.scope(b + "ln2."))  # [batch, pos, d_model]
        mlp_out = point(b + "hook_mlp_out", mlp(x, mlp_w, self._act, point.scope(b + "mlp.")))  # [batch, pos, d_model]
        return point(b + "hook_resid_post", resid_mid + mlp_out)  # [batch, pos, d_model]

    def per_head_inputs(self, b, resid_pre, ln, point):
        """TransformerLens's use_attn_in / use_split_qkv_input: each head reads its own copy of the
        stream (``hook_attn_in``, or ``hook_q_input``/``k``/``v``), through ln1 once per input."""
        cfg = self.cfg
        heads = np.repeat(resid_pre[:, :, None], cfg.n_heads, axis=2)  # [batch, pos, head, d_model]
        attn_in = point(b + "hook_attn_in", heads) if cfg.use_attn_in else heads
        if cfg.use_split_qkv_input:
            inputs_ = [point(b + f"hook_{x}_input", heads.copy()) for x in "qkv"]  # [batch, pos, head, d_model] each
        else:
            inputs_ = [attn_in] * 3
        return tuple(layer_norm(x, ln["ln1.w"], ln["ln1.b"], cfg.eps, point.scope(b + "ln1.")) for x in inputs_)

    # ---- input checking -----------------------------------------------------------------------

    def check_tokens(self, tokens, start=0):
        """Integer tokens [pos] or [batch, pos] → (int64 array [batch, pos], was it batched).
        ``start``: positions already held in a KV cache before these."""
        try:
            array = np.asarray(tokens)
        except (ValueError, TypeError, OverflowError) as error:  # ragged lists, ids beyond int64
            raise RefGPTError(f"tokens: not a rectangular integer array ({str(error).splitlines()[0][:80]})") from None
        if array.size == 0:
            raise RefGPTError(f"tokens: empty sequence (shape {list(array.shape)})")
        if array.dtype == bool or array.dtype.kind not in "iu":
            if array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.round(array)):
                raise RefGPTError(f"tokens: must be an integer array, found {array.dtype} (cast with .astype(int))")
            raise RefGPTError(f"tokens: must be integers, found dtype {array.dtype}")
        if array.ndim not in (1, 2):
            raise RefGPTError(f"tokens: must be [pos] or [batch, pos], found {array.ndim} dimensions {list(array.shape)}")
        batched = array.ndim == 2
        array = array.reshape(-1, array.shape[-1]).astype(np.int64, copy=False)  # [batch, pos]
        bad = np.argwhere((array < 0) | (array >= self.cfg.d_vocab))
        if len(bad):
            where = tuple(int(i) for i in bad[0]) if batched else int(bad[0][1])
            raise RefGPTError(
                f"tokens: id {int(array[tuple(bad[0])])} at {'index' if batched else 'position'} {where} "
                f"is outside the vocabulary [0, {self.cfg.d_vocab})"
            )
        if start + array.shape[1] > self.cfg.n_ctx:
            held = f" after {start} cached" if start else ""
            raise RefGPTError(f"tokens: {array.shape[1]} positions{held}, but the model has only n_positions={self.cfg.n_ctx}")
        return array, batched

    # ---- weights in circuits notation, stacked over layers as TransformerLens has them ---------

    def _stack(self, name):
        return np.stack([self.params[f"blocks.{L}.{name}"] for L in range(self.cfg.n_layers)])

    W_E = property(lambda self: self.params["embed.W_E"], doc="[d_vocab, d_model]")
    W_pos = property(lambda self: self.params["pos_embed.W_pos"], doc="[n_ctx, d_model]")
    W_U = property(lambda self: self.params["unembed.W_U"], doc="[d_model, d_vocab]")
    b_U = property(lambda self: self.params.get("unembed.b_U", np.zeros(self.cfg.d_vocab, self.dtype)), doc="[d_vocab]")
    W_Q = property(lambda self: self._stack("attn.W_Q"), doc="[layer, head, d_model, d_head]")
    W_K = property(lambda self: self._stack("attn.W_K"), doc="[layer, head, d_model, d_head]")
    W_V = property(lambda self: self._stack("attn.W_V"), doc="[layer, head, d_model, d_head]")
    W_O = property(lambda self: self._stack("attn.W_O"), doc="[layer, head, d_head, d_model]")
    b_Q = property(lambda self: self._stack("attn.b_Q"), doc="[layer, head, d_head]")
    b_K = property(lambda self: self._stack("attn.b_K"), doc="[layer, head, d_head]")
    b_V = property(lambda self: self._stack("attn.b_V"), doc="[layer, head, d_head]")
    b_O = property(lambda self: self._stack("attn.b_O"), doc="[layer, d_model]")
    W_in = property(lambda self: self._stack("mlp.W_in"), doc="[layer, d_model, d_mlp]")
    b_in = property(lambda self: self._stack("mlp.b_in"), doc="[layer, d_mlp]")
    W_out = property(lambda self: self._stack("mlp.W_out"), doc="[layer, d_mlp, d_model]")
    b_out = property(lambda self: self._stack("mlp.b_out"), doc="[layer, d_model]")

    def __repr__(self):
        c = self.cfg
        n = sum(a.size for a in self.params.values()) - (c.d_vocab * c.d_model if c.tie_word_embeddings else 0)
        return (f"Model(d_model={c.d_model}, n_layers={c.n_layers}, n_heads={c.n_heads}, d_vocab={c.d_vocab}, "
                f"n_ctx={c.n_ctx}, act_fn={c.act_fn!r}, dtype={self.dtype.name}, params={n:,})")


def _bytes_held(params, dtype) -> int:
    """Bytes of the ``params`` arrays already in ``dtype`` (kept as they are, not copied), each
    buffer counted once (a tied W_U is a view of W_E)."""
    buffers = {}
    for array in params.values():
        if isinstance(array, np.ndarray) and array.dtype == dtype:
            start = array.__array_interface__["data"][0]
            buffers[start] = max(buffers.get(start, 0), array.nbytes)
    return sum(buffers.values())


def _hook_positions(padding):
    return None if padding is None else padding.hook_positions()


class _NonFinite(Exception):
    """Raised inside the locating pass at the first hook point holding NaN or ±∞."""


#: The forward pass's parameters (Model.__call__), by which run_with_cache reads what it is given.
_FORWARD_SIGNATURE = inspect.signature(Model.__call__)


class _FirstNonFinite(HookRun):
    """A HookRun that, after each hook point's hooks, checks the activation is finite."""

    def __call__(self, name: str, activation: np.ndarray) -> np.ndarray:
        activation = super().__call__(name, activation)
        bad = ~np.isfinite(activation)
        if name.endswith("hook_attn_scores"):
            bad &= activation != -np.inf  # the causal mask
        if bad.any():
            raise _NonFinite(name, tuple(int(i) for i in np.argwhere(bad)[0]), activation[bad][0])
        return activation

    def watched(self, name: str) -> bool:
        return True  # every activation is checked: none may be overwritten in place
