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
n = 768). So σ is the textbook √(mean((Px)²) + ε) wherever that mean is finite, and a row whose
mean square overflows is done again from Px·2⁻ᵉ, where 2ᵉ is the power of two just above max|Pxᵢ|,
σ scaled back by 2ᵉ. Multiplying by a power of two is exact, so both give the textbook's bits
wherever it does not overflow; the rescaled one also where it does.

``layer_norm_backward`` (beside the forward) takes the gradient back through all of it.
"""

from __future__ import annotations

import numpy as np

from .. import memory, threads


def _identity(name, array):
    return array


#: LayerNorm's hook points, in the order the forward reaches them.
HOOK_POINTS = ("hook_mean", "hook_scale", "hook_normalized")


def layer_norm(x, w, b, eps, run_hooks=_identity, out=None):
    """LN(x) = w ⊙ (x − mean)/scale + b over the last axis; ``run_hooks(name, a)`` runs the hooks at a hook point.

    ``run_hooks`` (the hooks at each hook point) sees (and may replace) ``hook_mean``, ``hook_scale`` and ``hook_normalized``; a
    replaced mean or scale flows into what follows. ``out``: an array of x's shape and dtype to
    write LN(x) into (default: a new one).

    When no hook is on those points (``run_hooks.hooked``; the cache may still record them), the
    steps run a block of rows at a time on the threads (``_rows_into``), each block in cache through
    all of them: the same operations on each row, so the same bits.
    """
    if _by_blocks(x, w, b, run_hooks):
        return _blocked(x, w, b, eps, run_hooks, out)
    mean = run_hooks("hook_mean", x.mean(-1, keepdims=True))  # [batch, pos, 1]
    centered = x - mean  # [batch, pos, d_model]
    scale = run_hooks("hook_scale", centered_scale(centered, eps))  # [batch, pos, 1]
    normalized = run_hooks("hook_normalized", centered / scale)  # [batch, pos, d_model]
    out = normalized * w if out is None else np.multiply(normalized, w, out=out)  # [batch, pos, d_model]
    out += b  # [batch, pos, d_model]
    return out


def _by_blocks(x, w, b, run_hooks) -> bool:
    """May layer_norm run by blocks of rows? Floats whose w and b are [d_model] of x's dtype, and
    no hook that could replace the mean, scale or x̂ half-way (a plain function may: it is called)."""
    if not (isinstance(x, np.ndarray) and x.dtype.kind == "f" and x.ndim >= 1 and x.size):
        return False
    if not all(isinstance(p, np.ndarray) and p.dtype == x.dtype and p.shape == x.shape[-1:] for p in (w, b)):
        return False
    hooked = getattr(run_hooks, "hooked", None)
    return run_hooks is _identity or (hooked is not None and not any(map(hooked, HOOK_POINTS)))


def _blocked(x, w, b, eps, run_hooks, out):
    """layer_norm by blocks of rows on the threads; the mean, scale and (if watched) x̂ are then given
    to ``run_hooks`` for the cache, in the forward's order."""
    watched = getattr(run_hooks, "watched", lambda name: False)
    n = x.shape[-1]
    out = np.empty(x.shape, x.dtype) if out is None else out  # [batch, pos, d_model]
    x_rows, o_rows = x.reshape(-1, n), out.reshape(-1, n)  # [rows, d_model] (x_rows a copy if x is not C-contiguous)
    mean = np.empty((*x.shape[:-1], 1), x.dtype)  # [batch, pos, 1]
    scale = np.empty((*x.shape[:-1], 1), x.dtype)  # [batch, pos, 1]
    normalized = memory.empty(x.shape, x.dtype) if watched("hook_normalized") else None  # [batch, pos, d_model], for the cache
    m_rows, s_rows = mean.reshape(-1, 1), scale.reshape(-1, 1)  # [rows, 1]
    n_rows = None if normalized is None else normalized.reshape(-1, n)  # [rows, d_model]

    def block(a, z):
        _rows_into(x_rows[a:z], w, b, eps, m_rows[a:z], s_rows[a:z], None if n_rows is None else n_rows[a:z], o_rows[a:z])

    threads.for_rows(block, len(x_rows), n * x.itemsize)
    run_hooks("hook_mean", mean)
    run_hooks("hook_scale", scale)
    if normalized is not None:
        run_hooks("hook_normalized", normalized)
    return out


def _rows_into(x, w, b, eps, mean, scale, normalized, out):
    """LayerNorm of a block of rows x [rows, n], step by step as ``layer_norm`` writes it: the mean
    and scale [rows, 1] and, if given, x̂ [rows, n] written into the arrays given, LN(x) into ``out``."""
    np.mean(x, axis=-1, keepdims=True, out=mean)  # [rows, 1]
    centered = x - mean  # [rows, n]
    scale[...] = centered_scale(centered, eps, squares=out)  # [rows, 1] (out: room for c², overwritten below)
    normalized = np.divide(centered, scale, out=centered if normalized is None else normalized)  # [rows, n]
    np.multiply(normalized, w, out=out)  # [rows, n]
    out += b  # [rows, n]


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


def centered_scale(centered, eps, squares=None):
    """σ = √(mean(c²) + ε) of an already centered c, over the last axis, without overflow: the
    textbook formula, and for a row whose mean square overflowed (or is NaN) ``_rescaled_scale``.
    ``squares``: an array of c's shape to hold c² (default: a new one)."""
    with np.errstate(over="ignore"):  # an overflowed row is done again below
        squares = np.multiply(centered, centered, out=squares)  # [..., n]
        var = np.mean(squares, axis=-1, keepdims=True)  # [..., 1]
    sigma = np.sqrt(var + eps)  # [..., 1]
    redo = ~np.isfinite(var[..., 0])  # [...] rows whose c² overflowed (or held a NaN)
    if redo.any():
        sigma[redo] = _rescaled_scale(centered[redo], eps)  # [rows, 1]
    return sigma


def _rescaled_scale(centered, eps):
    """σ of centered rows c [..., n] from the squares of c·2⁻ᵉ, 2ᵉ the power of two just above
    max|c|, scaled back by 2ᵉ: finite for every finite c (|c·2⁻ᵉ| < 1), and the textbook's bits
    where the textbook is finite (powers of two scale exactly)."""
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

