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

This is the fast, hookable copy; GPT-2 written plainly, the specification it is tested against, is
refgpt/reference/gpt2.py. Computation is in float64 by default, or float32 on request, end to end: no
intermediate is ever promoted or demoted. Every hook point is named as in TransformerLens. The
elementwise work runs by blocks of rows on the BLAS's threads (refgpt/threads.py), what no hook or
cache watches is written into scratch buffers reused from block to block and pass to pass, and
what a pass hands out lives on recycled memory (refgpt/memory.py; docs/performance.md).

Read top-down: the Model and GPT-2 itself (``run_gpt2``: embed, blocks, unembed); then
TransformerLens's way in and out (``__call__``/``forward``, ``run_with_cache``, …); then the
weights as TransformerLens stacks them. The parameters' names, shapes and flat layout are in
refgpt/gpt2/params.py, input reading in refgpt/tl/inputs.py, the non-finite guard in
refgpt/non_finite.py.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from . import memory, non_finite, threads
from .backward import loss_and_grads
from .dtypes import compute_dtype
from .errors import RefGPTError, RefGPTTypeError
from .gpt2.activations import ACTIVATIONS
from .gpt2.attention import attention
from .gpt2.config import Config
from .gpt2.kv_cache import KVCache
from .gpt2.layernorm import layer_norm
from .gpt2.loss import lm_cross_entropy_loss
from .gpt2.mlp import mlp
from .gpt2.params import block_layout, bytes_held, checked_params
from .memory import Scratch, buffer
from .tl import hook_points, inputs
from .tl.cache import ActivationCache
from .tl.circuits import CircuitMethods
from .tl.generation import generate
from .tl.hooks import HookPoint, HookRegistry, HookRun
from .tl.text import TextMethods

RETURN_TYPES = ("logits", "loss", "both", None)


