"""The MLP's nonlinearities, each written as the formula HF's ``ACT2FN`` computes.

GPT-2 uses ``gelu_new``, the tanh approximation of GELU(x) = x·Φ(x) (Φ the standard normal CDF):

    gelu_new(x) = ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))

The other names are what other GPT-2-architecture checkpoints put in ``activation_function``.
Every function keeps its input's dtype: Python float constants do not promote float32 arrays
(NumPy ≥ 2), and no float64 temporary is created for a float32 input except in ``gelu`` (below).
"""

from __future__ import annotations

import math

import numpy as np

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT_HALF = math.sqrt(0.5)

# math.erf is the C library's erf, correctly rounded to within an ulp; NumPy has no erf of its
# own, so it is applied element by element. It is slow (about 0.1 µs an element) but exact, and
# GPT-2's own checkpoints use gelu_new, not gelu.
_erf = np.frompyfunc(math.erf, 1, 1)


def gelu_new(x):
    """GELU, tanh approximation, as OpenAI's GPT-2 code writes it:
    ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).

    Evaluated in one buffer, step by step, because it runs on the largest activation of the
    model ([pos, d_mlp]); ×½ is exact, so the order of the final products does not change a bit.
    """
    t = x * x  # x²
    t *= x  # x³
    t *= 0.044715
    t += x  # x + 0.044715·x³
    t *= _SQRT_2_OVER_PI
    np.tanh(t, out=t)
    t += 1.0
    t *= x
    t *= 0.5  # ½·x·(1 + tanh(…))
    return t


def gelu_fast(x):
    """The same approximation with √(2/π) truncated to 0.7978845608, as HF's FastGELU has it."""
    return 0.5 * x * (1.0 + np.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def gelu(x):
    """Exact GELU: ½·x·(1 + erf(x/√2)), erf evaluated in float64 and rounded to x's dtype."""
    erf = _erf(np.asarray(x, dtype=np.float64) * _SQRT_HALF).astype(x.dtype)
    return x * 0.5 * (1.0 + erf)


def quick_gelu(x):
    """x·σ(1.702·x)."""
    return x * sigmoid(1.702 * x)


def relu(x):
    return np.maximum(x, 0.0)


def silu(x):
    """x·σ(x), also called swish."""
    return x * sigmoid(x)


def tanh(x):
    return np.tanh(x)


def sigmoid(x):
    """σ(x) = 1 / (1 + e^(−x)), written so that neither branch overflows."""
    # For x ≥ 0, e^(−x) ≤ 1; for x < 0 use σ(x) = e^x / (1 + e^x) with e^x < 1.
    e = np.exp(-np.abs(x))  # [...] in (0, 1]
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


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
