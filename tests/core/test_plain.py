"""Every fast path of refgpt against the plain reading copy, refgpt/gpt2/plain.py.

The bound. Both copies compute the same function of the same inputs in float64; they differ only
in the order and grouping of their roundings. So each op is checked on the *same* input — the fast
path's own cached input to that op — and the two outputs may differ by at most the sum of the two
computations' worst-case rounding errors (Higham, Accuracy and Stability of Numerical Algorithms,
§3.1): a sum or dot product of k terms computed in any order is within γ_k·Σ|terms| of the exact
one, γ_k = k·u/(1 − k·u), u = 2⁻⁵³. Hence for an affine op y = x·W + b with inner length k,

    |y_fast − y_plain| ≤ 2·γ_{k+1}·(|x|·|W| + |b|)          elementwise.

A wrong formula, a dropped key or a wrong scale moves an output by far more than that.
"""

from __future__ import annotations

import numpy as np

from random_models import random_model
from refgpt import Config
from refgpt.gpt2 import plain

U = 2.0 ** -53


def gamma(k):
    return k * U / (1 - k * U)


CFG = Config(d_model=16, n_layers=2, n_heads=4, d_mlp=40, d_vocab=50, n_ctx=160, eps=1e-3)


def test_plain_names_every_activation_as_the_cache_does():
    model = random_model(CFG, seed=3, scale=0.8)
    tokens = np.random.default_rng(0).integers(0, CFG.d_vocab, 70)
    _, acts = plain.forward(model.params, CFG, tokens)
    _, cache = model.run_with_cache(tokens)
    assert set(acts) <= set(cache)
    assert all(cache[name].shape[1:] == a.shape for name, a in acts.items())


def test_the_unembedding_is_the_plain_one_on_the_same_input():
    model = random_model(CFG, seed=3, scale=0.8)
    tokens = np.random.default_rng(0).integers(0, CFG.d_vocab, 70)
    logits, cache = model.run_with_cache(tokens)
    p = model.params
    final = cache["ln_final.hook_normalized"][0] * p["ln_final.w"] + p["ln_final.b"]  # [pos, d_model]
    expected = final @ p["unembed.W_U"]  # [pos, d_vocab]
    bound = 2 * gamma(CFG.d_model) * (np.abs(final) @ np.abs(p["unembed.W_U"]))
    assert (np.abs(logits - expected) <= bound).all()
