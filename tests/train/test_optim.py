"""AdamW and SGD: torch.optim.AdamW's and torch.optim.SGD's numbers (≤ 1e-12 relative in float64), and
what AdamW's first step is."""

from __future__ import annotations

import numpy as np
import pytest

from random_models import rel_err
from refgpt import RefGPTError
from refgpt.train.optim import SGD, AdamW

TORCH_TOL = 1e-12  # the bound; measured ≤ 1e-16 (the same operations in the same order)


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    params = {"W": rng.standard_normal((4, 3)), "b": rng.standard_normal(3), "w": 1 + rng.standard_normal(5)}
    grads = [{k: rng.standard_normal(v.shape) * 10.0 ** rng.integers(-3, 2) for k, v in params.items()} for _ in range(6)]
    return params, grads


@pytest.mark.peer
def test_adamw_matches_torch_adamw_step_by_step():
    """Six steps with changing learning rates, decay on some parameters only, float64."""
    torch = pytest.importorskip("torch", reason="peer test: needs torch (the 'peers' extra)")
    params, grads = _problem()
    lrs = [1e-3, 3e-3, 2e-3, 1e-2, 5e-4, 1e-3]
    betas, eps, wd = (0.9, 0.95), 1e-8, 0.1
    mine = {k: v.copy() for k, v in params.items()}
    opt = AdamW(mine, lr=lrs[0], betas=betas, eps=eps, weight_decay=wd, decay=lambda name: name == "W")
    theirs = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    t_opt = torch.optim.AdamW([{"params": [theirs["W"]], "weight_decay": wd},
                               {"params": [theirs["b"], theirs["w"]], "weight_decay": 0.0}],
                              lr=lrs[0], betas=betas, eps=eps, foreach=False)
    side_by_side(torch, opt, t_opt, mine, theirs, zip(lrs, grads))


def side_by_side(torch, opt, t_opt, mine, theirs, steps):
    """Step refgpt's ``opt`` (over ``mine``) and torch's ``t_opt`` (over ``theirs``) with the same
    (lr, gradients) pairs; after each step every parameter agrees to TORCH_TOL."""
    for lr, g in steps:
        opt.step(g, lr=lr)
        for group in t_opt.param_groups:
            group["lr"] = lr
        for k, t in theirs.items():
            t.grad = torch.tensor(g[k])
        t_opt.step()
        for k in mine:
            assert rel_err(mine[k], theirs[k].detach().numpy()) <= TORCH_TOL, k


@pytest.mark.peer
def test_sgd_is_torch_sgd_with_nesterov_momentum_and_weight_decay():
    """SGD (refgpt.train.optim) as the tuned-lens package uses it — Nesterov momentum 0.9, weight
    decay 1e-3 — and with plain momentum, and without: five steps with a decaying lr, float64."""
    torch = pytest.importorskip("torch", reason="peer test: needs torch (the 'peers' extra)")
    rng = np.random.default_rng(0)
    for momentum, nesterov, wd in ((0.9, True, 1e-3), (0.5, False, 0.1), (0.0, False, 0.0)):
        params = {"W": rng.standard_normal((4, 3)), "b": rng.standard_normal(3)}
        mine = {k: v.copy() for k, v in params.items()}
        opt = SGD(mine, lr=0.1, momentum=momentum, weight_decay=wd, nesterov=nesterov)
        theirs = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
        t_opt = torch.optim.SGD(list(theirs.values()), lr=0.1, momentum=momentum, weight_decay=wd, nesterov=nesterov,
                                foreach=False)
        grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(5)]
        side_by_side(torch, opt, t_opt, mine, theirs, zip((0.1, 0.08, 0.05, 0.02, 0.01), grads))
    with pytest.raises(RefGPTError, match="Nesterov momentum needs momentum > 0"):
        SGD(mine, lr=0.1, nesterov=True)


def test_first_step_moves_each_weight_by_lr_against_the_gradient_sign():
    """At t = 1, m̂ = g and v̂ = g², so the step is lr·g/(|g| + ε) ≈ lr·sign(g), after decay θ·(1 − lr·λ)."""
    params, grads = _problem(1)
    before = {k: v.copy() for k, v in params.items()}
    AdamW(params, lr=0.01, weight_decay=0.5, eps=1e-8).step(grads[0])
    for k, g in grads[0].items():
        expected = before[k] * (1 - 0.01 * 0.5) - 0.01 * g / (np.abs(g) + 1e-8)
        assert rel_err(params[k], expected) <= 1e-15, k


def test_float32_parameters_stay_float32():
    params = {"W": np.ones((2, 2), np.float32)}
    AdamW(params, lr=0.1).step({"W": np.full((2, 2), 0.5, np.float32)})
    assert params["W"].dtype == np.float32 and params["W"][0, 0] < 1


def test_bad_input_names_the_parameter():
    with pytest.raises(RefGPTError, match="'W' must be a writeable float array"):
        AdamW({"W": np.ones(3, int)})
    opt = AdamW({"W": np.ones(3)})
    with pytest.raises(RefGPTError, match="no gradient for \\['W'\\]"):
        opt.step({})
    with pytest.raises(RefGPTError, match="gradient 'W' has shape \\[2\\], expected \\[3\\]"):
        opt.step({"W": np.ones(2)})