class Output(NamedTuple):
    """What ``return_type="both"`` returns, as TransformerLens's ``Output``: ``logits, loss = …``
    or ``.logits``, ``.loss``."""

    logits: np.ndarray
    loss: np.ndarray


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
        cfg.check_fits_in_memory(self.dtype.itemsize, held=bytes_held(params, self.dtype))
        self.source = Path(source) if source is not None else None
        self._tokenizer = None
        self.params = MappingProxyType(checked_params(cfg, params, self.dtype))  # read-only: a new model for new weights
        self._blocks = [block_layout(self.params, cfg, L) for L in range(cfg.n_layers)]
        self.hook_dict = {name: HookPoint(name) for name in hook_points.hook_names(cfg.n_layers, switches="all")}
        self._act = ACTIVATIONS[cfg.act_fn]
        self._scratch = [Scratch()]  # the passes' scratch buffers, taken by one pass at a time (refgpt/memory.py)

    # ---- GPT-2 itself, on checked tokens -------------------------------------------------------

    def run_gpt2(self, tokens, run_hooks, past=None, last_only=False, padding=None, start_at_layer=None,
                 stop_at_layer=None, resid=None):
        """GPT-2 over checked tokens [batch, pos]: embed, every block, unembed. ``run_hooks`` (a
        HookRun) is called at each hook point; ``past`` a KVCache holding the positions before
        these, or None; ``padding`` an inputs.Padding or None. From ``start_at_layer`` on ``resid``
        is the stream entering that block; with ``stop_at_layer`` that block's input is returned."""
        pos = (tokens if resid is None else resid).shape[1]
        if resid is None:
            resid = self.embed(tokens, run_hooks, past.length if past is not None else 0, padding)  # [batch, pos, d_model]
        score_mask = None if padding is None else padding.score_mask  # [batch, 1, pos, key]: −∞ on future keys and pads
        for L in range(self.cfg.n_layers)[start_at_layer:stop_at_layer]:
            resid = self.block(L, resid, run_hooks, past, score_mask)  # [batch, pos, d_model]
        if past is not None:
            past.advance(pos)
        if stop_at_layer is not None:
            return run_hooks.handed_out(resid) if hasattr(run_hooks, "handed_out") else resid  # never a scratch buffer
        return self.logits_from_resid(resid, run_hooks, last_only)  # [batch, pos, d_vocab]

    def embed(self, tokens, run_hooks, start=0, padding=None):
        """The stream entering block 0: W_E[tokens] + W_pos[positions]. Positions run from
        ``start`` (the KV cache's length); in a padded batch from each row's first real token,
        and a pad's position embedding is 0 (refgpt/gpt2/padding.py)."""
        p = self.params
        tokens = run_hooks("hook_tokens", tokens) if self.cfg.use_hook_tokens else tokens  # [batch, pos]
        shape = (*np.shape(tokens), self.cfg.d_model)
        embed = np.take(p["embed.W_E"], tokens, axis=0, out=buffer(run_hooks, "embed", shape, self.dtype, "hook_embed"))
        embed = run_hooks("hook_embed", embed)  # [batch, pos, d_model] W_E[tokens]
        if padding is None:
            pos_embed = buffer(run_hooks, "pos_embed", shape, self.dtype, "hook_pos_embed")  # [batch, pos, d_model]
            pos_embed[...] = p["pos_embed.W_pos"][start:start + tokens.shape[1]]
        else:
            pos_embed = p["pos_embed.W_pos"][padding.positions] * padding.real[..., None]  # [batch, pos, d_model]
        pos_embed = run_hooks("hook_pos_embed", pos_embed)  # [batch, pos, d_model]
        return threads.add(embed, pos_embed, out=buffer(run_hooks, "resid", shape, self.dtype, "blocks.0.hook_resid_pre"))

    def block(self, L, resid, run_hooks, past=None, score_mask=None):
        """Block L: resid_pre → + attn(ln1(resid)) → resid_mid → + mlp(ln2(resid)) → resid_post."""
        b = f"blocks.{L}."
        ln, attn_w, mlp_w = self.block_weights(L)
        cfg = self.cfg
        past_kv = None if past is None else functools.partial(past.extend, L)

        resid_pre = run_hooks(b + "hook_resid_pre", resid)  # [batch, pos, d_model]
        shape, dtype = resid_pre.shape, resid_pre.dtype
        if cfg.use_attn_in or cfg.use_split_qkv_input:
            x = self.per_head_inputs(b, resid_pre, ln, run_hooks)  # (x_q, x_k, x_v) [batch, pos, head, d_model] each
        else:
            x = layer_norm(resid_pre, ln["ln1.w"], ln["ln1.b"], cfg.eps, run_hooks.scope(b + "ln1."),
                           out=buffer(run_hooks, "ln_out", shape, dtype))  # [batch, pos, d_model]
        attn_out = attention(x, attn_w, cfg.n_heads, cfg.score_scale(L), run_hooks.scope(b + "attn."), past_kv,
                             score_mask, cfg.use_attn_result,
                             out=buffer(run_hooks, "attn_out", shape, dtype, b + "hook_attn_out"))  # [batch, pos, d_model]
        attn_out = run_hooks(b + "hook_attn_out", attn_out)  # [batch, pos, d_model]
        resid_mid = threads.add(resid_pre, attn_out, out=buffer(run_hooks, "resid_mid", shape, dtype, b + "hook_resid_mid"))
        resid_mid = run_hooks(b + "hook_resid_mid", resid_mid)  # [batch, pos, d_model]

        mlp_in = run_hooks(b + "hook_mlp_in", resid_mid.copy()) if cfg.use_hook_mlp_in else resid_mid  # [batch, pos, d_model], what ln2 reads
        x = layer_norm(mlp_in, ln["ln2.w"], ln["ln2.b"], cfg.eps, run_hooks.scope(b + "ln2."),
                       out=buffer(run_hooks, "ln_out", shape, dtype))  # [batch, pos, d_model]
        mlp_out = mlp(x, mlp_w, self._act, run_hooks.scope(b + "mlp."),
                      out=buffer(run_hooks, "mlp_out", shape, dtype, b + "hook_mlp_out"))  # [batch, pos, d_model]
        mlp_out = run_hooks(b + "hook_mlp_out", mlp_out)  # [batch, pos, d_model]
        resid_post = threads.add(resid_mid, mlp_out, out=buffer(run_hooks, "resid", shape, dtype, b + "hook_resid_post",
                                                                f"blocks.{L + 1}.hook_resid_pre"))
        return run_hooks(b + "hook_resid_post", resid_post)  # [batch, pos, d_model]

    def per_head_inputs(self, b, resid_pre, ln, run_hooks):
        """TransformerLens's use_attn_in / use_split_qkv_input: each head reads its own copy of the
        stream (``hook_attn_in``, or ``hook_q_input``/``k``/``v``), through ln1 once per input."""
        cfg = self.cfg
        heads = np.repeat(resid_pre[:, :, None], cfg.n_heads, axis=2)  # [batch, pos, head, d_model]
        attn_in = run_hooks(b + "hook_attn_in", heads) if cfg.use_attn_in else heads
        if cfg.use_split_qkv_input:
            inputs_ = [run_hooks(b + f"hook_{x}_input", heads.copy()) for x in "qkv"]  # [batch, pos, head, d_model] each
        else:
            inputs_ = [attn_in] * 3
        return tuple(layer_norm(x, ln["ln1.w"], ln["ln1.b"], cfg.eps, run_hooks.scope(b + "ln1.")) for x in inputs_)

    def logits_from_resid(self, resid, run_hooks, last_only=False):
        """Logits from the final stream: ln_final, then ``unembed``: ln_final(resid)·W_U (+ b_U if the
        model has one)."""
        p = self.params
        final = layer_norm(resid, p["ln_final.w"], p["ln_final.b"], self.cfg.eps, run_hooks.scope("ln_final."),
                           out=buffer(run_hooks, "ln_out", resid.shape, resid.dtype))  # [batch, pos, d_model]
        if last_only:
            final = final[:, -1:]  # [batch, 1, d_model]
        return self.unembed(final, run_hooks)

    def unembed(self, final, run_hooks=None):
        """ln_final's output [batch, pos, d_model] · W_U (+ b_U): the logits [batch, pos, d_vocab].
        TransformerLens's ``model.unembed(x)``: the product alone, no ln_final (that is
        ``logits_from_resid``). ``run_hooks`` is for the torch-facing model, which adds
        TransformerLens's unembed.hook_in/hook_out here."""
        p = self.params
        logits = np.matmul(final, p["unembed.W_U"], out=memory.empty((*final.shape[:-1], self.cfg.d_vocab), final.dtype))  # [batch, pos, d_vocab], on recycled memory
        if "unembed.b_U" in p:
            logits += p["unembed.b_U"]  # [batch, pos, d_vocab]
        return logits

    def block_weights(self, L):
        """Block L's weights as the forward (and backward) pass multiplies with them: (ln, attn,
        mlp) dicts in the flat layout of refgpt/gpt2/params.py (``block_layout``), built once,
        when the model is made: views of ``params`` where the layout allows."""
        return self._blocks[L]

    # ---- TransformerLens's forward: inputs in (refgpt/tl/inputs.py), outputs out ---------------

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

    forward = __call__  # TransformerLens's name for the same call; GPT-2 itself is run_gpt2

    def _run(self, input, cache_names=(), return_type="logits", loss_per_token=False, prepend_bos=None,
             padding_side=None, start_at_layer=None, tokens=None, attention_mask=None, stop_at_layer=None,
             past_kv_cache=None, last_only=False, past=None):
        """(output, ActivationCache): read the input (inputs.py), run GPT-2, guard, take the loss."""
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
        positions = None if padding is None else padding.hook_positions()
        scratch = self._take_scratch()
        try:
            with memory.passing():
                run = HookRun(self.hook_dict, cache_names, start=start, positions=positions, scratch=scratch)
                logits = self.run_gpt2(tokens, run, past, last_only, padding, start_at_layer, stop_at_layer, resid)
        finally:
            if scratch is not None:
                self._scratch.append(scratch)
        if not non_finite.output_is_finite(logits):  # one pass over the output (benchmarks/bench_guards.py)
            non_finite.raise_at_first_non_finite(self, tokens, past, start, last_only, padding, start_at_layer,
                                                 stop_at_layer, resid, positions)
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

    def _take_scratch(self) -> Scratch | None:
        """The model's Scratch for one pass, or None while another pass holds it (another thread, or
        a hook running a pass inside this one): that pass then makes new arrays. list.pop is atomic."""
        try:
            return self._scratch.pop()
        except IndexError:
            return None

    def release_scratch(self) -> int:
        """Let go of the scratch buffers the last passes kept for the next (refgpt/memory.py);
        returns the bytes they held. The next pass makes new ones."""
        scratch = self._take_scratch()
        if scratch is None:
            return 0
        held = scratch.nbytes
        self._scratch.append(Scratch())
        return held

    def kv_cache(self, batch: int = 1) -> KVCache:
        """An empty KVCache for incremental decoding of ``batch`` sequences (refgpt/gpt2/kv_cache.py)."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise RefGPTError(f"kv_cache: batch must be a whole number ≥ 1, found {batch!r:.40}")
        return KVCache(self.cfg, batch, self.dtype)

    def generate(self, input="", max_new_tokens: int = 10, **kwargs):
        """TransformerLens's ``generate``: extend text or tokens (see refgpt/tl/generation.py)."""
        return generate(self, input, max_new_tokens, **kwargs)

    def check_tokens(self, tokens, start=0):
        """Integer tokens [pos] or [batch, pos] → (int64 array [batch, pos], was it batched), or a
        RefGPTError naming the fault (refgpt/tl/inputs.py). ``start``: positions already held in a
        KV cache before these."""
        return inputs.check_tokens(self.cfg, tokens, start)

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

    # ---- weights in circuits notation, stacked over layers as TransformerLens has them -----------

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




#: The forward pass's parameters (Model.__call__), by which run_with_cache reads what it is given.
_FORWARD_SIGNATURE = inspect.signature(Model.__call__)
