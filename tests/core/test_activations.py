"""Every MLP nonlinearity against its formula evaluated one number at a time with Python's math
module (an independent float64 program), in float64 and float32, on a grid through the curved
part and out to where exp overflows; and each keeps its input's dtype.

Tolerance: the vectorised and the scalar evaluation of one formula differ by a few roundings:
≤ 8·u·(|f(x)| + |x|), u the unit roundoff of the dtype. The |x| term is the cancellation in
x·(1 + tanh(…)) or x·σ(…) for x ≪ 0, where 1 + t (|t| ≤ 1) carries an absolute error ~u that is
then multiplied by x. In float32 the function of the float32 input is compared with the float64
value of the same formula.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from refgpt.gpt2.activations import ACTIVATIONS, log_softmax, sigmoid


def _sigmoid(x):
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


FORMULAS = {
    "gelu_new": lambda x: 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "gelu_pytorch_tanh": lambda x: 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "gelu_fast": lambda x: 0.5 * x * (1 + math.tanh(x * 0.7978845608 * (1 + 0.044715 * x * x))),
    "gelu": lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2))),
    "quick_gelu": lambda x: x * _sigmoid(1.702 * x),
    "relu": lambda x: max(x, 0.0),
    "silu": lambda x: x * _sigmoid(x),
    "swish": lambda x: x * _sigmoid(x),
    "tanh": math.tanh,
}
GRID = np.concatenate([np.linspace(-8, 8, 1601), [-800.0, -60.0, -20.0, -1e-8, 0.0, 1e-8, 20.0, 60.0, 800.0]])


def test_every_activation_has_a_formula():
    assert set(FORMULAS) == set(ACTIVATIONS)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_matches_its_formula(name):
    x = GRID.reshape(1, -1, 10)  # [batch, pos, d_mlp]: the shape the MLP gives it
    got = ACTIVATIONS[name](x)
    want = np.array([FORMULAS[name](float(v)) for v in GRID]).reshape(x.shape)
    assert got.dtype == np.float64 and got.shape == x.shape
    assert np.all(np.abs(got - want) <= 8 * np.finfo(np.float64).eps * (np.abs(want) + np.abs(x))), name


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_keeps_float32(name):
    x32 = GRID.astype(np.float32).reshape(-1, 10)  # [pos, d_mlp]
    got = ACTIVATIONS[name](x32)
    assert got.dtype == np.float32
    want = np.array([FORMULAS[name](float(v)) for v in x32.ravel()]).reshape(x32.shape)
    assert np.all(np.abs(got - want) <= 8 * np.finfo(np.float32).eps * (np.abs(want) + np.abs(x32))), name


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_does_not_depend_on_memory_layout(name):
    """Elementwise, so any layout of the same numbers gives the same bits: a hook may return
    hook_pre in Fortran order or as a strided view. (gelu_new fills its result a block of rows at a
    time through a [rows, d_mlp] view of it, which must be a view, not a copy.)"""
    x = GRID[:1600].reshape(4, 40, 10)  # [batch, pos, d_mlp]
    want = ACTIVATIONS[name](x)
    for other in (np.asfortranarray(x), x.transpose(1, 0, 2).copy().transpose(1, 0, 2), np.repeat(x, 2, axis=-1)[..., ::2]):
        assert np.array_equal(ACTIVATIONS[name](other), want), name


def test_sigmoid_does_not_overflow_and_is_symmetric():
    x = np.array([-1000.0, -745.0, -1.0, 0.0, 1.0, 745.0, 1000.0])
    with np.errstate(over="raise", invalid="raise"):  # exp(−1000) may underflow to 0, never overflow
        s = sigmoid(x)
    assert s[3] == 0.5 and s[-1] == 1.0 and s[0] == 0.0
    assert np.allclose(s + sigmoid(-x), 1, rtol=0, atol=1e-16)
    assert s[2] == pytest.approx(1 / (1 + math.e), rel=1e-15)


def test_log_softmax_is_per_row_over_the_last_axis():
    """Each row [..., n] on its own (rows 1000 apart: the max is subtracted per row, keepdims),
    against x − m − log Σ exp(x − m) one number at a time; bound as above, with |m| for the shift."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 5)) * 4 + 1000.0 * np.arange(6).reshape(2, 3, 1)  # [2, 3, 5]: not square
    got = log_softmax(x)
    assert got.shape == x.shape
    for row, out in zip(x.reshape(-1, 5), got.reshape(-1, 5)):
        m = max(row)
        lse = m + math.log(math.fsum(math.exp(v - m) for v in row))
        for v, o in zip(row, out):
            assert abs(o - (v - lse)) <= 8 * np.finfo(np.float64).eps / 2 * (abs(v) + abs(m) + 1)
