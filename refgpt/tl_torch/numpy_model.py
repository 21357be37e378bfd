"""The NumPy Model underneath the torch-facing one: refgpt's Model, with TransformerLens's two
unembed hook points (``unembed.hook_in``, ln_final's output [batch, pos, d_model], and
``unembed.hook_out``, the logits [batch, pos, d_vocab]) and its weights in writable memory laid
out as a checkpoint lays them out, so that torch parameters can share them.

refgpt's own Model leaves the two unembed points out (docs/transformerlens.md 2.10: they repeat
ln_final's normalized·w + b and the logits); TransformerLens code caches and hooks them, so the
torch-facing model has them. Everything else is the Model's forward pass, unchanged.
"""

from __future__ import annotations

import numpy as np

from ..gpt2.params import param_shapes
from ..model import Model
from ..tl.hooks import HookPoint

UNEMBED_HOOKS = ("unembed.hook_in", "unembed.hook_out")


class TLModel(Model):
    """refgpt's Model with TransformerLens's ``unembed.hook_in`` and ``unembed.hook_out``."""

    def __init__(self, cfg, params, dtype="float64", source=None):
        super().__init__(cfg, params, dtype=dtype, source=source)
        for name in UNEMBED_HOOKS:
            self.hook_dict[name] = HookPoint(name)

    @property
    def hook_names(self) -> list[str]:
        return super().hook_names + list(UNEMBED_HOOKS)

    def unembed(self, final, run_hooks=None):
        if run_hooks is None:  # called alone, as TransformerLens's model.unembed(x): no hook points run
            return super().unembed(final)
        watched = getattr(run_hooks, "watched", None)
        if watched is not None and watched("unembed.hook_in"):  # ln_final's output may be a scratch buffer,
            final = run_hooks.handed_out(final)  # which the next pass overwrites: a hook or the cache may keep it
        final = run_hooks("unembed.hook_in", final)  # [batch, pos, d_model]
        return run_hooks("unembed.hook_out", super().unembed(final, run_hooks))  # [batch, pos, d_vocab]


def writable_params(model: Model, dtype) -> dict[str, np.ndarray]:
    """``model``'s weights copied once into writable memory in ``dtype``, in the layout an HF
    checkpoint has (W_Q | W_K | W_V side by side per block, as c_attn), so that the Model built from
    them multiplies with *views* of these arrays (refgpt/gpt2/params.py) and an edit of a torch
    parameter that shares one is an edit of the weights the forward pass uses. A tied W_U stays
    a view of W_Eᵀ; ``unembed.b_U`` is always there (zeros when GPT-2 has none, as TransformerLens)."""
    cfg, p = model.cfg, model.params
    out = {}
    for name in param_shapes(cfg):
        if name.startswith("blocks.") and (".attn.W_" in name or ".attn.b_" in name) and name[-1] in "QKV":
            continue  # made below, as views of one buffer per block
        out[name] = np.array(p[name], dtype=dtype, copy=True)
    h, d, dh = cfg.n_heads, cfg.d_model, cfg.d_head
    for L in range(cfg.n_layers):
        b = f"blocks.{L}.attn."
        W = np.empty((d, 3, h, dh), dtype)  # [d_model, q|k|v, head, d_head]: c_attn's columns
        bias = np.empty((3, h, dh), dtype)  # [q|k|v, head, d_head]
        for i, x in enumerate("QKV"):
            W[:, i] = np.asarray(p[b + f"W_{x}"]).transpose(1, 0, 2)  # [d_model, head, d_head]
            bias[i] = p[b + f"b_{x}"]
            out[b + f"W_{x}"] = W[:, i].transpose(1, 0, 2)  # [head, d_model, d_head], a view
            out[b + f"b_{x}"] = bias[i]  # [head, d_head], a view
    if cfg.tie_word_embeddings and np.shares_memory(p["unembed.W_U"], p["embed.W_E"]):
        out["unembed.W_U"] = out["embed.W_E"].T  # [d_model, d_vocab], still W_Eᵀ
    b_U = p.get("unembed.b_U")
    out["unembed.b_U"] = np.zeros(cfg.d_vocab, dtype) if b_U is None else np.array(b_U, dtype=dtype, copy=True)
    return out
