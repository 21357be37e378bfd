"""The golden's third float32 pass: refgpt's float32 pass with one more rounding, at random, everywhere.

The golden writer measures how far a correct float32 port may land from float64 by running float32
ports itself (refgpt/oracle/golden.py): refgpt's own pass and the sequential port's. Two passes
are two rounding patterns, and both can be lucky in the same way. In a model whose LayerNorm
normalises two numbers, x̂ is ±1 up to rounding, so every position's keys and values are equal up
to rounding, and ∂scores = p ⊙ (∂p − Σ p·∂p) is a difference of equal numbers: 0 in exact
arithmetic, and exactly 0 in both of refgpt's float32 passes, whose x̂ came out exactly ±1. A C
port built with ``-Ofast`` rounds x̂ to 1 − 2⁻²⁴ at one position and 1 at another, and its ∂scores
is u-sized noise; c_X measured as 0 turned that noise into a failure 7.5·10⁸ times its tolerance.

This pass breaks such coincidences. It is refgpt's float32 pass with every activation at a hook
point, and every gradient arriving at one in the backward pass, multiplied by (1 + u·r), r drawn
uniformly from [−1, 1] (u = 2⁻²⁴): one more rounding, in a pattern no summation order produces,
which is Monte Carlo arithmetic's way (Parker, 1997) of asking how sensitive each tensor is to
rounding anywhere upstream. The embedding gathers (``hook_embed``, ``hook_pos_embed``) are exact
in every port and are left alone. The draws are seeded by the hook point's name and how many
times it has fired, so the pass, and the golden file, are the same on every run and in every
order of evaluation (``write_streamed`` and ``make`` write the same bytes).

The backward runs from the perturbed forward's activations (refgpt/backward.py's ``backward`` on
the cache this pass filled), so a gradient sees both the forward's extra roundings and its own.
"""

from __future__ import annotations

import zlib

import numpy as np

from ..backward import backward
from ..model import Model
from ..tl.hooks import GradientRun
from .gradients import full_targets, gradient_tensors

#: float32's unit roundoff: the size of the extra rounding.
U = 2.0**-24
#: Hook points every port computes exactly (a gather of stored weights): not perturbed.
EXACT = ("hook_embed", "hook_pos_embed")


class Rounding:
    """The extra rounding as a hook: ``a·(1 + u·r)`` in ``a``'s dtype, r ~ U[−1, 1] drawn from a
    generator seeded by (the hook point's name, how many times it has fired, ``seed``)."""

    def __init__(self, seed: int = 0):
        self.seed, self.fired = seed, {}

    def __call__(self, a, hook):
        name = hook.name
        if name in EXACT or not isinstance(a, np.ndarray) or a.dtype.kind != "f":
            return None
        k = self.fired[name] = self.fired.get(name, -1) + 1
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode()), k])
        r = rng.uniform(-1.0, 1.0, a.shape)  # [same shape]
        with np.errstate(invalid="ignore"):  # −∞ (masked scores) stays −∞
            return (a * (1.0 + U * r)).astype(a.dtype)  # [same shape]

    @staticmethod
    def everywhere(_name) -> bool:
        return True


def hooks(seed: int = 0) -> list:
    """The forward hooks of one perturbed pass (a fresh ``Rounding``), for ``model.hooks``/``run``."""
    return [(Rounding.everywhere, Rounding(seed))]


def gradients(model: Model, tokens, targets=None, seed: int = 0) -> dict[str, np.ndarray]:
    """``loss_mean`` and every ``grad.*`` golden tensor of the perturbed pass (module docstring):
    the same names and order as refgpt/oracle/gradients.py's ``compute_gradients``."""
    tokens, _ = model.check_tokens(tokens)  # [batch, pos]
    rounding = Rounding(seed)
    with model.hooks(fwd_hooks=[(Rounding.everywhere, rounding)]):
        logits, cache = model.run_with_cache(tokens)  # [batch, pos, d_vocab]
    with model.hooks(bwd_hooks=[(Rounding.everywhere, Rounding(seed + 1))]):
        g = backward(model, tokens, cache, logits, full_targets(tokens, targets), GradientRun(model.hook_dict))
    return gradient_tensors(model, g)


__all__ = ["EXACT", "Rounding", "gradients", "hooks"]
