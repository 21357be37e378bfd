"""Two ways to push a piece of the residual stream through a LayerNorm, named apart.

LayerNorm is centering, then division by one scalar per position (docs/layernorm.md §1):

    LN(x) = w ⊙ Px/σ(x) + b,        P = I − (1/n)·11ᵀ,   σ(x) = √(‖Px‖²/n + ε)

Given a vector c that is *part* of (or a stand-in for) the stream x the model actually saw, there
are two different questions, and each has its own LayerNorm view:

**The cached-scale view** (``cached_scale``): P·c / σ(x), with σ(x) the scale the model really
used, read from the cache. It asks "how much of the model's normalised stream is this piece?".
It is *linear* in c: the views of the pieces of x sum to the view of x, x̂ = Px/σ(x), exactly.
That is what attribution needs (docs/decomposition.md §1). It has no w and no b: w is a diagonal
linear map that can be applied after the sum (or folded into W_U), and b is added once, not once
per piece. TransformerLens's ``apply_ln_to_stack`` computes this view.

**The recomputed view** (``recomputed``): LN(c) = w ⊙ Pc/σ(c) + b, the whole LayerNorm with c's
*own* statistics. It asks "what would the model output if the stream were c?": the logit lens.
It is not linear (LN(c₁) + LN(c₂) ≠ LN(c₁ + c₂), and b would be counted once per piece) and it
forgets scale (LN(k·c) ≈ LN(c)), which is exactly right for a lens and exactly wrong for a
decomposition (docs/layernorm.md §3). TransformerLens's ``apply_ln_to_stack(recompute_ln=True)``
at the unembedding computes this view.

On the whole final stream the two agree up to w and b: recomputed(x) = w ⊙ cached_scale(x) + b,
because then σ(c) = σ(x). Anywhere else they answer different questions (tests/core/test_ln_views.py).

**The output itself** (``cached_output``): LN(x) = w ⊙ x̂ + b for the stream the model really saw,
rebuilt from the cached x̂ exactly as the forward pass computed it (bit for bit), for readers of a
cache that need what the LayerNorm handed on (the backward pass, attribution, golden files).
"""

from __future__ import annotations

from ..errors import need
from .layernorm import layer_norm


def cached_scale(stack, scale):
    """P·c / σ for every c in ``stack`` [..., d_model], with σ the cached scale [..., 1]: linear."""
    centered = stack - stack.mean(-1, keepdims=True)  # [..., d_model]
    return centered / scale  # [..., d_model]


def recomputed(stack, w, b, eps):
    """LN(c) = w ⊙ Pc/σ(c) + b for every c in ``stack`` [..., d_model], each with its own σ(c)."""
    return layer_norm(stack, w, b, eps)  # [..., d_model]


def cached_output(cache, prefix, user=None, hint=None):
    """LN(x) = w ⊙ x̂ + b of LayerNorm ``prefix`` ("blocks.3.ln1.", "ln_final.") from the cached x̂
    (``user``, ``hint``: for the error if x̂ is not cached, see refgpt.tl.cache.need)."""
    p = cache.model.params
    return need(cache, prefix + "hook_normalized", user, hint) * p[prefix + "w"] + p[prefix + "b"]  # [batch, pos, d_model]
