"""Optimizers over dicts of NumPy arrays, each as its torch.optim namesake computes it.

**AdamW**: Adam with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW computes it.

For each parameter θ with gradient g, at step t = 1, 2, …:

    θ ← θ·(1 − lr·λ)                       decoupled weight decay: shrink θ, whatever g is
    m ← β₁·m + (1 − β₁)·g                  running mean of the gradient
    v ← β₂·v + (1 − β₂)·g²                 running mean of its square
    m̂ = m/(1 − β₁ᵗ)    v̂ = v/(1 − β₂ᵗ)     bias correction: m and v start at 0
    θ ← θ − lr·m̂/(√v̂ + ε)

"Decoupled": plain Adam with L2 regularisation adds λ·θ to g, so the decay is divided by √v̂
like the gradient; AdamW subtracts lr·λ·θ directly. The order of the operations is torch's
(``_single_tensor_adamw``), so in float64 the two agree to rounding.

Parameters whose ``decay(name)`` is false get no weight decay (GPT-2 trainers exempt biases,
LayerNorm parameters and often the embeddings, as llm.c and nanoGPT decay only matrices).

**SGD**: stochastic gradient descent with momentum, as torch.optim.SGD computes it (dampening 0),
which the tuned-lens package trains its lenses with (Nesterov momentum 0.9, weight decay 10⁻³):

    g ← g + λ·θ                            coupled weight decay: part of the gradient
    m ← g  (first step),  m ← μ·m + g      the momentum buffer (no (1 − μ) factor: torch's)
    g ← g + μ·m  (Nesterov),  g ← m        the step direction
    θ ← θ − lr·g

Without the (1 − μ) factor the buffer settles at g/(1 − μ) for a constant gradient: the effective
learning rate is lr/(1 − μ), which is why the package passes lr = 1.0·(1 − μ) = 0.1.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..errors import RefGPTError


class AdamW:
    """AdamW over a dict of NumPy arrays, updated in place by ``step(grads)``."""

    def __init__(self, params: dict[str, np.ndarray], lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2,
                 decay: Callable[[str], bool] = lambda name: True):
        for name, array in params.items():
            if not isinstance(array, np.ndarray) or array.dtype.kind != "f" or not array.flags.writeable:
                raise RefGPTError(f"AdamW: parameter {name!r} must be a writeable float array")
        self.params = params
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        self.decay = {name: bool(decay(name)) for name in params}
        self.m = {name: np.zeros_like(a) for name, a in params.items()}  # first moments
        self.v = {name: np.zeros_like(a) for name, a in params.items()}  # second moments
        self.t = 0

    def step(self, grads: dict[str, np.ndarray], lr: float | None = None) -> None:
        """One update of every parameter from ``grads`` (same names and shapes); ``lr`` overrides
        the learning rate for this step (a schedule)."""
        lr = self.lr if lr is None else lr
        if missing := set(self.params) - set(grads):
            raise RefGPTError(f"AdamW.step: no gradient for {sorted(missing)[:5]}")
        self.t += 1
        beta1, beta2 = self.betas
        correction1 = 1.0 - beta1 ** self.t
        correction2_sqrt = math.sqrt(1.0 - beta2 ** self.t)
        step_size = lr / correction1
        for name, theta in self.params.items():
            g = grads[name]
            if g.shape != theta.shape:
                raise RefGPTError(f"AdamW.step: gradient {name!r} has shape {list(g.shape)}, expected {list(theta.shape)}")
            if self.decay[name] and self.weight_decay:
                theta *= 1.0 - lr * self.weight_decay
            m, v = self.m[name], self.v[name]
            m += (1.0 - beta1) * (g - m)  # torch's lerp: β₁·m + (1 − β₁)·g
            v *= beta2
            v += (1.0 - beta2) * g * g
            denom = np.sqrt(v) / correction2_sqrt + self.eps  # √v̂ + ε
            theta -= step_size * (m / denom)


class SGD:
    """SGD with momentum (optionally Nesterov) and coupled weight decay over a dict of NumPy arrays,
    updated in place by ``step(grads)``; torch.optim.SGD's operations in its order."""

    def __init__(self, params: dict[str, np.ndarray], lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False):
        for name, array in params.items():
            if not isinstance(array, np.ndarray) or array.dtype.kind != "f" or not array.flags.writeable:
                raise RefGPTError(f"SGD: parameter {name!r} must be a writeable float array")
        if nesterov and not momentum > 0:
            raise RefGPTError("SGD: Nesterov momentum needs momentum > 0")
        self.params, self.lr, self.momentum, self.weight_decay, self.nesterov = params, lr, momentum, weight_decay, nesterov
        self.buffers: dict[str, np.ndarray] = {}  # momentum buffers, made at the first step

    def step(self, grads: dict[str, np.ndarray], lr: float | None = None) -> None:
        """One update of every parameter from ``grads``; ``lr`` overrides the learning rate (a schedule)."""
        lr = self.lr if lr is None else lr
        if missing := set(self.params) - set(grads):
            raise RefGPTError(f"SGD.step: no gradient for {sorted(missing)[:5]}")
        for name, theta in self.params.items():
            g = grads[name]
            if g.shape != theta.shape:
                raise RefGPTError(f"SGD.step: gradient {name!r} has shape {list(g.shape)}, expected {list(theta.shape)}")
            if self.weight_decay:
                g = g + self.weight_decay * theta
            if self.momentum:
                buf = self.buffers.get(name)
                if buf is None:
                    buf = self.buffers[name] = g.copy()
                else:
                    buf *= self.momentum
                    buf += g
                g = g + self.momentum * buf if self.nesterov else buf
            theta -= lr * g
