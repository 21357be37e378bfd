"""docs/layernorm.md's bounds as functions, shared by the tests that check them (§5, §6)."""

from __future__ import annotations

import numpy as np

from refgpt.gpt2.layernorm import layer_norm


def ln_rounding(x, w, b, eps):
    """§6: the 2-norm rounding allowance of a computed LN_ε(x), evaluated at the actual inputs."""
    x = np.asarray(x, np.float64)
    n = x.shape[-1]
    u = np.finfo(x.dtype).eps / 2
    gamma = (n + 3) * u / (1 - (n + 3) * u)
    centered = x - x.mean()
    sigma = np.sqrt(np.mean(centered**2) + eps)
    out = layer_norm(x, w, b, eps)
    return np.max(np.abs(w)) * np.sqrt(n) * gamma * (np.max(np.abs(x)) / sigma + np.sqrt(n)) + u * np.linalg.norm(out)


def convergence_bound(d, s, w, eps, k=1.0):
    """§5: ‖w‖_∞√n·[2‖Ps‖/(k‖Pd‖) + nε/(2(k‖Pd‖ − ‖Ps‖)²)], valid when k‖Pd‖ > ‖Ps‖."""
    n = d.shape[-1]
    Pd, Ps = np.linalg.norm(d - d.mean()), np.linalg.norm(s - s.mean())
    assert k * Pd > Ps
    return np.max(np.abs(w)) * np.sqrt(n) * (2 * Ps / (k * Pd) + n * eps / (2 * (k * Pd - Ps) ** 2))


def ln0(d, w, b):
    """LN₀(d) = w ⊙ √n·Pd/‖Pd‖ + b: the eps-free LayerNorm, the limit of LN_ε(k·d)."""
    return layer_norm(d, w, b, 0.0)
