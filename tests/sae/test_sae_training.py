"""The SAE recipe's analytic gradient against torch's autograd, and its determinism."""

from __future__ import annotations

import numpy as np
import pytest

from refgpt.sae.training import SAESettings, init_params, loss_and_grads, train


@pytest.mark.peer
@pytest.mark.parametrize("k", [None, 5])
def test_analytic_gradients_match_autograd(k):
    torch = pytest.importorskip("torch", reason="the autograd check needs torch (the peers extra)")
    rng = np.random.default_rng(0)
    x = 3 * rng.standard_normal((64, 10))  # [B, d_in]
    params = init_params(10, 24, x, seed=1)
    params = {k: v + 0.05 * rng.standard_normal(v.shape) for k, v in params.items()}
    l1 = 0.7 if k is None else 0.0
    loss, grads, _ = loss_and_grads(params, x, l1=l1, k=k)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    xt = torch.tensor(x)
    h = (xt - t["b_dec"]) @ t["W_enc"] + t["b_enc"]
    if k is None:
        f = torch.relu(h)
    else:
        values, indices = torch.topk(h, k, dim=-1)
        f = torch.zeros_like(h).scatter(-1, indices, torch.relu(values))
    x_hat = f @ t["W_dec"] + t["b_dec"]
    theirs = ((x_hat - xt) ** 2).sum(-1).mean() + l1 * (f * t["W_dec"].norm(dim=-1)).sum(-1).mean()
    theirs.backward()
    # the same float64 arithmetic in another order: a few ulps of each sum (measured ≤ 1e-15)
    assert abs(loss - theirs.item()) <= 1e-12 * abs(loss)
    for name, grad in grads.items():
        reference = t[name].grad.numpy()
        assert np.max(np.abs(grad - reference)) <= 1e-12 * np.max(np.abs(reference)), name


def test_training_is_deterministic_to_the_bit():
    x = np.random.default_rng(2).standard_normal((300, 6))
    settings = SAESettings(d_sae=12, steps=20, batch=32, l1=0.1)
    a, log_a = train(x, settings)
    b, log_b = train(x, settings)
    assert all(np.array_equal(a[k], b[k]) for k in a) and log_a == log_b
    assert log_a[-1]["loss"] < log_a[0]["loss"]
