"""The MLP's nonlinearities, each written as the formula HF's ``ACT2FN`` computes, and softmax.

GPT-2 uses ``gelu_new``, the tanh approximation of GELU(x) = x·Φ(x) (Φ the standard normal CDF):

    gelu_new(x) = ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))

The other names are what other GPT-2-architecture checkpoints put in ``activation_function``.
Every function keeps its input's dtype: Python float constants do not promote float32 arrays
(NumPy ≥ 2), and no float64 temporary is created for a float32 input except in ``gelu`` (below).

Each function ``f`` has its backward beside it, ``f_backward(x, grad) = grad ⊙ f′(x)``: given the
input x and ∂loss/∂f(x), it returns ∂loss/∂x (derivations in docs/backward.md §4).
"""

from __future__ import annotations

import math

import numpy as np

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)

# math.erf is the C library's erf, correctly rounded to within an ulp; NumPy has no erf of its
# own, so it is applied element by element. It is slow (about 0.1 µs an element) but exact, and
# GPT-2's own checkpoints use gelu_new, not gelu.
_erf = np.frompyfunc(math.erf, 1, 1)


def gelu_new(x):
    """GELU, tanh approximation, as OpenAI's GPT-2 code writes it:
    ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).

    It runs on the largest activation of the model ([pos, d_mlp]) and takes nine elementwise
    steps, so it goes a block of rows at a time, each block staying in cache through all nine.
    """
    out = np.empty(x.shape, dtype=x.dtype)  # C order, whatever x's layout: rows_out must be a view of it
    rows_in, rows_out = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])  # [rows, d_mlp] (rows_in may copy)
    for i in range(0, len(rows_in), 64):
        _gelu_new_into(rows_in[i:i + 64], rows_out[i:i + 64])
    return out


def _gelu_new_into(x, t):
    """t = gelu_new(x), step by step in t; ×½ is exact, so the order of the products changes no bit."""
    np.multiply(x, x, out=t)  # x²
    t *= x  # x³
    t *= 0.044715
    t += x  # x + 0.044715·x³
    t *= _SQRT_2_OVER_PI
    np.tanh(t, out=t)
    t += 1.0
    t *= x
    t *= 0.5  # ½·x·(1 + tanh(…))


def gelu_new_backward(x, grad):
    """∂loss/∂x of gelu_new. With u = √(2/π)·(x + 0.044715·x³) and t = tanh(u):
    f = ½·x·(1 + t), so f′ = ½·(1 + t) + ½·x·(1 − t²)·√(2/π)·(1 + 3·0.044715·x²)."""
    return _tanh_gelu_backward(x, grad, _SQRT_2_OVER_PI)


def _tanh_gelu_backward(x, grad, c):
    x2 = x * x  # [...] x²
    t = np.tanh(c * x * (1.0 + 0.044715 * x2))  # [...] tanh(u)
    du = c * (1.0 + 3.0 * 0.044715 * x2)  # [...] ∂u/∂x
    return grad * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)  # [...]


def gelu_fast(x):
    """The same approximation with √(2/π) truncated to 0.7978845608, as HF's FastGELU has it."""
    return 0.5 * x * (1.0 + np.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def gelu_fast_backward(x, grad):
    """As gelu_new_backward, with √(2/π) truncated to 0.7978845608."""
    return _tanh_gelu_backward(x, grad, 0.7978845608)


def gelu(x):
    """Exact GELU: ½·x·(1 + erf(x/√2)), erf evaluated in float64 and rounded to x's dtype."""
    erf = _erf(np.asarray(x, dtype=np.float64) * _SQRT_HALF).astype(x.dtype)
    return x * 0.5 * (1.0 + erf)


def gelu_backward(x, grad):
    """∂loss/∂x of exact GELU: f = x·Φ(x), so f′ = Φ(x) + x·φ(x), φ(x) = e^(−x²/2)/√(2π)."""
    erf = _erf(np.asarray(x, dtype=np.float64) * _SQRT_HALF).astype(x.dtype)
    cdf = 0.5 * (1.0 + erf)  # [...] Φ(x)
    pdf = np.exp(-0.5 * x * x) * _INV_SQRT_2PI  # [...] φ(x)
    return grad * (cdf + x * pdf)  # [...]


def quick_gelu(x):
    """x·σ(1.702·x)."""
    return x * sigmoid(1.702 * x)


def quick_gelu_backward(x, grad):
    """f = x·σ(kx), k = 1.702: f′ = σ(kx) + k·x·σ(kx)·(1 − σ(kx))."""
    s = sigmoid(1.702 * x)  # [...]
    return grad * (s + 1.702 * x * s * (1.0 - s))  # [...]


def relu(x):
    return np.maximum(x, 0.0)


def relu_backward(x, grad):
    """f′ = 1 where x > 0, else 0 (at x = 0 too, as torch's ReLU has it)."""
    return np.where(x > 0, grad, 0.0).astype(grad.dtype, copy=False)  # [...]


def silu(x):
    """x·σ(x), also called swish."""
    return x * sigmoid(x)


def silu_backward(x, grad):
    """f = x·σ(x): f′ = σ(x)·(1 + x·(1 − σ(x)))."""
    s = sigmoid(x)  # [...]
    return grad * (s * (1.0 + x * (1.0 - s)))  # [...]


def tanh(x):
    return np.tanh(x)


def tanh_backward(x, grad):
    """f′ = 1 − tanh²(x)."""
    t = np.tanh(x)  # [...]
    return grad * (1.0 - t * t)  # [...]


def sigmoid(x):
    """σ(x) = 1 / (1 + e^(−x)), written so that neither branch overflows."""
    # For x ≥ 0, e^(−x) ≤ 1; for x < 0 use σ(x) = e^x / (1 + e^x) with e^x < 1.
    e = np.exp(-np.abs(x))  # [...] in (0, 1]
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


# ---- softmax: attention's pattern, the next-token distribution ----------------------------------


def softmax(x, in_place=False):
    """exp(x − max x) / Σ exp(x − max x) over the last axis; exp(−∞) = 0 exactly.

    ``in_place``: overwrite ``x`` (when nobody else holds it) instead of allocating the result.
    """
    out = x if in_place else np.empty_like(x)  # [..., n]
    np.subtract(x, x.max(axis=-1, keepdims=True), out=out)  # [..., n] ≤ 0
    np.exp(out, out=out)  # [..., n]
    out /= out.sum(axis=-1, keepdims=True)  # [..., n]
    return out


def log_softmax(x):
    """log softmax over the last axis, in x's dtype, stable: x − max − log Σ exp(x − max)."""
    shifted = x - x.max(axis=-1, keepdims=True)  # [..., n] ≤ 0
    shifted -= np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # [..., n], in place: one array fewer at the peak
    return shifted


ACTIVATIONS = {
    "gelu_new": gelu_new,
    "gelu_pytorch_tanh": gelu_new,  # torch's C kernel of the same formula
    "gelu": gelu,
    "gelu_fast": gelu_fast,
    "quick_gelu": quick_gelu,
    "relu": relu,
    "silu": silu,
    "swish": silu,
    "tanh": tanh,
}

#: name → backward(x, grad), for every name in ACTIVATIONS.
BACKWARDS = {
    "gelu_new": gelu_new_backward,
    "gelu_pytorch_tanh": gelu_new_backward,
    "gelu": gelu_backward,
    "gelu_fast": gelu_fast_backward,
    "quick_gelu": quick_gelu_backward,
    "relu": relu_backward,
    "silu": silu_backward,
    "swish": silu_backward,
    "tanh": tanh_backward,
}
