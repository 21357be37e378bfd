"""LayerNorm, written as the two steps it really is.

For one position's residual vector x ∈ ℝⁿ (n = d_model):

    mean        μ = (1/n)·Σᵢ xᵢ                                  [pos, 1]
    centering   Px = x − μ·1          P = I − (1/n)·11ᵀ, linear   [pos, n]
    scale       σ = √(‖Px‖²/n + ε)    one scalar per position     [pos, 1]
    normalized  x̂ = Px / σ                                        [pos, n]
    output      LN(x) = w ⊙ x̂ + b                                 [pos, n]

Everything non-linear about LayerNorm is the division by σ. Hold σ fixed (take it from the cache)
and LN is an affine map of x: this is why a residual stream that is a sum of components can be
pushed through the final LayerNorm piece by piece and the pieces still add up to the logits
(docs/layernorm.md, tests/core/test_mission.py). And σ grows with x: LN(k·x) = LN_{ε/k²}(x), so as k
grows LayerNorm forgets scale and keeps only the direction of Px.

Numerics. ‖Px‖² overflows long before x does (float32: ‖Px‖² > 3.4e38 once |xᵢ| ≳ 7e17 at
n = 768). So the squares are taken of Px·2⁻ᵉ, where 2ᵉ is the power of two just above max|Pxᵢ|,
and σ is scaled back by 2ᵉ. Multiplying by a power of two is exact, so for every x that would
not overflow this computes bit for bit what the textbook formula computes.

``layer_norm_backward`` (beside the forward) takes the gradient back through all of it.
"""

from __future__ import annotations

import numpy as np


def _identity(name, array):
    return array


def layer_norm(x, w, b, eps, run_hooks=_identity):
    """LN(x) = w ⊙ (x − mean)/scale + b over the last axis; ``run_hooks(name, a)`` runs the hooks at a hook point.

    ``run_hooks`` (the hooks at each hook point) sees (and may replace) ``hook_mean``, ``hook_scale`` and ``hook_normalized``; a
    replaced mean or scale flows into what follows.
    """
    mean = run_hooks("hook_mean", x.mean(-1, keepdims=True))  # [batch, pos, 1]
    centered = x - mean  # [batch, pos, d_model]
    scale = run_hooks("hook_scale", centered_scale(centered, eps))  # [batch, pos, 1]
    normalized = run_hooks("hook_normalized", centered / scale)  # [batch, pos, d_model]
    out = normalized * w  # [batch, pos, d_model]
    out += b  # [batch, pos, d_model]
    return out


def layer_norm_backward(grad, normalized, scale, w, run_hooks=None):
    """∂loss/∂(everything layer_norm read or computed), from grad = ∂loss/∂LN(x) [..., n] and the
    forward's cached x̂ = ``normalized`` [..., n] and σ = ``scale`` [..., 1]. ``run_hooks(name, ∂)``,
    if given, sees each hook point's gradient as it is made and returns the one that flows on.

    Returns a dict: ``x``, ``w``, ``b`` (the gradients of the input and parameters, the latter
    summed over every position) and ``hook_normalized``, ``hook_scale``, ``hook_mean`` (the
    gradient with respect to each hook point's value, as if a hook had replaced it).

    Derivation (docs/backward.md §2), with g = ∂loss/∂LN(x), c = x − μ:
        ∂/∂b = Σ g          ∂/∂w = Σ g ⊙ x̂            ĝ = ∂/∂x̂ = g ⊙ w
        ∂/∂σ = −Σᵢ ĝᵢ·cᵢ/σ² = −Σᵢ ĝᵢ·x̂ᵢ/σ                 (x̂ = c/σ)
        ∂/∂c = ĝ/σ + ∂/∂σ · x̂/n                           (∂σ/∂cᵢ = cᵢ/(n·σ) = x̂ᵢ/n)
        ∂/∂μ = −Σᵢ ∂/∂cᵢ                                   (c = x − μ)
        ∂/∂x = ∂/∂c + ∂/∂μ / n                             (μ = mean(x))
    which is the textbook (ĝ − mean(ĝ) − x̂·mean(ĝ ⊙ x̂)) / σ.
    """
    n = normalized.shape[-1]
    rows = tuple(range(grad.ndim - 1))  # every axis but the feature axis
    grad_b = grad.sum(axis=rows)  # [n]
    grad_w = (grad * normalized).sum(axis=rows)  # [n]
    run_hooks = run_hooks or (lambda name, g: g)
    grad_hat = run_hooks("hook_normalized", grad * w)  # [..., n] ∂loss/∂x̂
    grad_scale = run_hooks("hook_scale", -(grad_hat * normalized).sum(-1, keepdims=True) / scale)  # [..., 1] ∂loss/∂σ
    grad_centered = grad_hat / scale + grad_scale * normalized / n  # [..., n] ∂loss/∂c
    grad_mean = run_hooks("hook_mean", -grad_centered.sum(-1, keepdims=True))  # [..., 1] ∂loss/∂μ
    grad_x = grad_centered + grad_mean / n  # [..., n]
    return {"x": grad_x, "w": grad_w, "b": grad_b,
            "hook_normalized": grad_hat, "hook_scale": grad_scale, "hook_mean": grad_mean}


def centered_scale(centered, eps):
    """σ = √(mean(c²) + ε) of an already centered c, over the last axis, without overflow."""
    dtype = centered.dtype
    peak = np.maximum(centered.max(axis=-1, keepdims=True), -centered.min(axis=-1, keepdims=True))  # [..., 1] max |c|
    _, e = np.frexp(peak)  # peak = f·2ᵉ with ½ ≤ f < 1
    # Only ever scale *down* (e ≥ 0): scaling up tiny vectors would push ε·2⁻²ᵉ towards overflow.
    e = np.clip(e, 0, np.finfo(dtype).maxexp - 2)
    shrink = np.ldexp(np.ones((), dtype), -e)  # [..., 1] exact powers of two ≤ 1
    squares = centered * shrink  # [..., n], |c·shrink| < 1, exact
    squares *= squares  # [..., n] (c·shrink)², in the same buffer
    var = np.mean(squares, axis=-1, keepdims=True)  # [..., 1] = var(x)·shrink²
    return np.sqrt(var + eps * (shrink * shrink)) / shrink  # [..., 1]


def scale(x, eps):
    """σ(x) for an uncentered x: the number LayerNorm divides by."""
    return centered_scale(x - x.mean(-1, keepdims=True), eps)

