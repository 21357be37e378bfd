"""L16 (refgpt/reference/local.py ``layer_norm_any``): a LayerNorm judged from its input to its output
for any mean/variance algorithm within L16's stated errors. Held under hypothesis against the
algorithms it names — Welford's updates, the one-pass E[x²] − μ², the two-pass, each in float32 as
a fused kernel (every step at float32, y stored at float32, bfloat16 or float16) — and torch's own
CPU kernel; and a wrong ε is still seen."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refgpt.reference import local as rl

f32 = np.float32
RATIOS: list[float] = []  # each example's worst |port − ref|/bound (benchmarks/local_seeds.py reads it)


def welford(x):
    """Welford's updates along the last axis, in float32: (mean, biased variance) [rows, 1]."""
    mean = np.zeros(x.shape[:-1], f32)  # [rows]
    m2 = np.zeros(x.shape[:-1], f32)  # [rows]
    for k in range(x.shape[-1]):
        delta = x[..., k] - mean  # [rows]
        mean = mean + delta / f32(k + 1)
        m2 = m2 + delta * (x[..., k] - mean)
    return mean[..., None], (m2 / f32(x.shape[-1]))[..., None]


def one_pass(x):
    """E[x²] − μ², sums in float32, sequentially (np.cumsum's last element)."""
    mean = np.cumsum(x, -1, dtype=f32)[..., -1:] / f32(x.shape[-1])  # [rows, 1]
    return mean, np.cumsum(x * x, -1, dtype=f32)[..., -1:] / f32(x.shape[-1]) - mean * mean


def two_pass(x):
    mean = np.cumsum(x, -1, dtype=f32)[..., -1:] / f32(x.shape[-1])  # [rows, 1]
    c = x - mean  # [rows, n]
    return mean, np.cumsum(c * c, -1, dtype=f32)[..., -1:] / f32(x.shape[-1])


ALGORITHMS = {"welford": welford, "one-pass": one_pass, "two-pass": two_pass}


def fused(x, w, b, eps, moments, store, eps_wrong=None):
    """A fused LayerNorm kernel in float32 on stored x: y = (x·r̂ − μ̂·r̂)·w + b, stored once."""
    mean, var = moments(x.astype(f32))
    e = np.full(var.shape, eps, f32) if eps_wrong is None else eps_wrong  # [rows, 1]
    r = f32(1) / np.sqrt(np.maximum(var, f32(0)) + e)  # [rows, 1]
    y = (x.astype(f32) * r - mean * r) * w.astype(f32) + b.astype(f32)  # [rows, n]
    return rl.round_to(y, store)


@st.composite
def rows(draw):
    n = draw(st.sampled_from([2, 3, 16, 64, 144, 768, 1024]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    offset = draw(st.sampled_from([0.0, 1.0, 30.0, 1e3]))
    spread = draw(st.sampled_from([1e-3, 0.1, 1.0, 10.0]))
    x = offset + spread * rng.standard_normal((4, n))  # [rows, n]
    x[0, rng.integers(n)] *= draw(st.sampled_from([1.0, 50.0]))  # an outlier
    w = 1 + 0.3 * rng.standard_normal(n)
    b = 0.2 * rng.standard_normal(n)
    return x, w, b, draw(st.sampled_from([1e-5, 1e-3, 0.1]))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows(), st.sampled_from(sorted(ALGORITHMS)), st.sampled_from(["float32", "bfloat16", "float16"]))
def test_l11_holds_for_welford_one_pass_and_two_pass(case, algorithm, store):
    x, w, b, eps = case
    prec = rl.PRECISIONS[store]
    x, w, b = (rl.round_to(a, store) for a in (x, w, b))
    if store == "float16" and not np.all(np.isfinite(x)):
        return
    port = fused(x, w, b, eps, ALGORITHMS[algorithm], store)
    ref, bound = rl.layer_norm_any(x, w, b, eps, prec)
    RATIOS.append(float(np.max(np.abs(port - ref) / ((bound + prec.tiny) * rl.bounds.SLACK))))
    assert np.all(np.abs(port - ref) <= (bound + prec.tiny) * rl.bounds.SLACK), np.max(np.abs(port - ref) / bound)


@pytest.mark.peer
@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows(), st.sampled_from(["float32", "bfloat16", "float16"]))
def test_l11_holds_for_torchs_cpu_layer_norm(case, store):
    torch = pytest.importorskip("torch")
    x, w, b, eps = case
    prec = rl.PRECISIONS[store]
    x, w, b = (rl.round_to(a, store) for a in (x, w, b))
    if store == "float16" and not np.all(np.isfinite(x)):
        return
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[store]
    t = lambda a: torch.from_numpy(a).to(dt)  # noqa: E731 exact: the values are already the dtype's
    port = torch.nn.functional.layer_norm(t(x), (x.shape[-1],), t(w), t(b), eps).to(torch.float64).numpy()
    ref, bound = rl.layer_norm_any(x, w, b, eps, prec)
    assert np.all(np.abs(port - ref) <= (bound + prec.tiny) * rl.bounds.SLACK), np.max(np.abs(port - ref) / bound)


@pytest.mark.parametrize("store", ["float32", "bfloat16"])
def test_l11_sees_one_rows_epsilon_wrong_by_five_percent_of_sigma(store):
    rng = np.random.default_rng(0)
    x, w, b = (rl.round_to(a, store) for a in (rng.standard_normal((4, 768)), 1 + 0.3 * rng.standard_normal(768),
                                               0.2 * rng.standard_normal(768)))
    var = x.var(-1, keepdims=True).astype(f32)  # [rows, 1]
    eps = np.full(var.shape, 1e-5, f32)
    eps[2] += f32(0.1025) * var[2]  # row 2's σ × 1.05
    port = fused(x, w, b, 1e-5, welford, store, eps_wrong=eps)
    ref, bound = rl.layer_norm_any(x, w, b, 1e-5, rl.PRECISIONS[store])
    over = np.abs(port - ref) > bound * rl.bounds.SLACK  # [rows, n]
    assert over[2].any() and not over[[0, 1, 3]].any()
