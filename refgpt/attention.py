"""Causal multi-head self-attention, head by head in circuits notation.

For each head h, with x the LayerNorm'd residual stream [pos, d_model]:

    q = x·W_Q[h] + b_Q[h]        k = x·W_K[h] + b_K[h]        v = x·W_V[h] + b_V[h]   [pos, d_head]
    scores  = q·kᵀ · s            s = 1/√d_head (and /(layer+1) if configured)      [query, key]
    scores[i, j] = −∞ for j > i   (a position sees only itself and the past)
    pattern = softmax(scores)     each row sums to 1, masked entries are exactly 0  [query, key]
    z = pattern·v                                                                    [pos, d_head]
    out = Σ_h z[h]·W_O[h] + b_O                                                      [pos, d_model]

The heads are computed together: W_Q [head, d_model, d_head] is the same numbers as one
[d_model, head·d_head] matrix, so q for all heads is one matrix product.
"""

from __future__ import annotations

import numpy as np


def attention(x, p, scale, point):
    """One block's attention. ``p`` maps W_Q, b_Q, ... to arrays; ``point`` is the hook point."""
    batch, pos, d_model = x.shape
    n_heads, _, d_head = p["W_Q"].shape
    q = point("hook_q", project(x, p["W_Q"], p["b_Q"]))  # [batch, pos, head, d_head]
    k = point("hook_k", project(x, p["W_K"], p["b_K"]))  # [batch, pos, head, d_head]
    v = point("hook_v", project(x, p["W_V"], p["b_V"]))  # [batch, pos, head, d_head]

    scores = (q.transpose(0, 2, 1, 3) @ k.transpose(0, 2, 3, 1)) * scale  # [batch, head, query, key]
    scores[..., causal_mask(pos)] = -np.inf  # [batch, head, query, key]
    scores = point("hook_attn_scores", scores)  # [batch, head, query, key]
    pattern = point("hook_pattern", softmax(scores))  # [batch, head, query, key]

    z = point("hook_z", (pattern @ v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3))  # [batch, pos, head, d_head]
    W_O = p["W_O"].reshape(n_heads * d_head, d_model)  # [head·d_head, d_model]
    return z.reshape(batch, pos, n_heads * d_head) @ W_O + p["b_O"]  # [batch, pos, d_model]


def project(x, W, b):
    """x·W[h] + b[h] for every head at once."""
    n_heads, d_model, d_head = W.shape
    W_flat = W.transpose(1, 0, 2).reshape(d_model, n_heads * d_head)  # [d_model, head·d_head]
    out = x @ W_flat + b.reshape(n_heads * d_head)  # [batch, pos, head·d_head]
    return out.reshape(*x.shape[:-1], n_heads, d_head)  # [batch, pos, head, d_head]


def causal_mask(pos):
    """True where a query would look at a later key: above the diagonal."""
    return np.triu(np.ones((pos, pos), dtype=bool), k=1)  # [query, key]


def softmax(scores):
    """exp(s − max s) / Σ exp(s − max s) over the last axis; exp(−∞) = 0 exactly."""
    shifted = scores - scores.max(axis=-1, keepdims=True)  # [..., key] ≤ 0
    e = np.exp(shifted)  # [..., key]
    return e / e.sum(axis=-1, keepdims=True)  # [..., key]
