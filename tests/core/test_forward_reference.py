"""The forward pass against a textbook GPT-2 written here in a few lines of NumPy (einsum per head,
np.var LayerNorm, a tril mask), at lengths that cross the fast paths' 64-row blocks. Independent
of refgpt's code, with no peer packages: a quick check of the numbers the peer tests check
against HF and TransformerLens (test_peers_boundaries.py).

Tolerance 1e-12 relative, the peers' float64 bound: two float64 programs for one function.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from random_models import random_model, rel_err
from refgpt import Config

ACTS = {
    "gelu_new": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "relu": lambda x: np.maximum(x, 0),
    "silu": lambda x: x / (1 + np.exp(-x)),
}


def textbook_logits(model, tokens):
    """GPT-2 for tokens [pos], straight from the paper's equations."""
    cfg, p = model.cfg, model.params

    def ln(x, w, b):
        return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + cfg.eps) * w + b

    pos = len(tokens)
    x = p["embed.W_E"][tokens] + p["pos_embed.W_pos"][:pos]  # [pos, d_model]
    future = np.triu(np.ones((pos, pos), bool), 1)  # [query, key]
    for L in range(cfg.n_layers):
        b = f"blocks.{L}."
        h = ln(x, p[b + "ln1.w"], p[b + "ln1.b"])
        q = np.einsum("pd,hde->hpe", h, p[b + "attn.W_Q"]) + p[b + "attn.b_Q"][:, None]  # [head, pos, d_head]
        k = np.einsum("pd,hde->hpe", h, p[b + "attn.W_K"]) + p[b + "attn.b_K"][:, None]
        v = np.einsum("pd,hde->hpe", h, p[b + "attn.W_V"]) + p[b + "attn.b_V"][:, None]
        scores = np.einsum("hqe,hke->hqk", q, k) * cfg.score_scale(L)  # [head, query, key]
        scores[:, future] = -np.inf
        pattern = np.exp(scores - scores.max(-1, keepdims=True))
        pattern /= pattern.sum(-1, keepdims=True)
        z = np.einsum("hqk,hke->hqe", pattern, v)  # [head, pos, d_head]
        x = x + np.einsum("hpe,hed->pd", z, p[b + "attn.W_O"]) + p[b + "attn.b_O"]
        h = ln(x, p[b + "ln2.w"], p[b + "ln2.b"])
        x = x + ACTS[cfg.act_fn](h @ p[b + "mlp.W_in"] + p[b + "mlp.b_in"]) @ p[b + "mlp.W_out"] + p[b + "mlp.b_out"]
    return ln(x, p["ln_final.w"], p["ln_final.b"]) @ p["unembed.W_U"]  # [pos, d_vocab]


@pytest.mark.parametrize("act, inverse_layer_scale", [("gelu_new", False), ("relu", True), ("silu", False)])
def test_forward_equals_the_textbook_at_block_boundaries(act, inverse_layer_scale):
    cfg = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=23, n_ctx=140, act_fn=act, eps=1e-3,
                 scale_attn_by_inverse_layer_idx=inverse_layer_scale)
    model = random_model(cfg, seed=21, scale=1.0)
    rng = np.random.default_rng(0)
    batch = rng.integers(0, cfg.d_vocab, size=(2, 140))
    expected = np.stack([textbook_logits(model, row) for row in batch])  # [batch, pos, d_vocab]
    for pos in (1, 63, 65, 129, 140):
        got = model(batch[:, :pos])
        assert rel_err(got, expected[:, :pos]) <= 1e-12, pos  # causal: a prefix's logits are a prefix
        assert rel_err(model(batch[1, :pos]), expected[1, :pos]) <= 1e-12, pos
    cached, _ = model.run_with_cache(batch)
    assert rel_err(cached, expected) <= 1e-12
