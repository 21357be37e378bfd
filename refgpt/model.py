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
from pathlib import Path
from types import MappingProxyType

import numpy as np
from numpy.lib.array_utils import byte_bounds

from . import hook_points
from .activations import ACTIVATIONS
from .attention import attention
from .backward import loss_and_grads
from .cache import ActivationCache
from .config import Config
from .dtypes import compute_dtype
from .errors import RefGPTError
from .generation import generate
from .hooks import HookRun, select_names
from .kv_cache import KVCache
from .layernorm import layer_norm
from .mlp import mlp

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


class Model:
    """A GPT-2: its Config, its parameters in circuits notation, and a hookable forward pass.

    ``params`` maps TransformerLens state-dict names (``blocks.0.attn.W_Q``) to arrays; an optional
    ``unembed.b_U`` [d_vocab] is added to the logits (GPT-2 itself has none).
    """

    def __init__(self, cfg: Config, params: dict[str, np.ndarray], dtype="float64", source=None):
        self.cfg = cfg
        self.dtype = compute_dtype(dtype)
        self.source = Path(source) if source is not None else None
        self.tokenizer = None
        self.params = MappingProxyType(self._checked(params))  # read-only: a new model for new weights
        self._blocks = [self._flatten_block(L) for L in range(cfg.n_layers)]
        self.hook_names = hook_points.hook_names(cfg.n_layers)
        self._context_hooks: list = []
        self._act = ACTIVATIONS[cfg.act_fn]

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

    # ---- the forward pass -------------------------------------------------------------------

    def __call__(self, tokens, past=None, last_only=False) -> np.ndarray:
        """Logits for integer tokens [pos] or [batch, pos] → [pos, d_vocab] or [batch, pos, d_vocab].

        ``past``: a KVCache (``model.kv_cache(batch)``) holding earlier positions; the tokens are
        then the next ones and the cache is extended. ``last_only``: logits of the last position
        only ([1, d_vocab] per sequence), skipping the unembedding of the others.
        """
        return self.run_with_hooks(tokens, past=past, last_only=last_only)

    def run_with_hooks(self, tokens, fwd_hooks=(), past=None, last_only=False) -> np.ndarray:
        """Logits, with ``fwd_hooks`` = [(name or predicate, fn(activation, name)), …] applied."""
        logits, _ = self._run(tokens, fwd_hooks, (), past, last_only)
        return logits

    def run_with_cache(self, tokens, names=None, fwd_hooks=(), past=None, last_only=False):
        """(logits, cache). ``names``: None (every hook point), a list of names, or a predicate."""
        selected = select_names(names, self.hook_names, "run_with_cache names")
        return self._run(tokens, fwd_hooks, selected, past, last_only)

    def loss_and_grads(self, tokens, targets=None):
        """Mean next-token cross-entropy and its gradient for every parameter and every hook point
        (a ``refgpt.backward.Gradients``); ``targets`` default to the next tokens (docs/backward.md)."""
        return loss_and_grads(self, tokens, targets)

    def kv_cache(self, batch: int = 1) -> KVCache:
        """An empty KVCache for incremental decoding of ``batch`` sequences (refgpt/kv_cache.py)."""
        return KVCache(self.cfg, batch, self.dtype)

    def generate(self, tokens, max_new_tokens: int, temperature: float = 1.0, top_k=None, seed=None):
        """Extend ``tokens`` by sampling (greedy when temperature is 0); see refgpt/generation.py."""
        return generate(self, tokens, max_new_tokens, temperature, top_k, seed)

    def hooks(self, fwd_hooks):
        """A context manager: ``with model.hooks([...]):`` every forward pass inside applies them."""
        return _HookContext(self, list(fwd_hooks))

    def _run(self, tokens, fwd_hooks, cache_names, past=None, last_only=False):
        tokens, batched = self.check_tokens(tokens, start=past.length if past is not None else 0)
        if past is not None:
            past.check(tokens.shape[0], tokens.shape[1])
        run = self.hook_run(fwd_hooks, cache_names)
        logits = self.forward(tokens, run, past, last_only)
        if not batched:
            logits = logits[0]
        return logits, ActivationCache(run.cache, self)

    def hook_run(self, fwd_hooks=(), cache_names=()) -> HookRun:
        """The ``point`` of one forward pass: ``fwd_hooks`` after any ``with model.hooks(…)``
        context's, caching ``cache_names``. For driving ``embed``/``block``/``unembed`` by hand."""
        return HookRun(self.hook_names, [*self._context_hooks, *fwd_hooks], cache_names)

    def forward(self, tokens, point, past=None, last_only=False):
        """The forward pass over checked tokens [batch, pos]; ``point`` (a HookRun) is called at
        each hook point; ``past`` a KVCache holding the positions before these, or None.
        Three stages, each a method: ``embed``, ``block`` L for each layer, ``unembed``."""
        resid = self.embed(tokens, point, past.length if past is not None else 0)  # [batch, pos, d_model]
        for L in range(self.cfg.n_layers):
            resid = self.block(L, resid, point, past)  # [batch, pos, d_model]
        if past is not None:
            past.advance(tokens.shape[1])
        return self.unembed(resid, point, last_only)  # [batch, pos, d_vocab]

    def embed(self, tokens, point, start=0):
        """The residual stream entering block 0: W_E[tokens] + W_pos[positions]; ``start`` is the
        position of the first token (> 0 after a KV cache's positions)."""
        p = self.params
        embed = point("hook_embed", p["embed.W_E"][tokens])  # [batch, pos, d_model]
        positions = p["pos_embed.W_pos"][start:start + tokens.shape[1]]  # [pos, d_model]
        pos_embed = point("hook_pos_embed", np.broadcast_to(positions, embed.shape).copy())  # [batch, pos, d_model]
        return embed + pos_embed  # [batch, pos, d_model]

    def unembed(self, resid, point, last_only=False):
        """Logits from the final residual stream: ln_final(resid)·W_U (+ b_U if the model has one)."""
        p = self.params
        final = layer_norm(resid, p["ln_final.w"], p["ln_final.b"], self.cfg.eps, point.scope("ln_final."))  # [batch, pos, d_model]
        if last_only:
            final = final[:, -1:]  # [batch, 1, d_model]
        logits = final @ p["unembed.W_U"]  # [batch, pos, d_vocab]
        if "unembed.b_U" in p:
            logits += p["unembed.b_U"]  # [batch, pos, d_vocab]
        return logits

    def block(self, L, resid, point, past=None):
        """Block L: resid_pre → + attn(ln1(resid)) → resid_mid → + mlp(ln2(resid)) → resid_post."""
        b = f"blocks.{L}."
        ln, attn_w, mlp_w = self.block_weights(L)
        cfg = self.cfg
        past_kv = None if past is None else functools.partial(past.extend, L)

        resid_pre = point(b + "hook_resid_pre", resid)  # [batch, pos, d_model]
        x = layer_norm(resid_pre, ln["ln1.w"], ln["ln1.b"], cfg.eps, point.scope(b + "ln1."))  # [batch, pos, d_model]
        attn_out = attention(x, attn_w, cfg.n_heads, cfg.attn_scale(L), point.scope(b + "attn."), past_kv)  # [batch, pos, d_model]
        attn_out = point(b + "hook_attn_out", attn_out)  # [batch, pos, d_model]
        resid_mid = point(b + "hook_resid_mid", resid_pre + attn_out)  # [batch, pos, d_model]

        x = layer_norm(resid_mid, ln["ln2.w"], ln["ln2.b"], cfg.eps, point.scope(b + "ln2."))  # [batch, pos, d_model]
        mlp_out = point(b + "hook_mlp_out", mlp(x, mlp_w, self._act, point.scope(b + "mlp.")))  # [batch, pos, d_model]
        return point(b + "hook_resid_post", resid_mid + mlp_out)  # [batch, pos, d_model]

    # ---- input checking -----------------------------------------------------------------------

    def check_tokens(self, tokens, start=0):
        """Integer tokens [pos] or [batch, pos] → (int64 array [batch, pos], was it batched).
        ``start``: positions already held in a KV cache before these."""
        array = np.asarray(tokens)
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

    # ---- text -------------------------------------------------------------------------------

    def to_tokens(self, text: str, prepend_bos: bool = False) -> np.ndarray:
        """Text → token ids [pos] with the model's tokenizer (``<|endoftext|>`` first if prepend_bos)."""
        tok = self._need_tokenizer()
        ids = tok.encode(text)
        if prepend_bos:
            if tok.eot_token is None:
                raise RefGPTError("to_tokens: prepend_bos=True, but the vocabulary has no <|endoftext|>")
            ids = [tok.eot_token] + ids
        return np.array(ids, dtype=np.int64)

    def to_string(self, ids) -> str:
        """Token ids → text."""
        return self._need_tokenizer().decode([int(i) for i in np.asarray(ids).reshape(-1)])

    def _need_tokenizer(self):
        if self.tokenizer is None:
            where = f" in {self.source}" if self.source else ""
            raise RefGPTError(f"this model has no tokenizer: no vocab.json + merges.txt{where}")
        return self.tokenizer

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


class _HookContext:
    def __init__(self, model, fwd_hooks):
        self.model, self.fwd_hooks = model, fwd_hooks
        select = [s for s, _ in fwd_hooks]  # validated now, not at the first forward pass
        for s in select:
            select_names(s, model.hook_names, "hooks")

    def __enter__(self):
        self.model._context_hooks.extend(self.fwd_hooks)
        return self.model

    def __exit__(self, *exc):
        for entry in self.fwd_hooks:
            self.model._context_hooks.remove(entry)
        return False

