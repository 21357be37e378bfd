"""Training a standard (ReLU) SAE in float64 with analytic gradients and Adam — the recipe of the
SAE shipped for the embedded model (weights/train_default_sae.py).

On a batch x [B, d_in] the loss is SAELens's standard SAE loss with its L1 penalty weighted by the
decoder rows' norms (so the penalty cannot be dodged by shrinking f and growing W_dec):

    x_in = x − b_dec,   h = x_in·W_enc + b_enc,   f = ReLU(h),   x̂ = f·W_dec + b_dec
    L    = (1/B) Σ_b ‖x̂_b − x_b‖²  +  λ·(1/B) Σ_b Σ_i f_bi·‖W_dec[i]‖

and its gradient, written out (``loss_and_grads``; tests/sae/test_sae_training.py checks it against
torch's autograd):

    g   = 2(x̂ − x)/B                                   ∂L/∂x̂            [B, d_in]
    ∂f  = g·W_decᵀ + (λ/B)·‖W_dec[i]‖                                    [B, d_sae]
    ∂h  = ∂f ⊙ [h > 0]
    ∂W_dec = fᵀ·g + (λ/B)·(Σ_b f_bi)·W_dec[i]/‖W_dec[i]‖
    ∂W_enc = x_inᵀ·∂h,   ∂b_enc = Σ_b ∂h,   ∂b_dec = Σ_b g − Σ_b ∂h·W_encᵀ

With ``k`` (a TopK SAE, no L1: λ = 0) f keeps the k largest of ReLU(h) per row, and ∂h = ∂f on
those entries only. Everything is float64 and seeded; with one BLAS thread the same machine and software write the
same bytes again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sae import topk


@dataclass
class SAESettings:
    d_sae: int = 576
    l1: float = 5.0
    lr: float = 1e-3
    steps: int = 3000
    batch: int = 512
    seed: int = 0
    k: int | None = None  # a TopK SAE (then l1 is ignored)
    betas: tuple = (0.9, 0.999)
    adam_eps: float = 1e-8


def init_params(d_in: int, d_sae: int, x_sample, seed: int) -> dict[str, np.ndarray]:
    """W_dec rows random with norm 0.1, W_enc = W_decᵀ, b_enc 0, b_dec the mean of ``x_sample``."""
    rng = np.random.default_rng(seed)
    W_dec = rng.standard_normal((d_sae, d_in))  # [d_sae, d_in]
    W_dec *= 0.1 / np.linalg.norm(W_dec, axis=-1, keepdims=True)
    return {"W_enc": W_dec.T.copy(), "b_enc": np.zeros(d_sae), "W_dec": W_dec,
            "b_dec": np.asarray(x_sample, np.float64).mean(0)}


def loss_and_grads(params, x, l1: float, k: int | None = None):
    """(loss, {name: ∂loss/∂param}, parts) for a batch x [B, d_in] (see the module docstring)."""
    if k is not None:
        l1 = 0.0
    W_enc, b_enc, W_dec, b_dec = params["W_enc"], params["b_enc"], params["W_dec"], params["b_dec"]
    B = len(x)
    x_in = x - b_dec  # [B, d_in]
    h = x_in @ W_enc + b_enc  # [B, d_sae]
    f = np.maximum(h, 0) if k is None else topk(h, k)  # [B, d_sae]
    x_hat = f @ W_dec + b_dec  # [B, d_in]
    error = x_hat - x  # [B, d_in]
    norms = np.linalg.norm(W_dec, axis=-1)  # [d_sae]
    mse = float((error**2).sum()) / B
    sparsity = float((f * norms).sum()) / B
    g = 2 * error / B  # [B, d_in]
    df = g @ W_dec.T + (l1 / B) * norms  # [B, d_sae]
    dh = df * (f > 0 if k is not None else h > 0)  # [B, d_sae]
    grads = {
        "W_dec": f.T @ g + (l1 / B) * f.sum(0)[:, None] * W_dec / norms[:, None],  # [d_sae, d_in]
        "W_enc": x_in.T @ dh,  # [d_in, d_sae]
        "b_enc": dh.sum(0),  # [d_sae]
        "b_dec": g.sum(0) - dh.sum(0) @ W_enc.T,  # [d_in]
    }
    return mse + l1 * sparsity, grads, {"mse": mse, "l1": sparsity, "l0": float((f > 0).sum(-1).mean())}


def train(x, settings: SAESettings, progress=None):
    """(params, log): ``settings.steps`` Adam steps on batches drawn (seeded) from x [n, d_in]."""
    rng = np.random.default_rng(settings.seed)
    params = init_params(x.shape[1], settings.d_sae, x[rng.choice(len(x), min(len(x), 4096), replace=False)],
                         settings.seed)
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(v) for k, v in params.items()}
    b1, b2 = settings.betas
    log = []
    for step in range(1, settings.steps + 1):
        batch = x[rng.integers(0, len(x), settings.batch)]  # [B, d_in]
        loss, grads, parts = loss_and_grads(params, batch, settings.l1, settings.k)
        for k, grad in grads.items():
            m[k] = b1 * m[k] + (1 - b1) * grad
            v[k] = b2 * v[k] + (1 - b2) * grad**2
            update = (m[k] / (1 - b1**step)) / (np.sqrt(v[k] / (1 - b2**step)) + settings.adam_eps)
            params[k] = params[k] - settings.lr * update
        log.append({"step": step, "loss": loss, **parts})
        if progress is not None and (step % 100 == 0 or step == 1):
            print(f"step {step}: loss {loss:.4f} mse {parts['mse']:.4f} l0 {parts['l0']:.1f}", file=progress, flush=True)
    return params, log
