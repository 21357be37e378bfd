"""The MLP's nonlinearities, each written as the formula HF's ``ACT2FN`` computes, and softmax.

GPT-2 uses ``gelu_new``, the tanh approximation of GELU(x) = x·Φ(x) (Φ the standard normal CDF):

    gelu_new(x) = ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))

The other names are what other GPT-2-architecture checkpoints put in ``activation_function``.
Every function keeps its input's dtype: Python float constants do not promote float32 arrays
(NumPy ≥ 2), and no float64 temporary is created for a float32 input except in ``gelu`` (below).

Each function ``f`` has its backward beside it, ``f_backward(x, grad) = grad ⊙ f′(x)``: given the
input x and ∂loss/∂f(x), it returns ∂loss/∂x (derivations in docs/backward.md §4).

Each function reads each element (softmax: each row) alone, so each runs a block of rows at a time,
the blocks spread over the BLAS's threads (``threads.by_rows``, refgpt/threads.py): bit for bit what one
thread computes. The exact ``gelu`` runs on one: its erf is a Python-level loop, which holds the GIL.
"""

from __future__ import annotations

import math

import numpy as np

from .. import threads
from ..threads import by_rows

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)

# math.erf is the C library's erf, correctly rounded to within an ulp; NumPy has no erf of its
# own, so it is applied element by element. It is slow (about 0.1 µs an element) but exact, and
# GPT-2's own checkpoints use gelu_new, not gelu.
_erf = np.frompyfunc(math.erf, 1, 1)


def gelu_new(x, out=None):
    """GELU, tanh approximation, as OpenAI's GPT-2 code writes it:
    ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).

    It runs on the largest activation of the model ([pos, d_mlp]) and takes nine elementwise
    steps, so it goes a block of rows at a time, each block staying in cache through all nine.
    ``out``: the C-order array of x's shape and dtype to write it into (default: a new one).
    """
    out = np.empty(x.shape, dtype=x.dtype) if out is None else out  # C order, whatever x's layout
    return threads.into_by_rows(_gelu_new_into, x, out)  # [batch, pos, d_mlp]


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
    return by_rows(lambda x, g: _tanh_gelu_backward(x, g, _SQRT_2_OVER_PI), x, grad)


def _tanh_gelu_backward(x, grad, c):
    x2 = x * x  # [...] x²
    t = np.tanh(c * x * (1.0 + 0.044715 * x2))  # [...] tanh(u)
    du = c * (1.0 + 3.0 * 0.044715 * x2)  # [...] ∂u/∂x
    return grad * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)  # [...]


def gelu_fast(x):
    """The same approximation with √(2/π) truncated to 0.7978845608, as HF's FastGELU has it."""
    return by_rows(lambda x: 0.5 * x * (1.0 + np.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x))), x)


def gelu_fast_backward(x, grad):
    """As gelu_new_backward, with √(2/π) truncated to 0.7978845608."""
    return by_rows(lambda x, g: _tanh_gelu_backward(x, g, 0.7978845608), x, grad)


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
    return by_rows(lambda x: x * sigmoid(1.702 * x), x)


def quick_gelu_backward(x, grad):
    """f = x·σ(kx), k = 1.702: f′ = σ(kx) + k·x·σ(kx)·(1 − σ(kx))."""
    return by_rows(_quick_gelu_backward, x, grad)


def _quick_gelu_backward(x, grad):
    s = sigmoid(1.702 * x)  # [...]
    return grad * (s + 1.702 * x * s * (1.0 - s))  # [...]


def relu(x):
    return by_rows(lambda x: np.maximum(x, 0.0), x)


def relu_backward(x, grad):
    """f′ = 1 where x > 0, else 0 (at x = 0 too, as torch's ReLU has it)."""
    return by_rows(lambda x, g: np.where(x > 0, g, 0.0), x, grad)  # [...] in grad's dtype


def silu(x):
    """x·σ(x), also called swish."""
    return by_rows(lambda x: x * sigmoid(x), x)


def silu_backward(x, grad):
    """f = x·σ(x): f′ = σ(x)·(1 + x·(1 − σ(x)))."""
    return by_rows(_silu_backward, x, grad)


def _silu_backward(x, grad):
    s = sigmoid(x)  # [...]
    return grad * (s * (1.0 + x * (1.0 - s)))  # [...]


def tanh(x):
    return by_rows(np.tanh, x)


def tanh_backward(x, grad):
    """f′ = 1 − tanh²(x)."""
    return by_rows(_tanh_backward, x, grad)


def _tanh_backward(x, grad):
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
    A block of rows at a time, on the threads, when ``x`` is C-contiguous (each row's max and sum
    are its own: the same numbers whole).
    """
    x = np.asarray(x)
    out = x if in_place else np.empty(x.shape, x.dtype)  # [..., n]
    if not (x.flags.c_contiguous and out.flags.c_contiguous):  # in place on a strided array: whole
        _softmax_into(x, out)
        return out
    return threads.into_by_rows(_softmax_into, x, out)  # [..., n]


def _softmax_into(x, out):
    """out = softmax(x) over the last axis (``out`` may be ``x``)."""
    np.subtract(x, x.max(axis=-1, keepdims=True), out=out)  # [..., n] ≤ 0
    np.exp(out, out=out)  # [..., n]
    out /= out.sum(axis=-1, keepdims=True)  # [..., n]


def log_softmax(x):
    """log softmax over the last axis, in x's dtype, stable: x − max − log Σ exp(x − max).
    A block of rows at a time, on the threads (each row's max and sum are its own)."""
    x = np.asarray(x)
    return threads.into_by_rows(_log_softmax_into, x, np.empty(x.shape, x.dtype))  # [..., n]


def _log_softmax_into(x, out):
    np.subtract(x, x.max(axis=-1, keepdims=True), out=out)  # [..., n] ≤ 0
    out -= np.log(np.exp(out).sum(axis=-1, keepdims=True))  # [..., n]


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
