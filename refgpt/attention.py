"""Causal multi-head self-attention, head by head in circuits notation.

For each head h, with x the LayerNorm'd residual stream [pos, d_model]:

    q = x·W_Q[h] + b_Q[h]        k = x·W_K[h] + b_K[h]        v = x·W_V[h] + b_V[h]   [pos, d_head]
    scores  = q·kᵀ · s            s = 1/√d_head (and /(layer+1) if configured)      [query, key]
    scores[i, j] = −∞ for j > i   (a position sees only itself and the past)
    pattern = softmax(scores)     each row sums to 1, masked entries are exactly 0  [query, key]
    z = pattern·v                                                                    [pos, d_head]
    out = Σ_h z[h]·W_O[h] + b_O                                                      [pos, d_model]

The heads are computed together. W_Q [head, d_model, d_head] holds the same numbers as one
[d_model, head·d_head] matrix, so q for every head is one matrix product; Σ_h z[h]·W_O[h] is one
product of z [pos, head·d_head] with W_O seen as [head·d_head, d_model]. The model hands this
module its weights in that flat layout (``Model.block_weights``).
"""

from __future__ import annotations

import functools

import numpy as np


def attention(x, w, n_heads, scale, point, past=None):
    """One block's attention. ``w``: W_Q, W_K, W_V [d_model, head·d_head], b_Q, b_K, b_V
    [head·d_head], W_O [head·d_head, d_model], b_O [d_model]. ``point`` is the hook point.
    ``past(k, v)``, in incremental decoding, stores the new keys and values and returns all of them."""
    batch, pos, _ = x.shape
    heads = (batch, pos, n_heads, -1)
    q = point("hook_q", (x @ w["W_Q"] + w["b_Q"]).reshape(heads))  # [batch, pos, head, d_head]
    k = point("hook_k", (x @ w["W_K"] + w["b_K"]).reshape(heads))  # [batch, pos, head, d_head]
    v = point("hook_v", (x @ w["W_V"] + w["b_V"]).reshape(heads))  # [batch, pos, head, d_head]

    if past is not None:
        k, v = past(k, v)  # [batch, key, head, d_head]: the earlier positions' keys, then these

    scores = q.transpose(0, 2, 1, 3) @ k.transpose(0, 2, 3, 1)  # [batch, head, query, key]
    scores *= scale  # [batch, head, query, key]
    scores += causal_bias(pos, k.shape[1] - pos, scores.dtype)  # [batch, head, query, key], −∞ on future keys
    scores = point("hook_attn_scores", scores)  # [batch, head, query, key]
    # Nobody else holds the scores unless they are hooked or cached: then softmax may reuse them.
    pattern = point("hook_pattern", softmax(scores, in_place=not point.watched("hook_attn_scores")))

    z = point("hook_z", (pattern @ v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3))  # [batch, pos, head, d_head]
    return z.reshape(batch, pos, -1) @ w["W_O"] + w["b_O"]  # [batch, pos, d_model]


@functools.lru_cache(maxsize=8)
def causal_bias(pos, start, dtype):
    """0 where a query may look, −∞ where it may not: added to the scores. Query i is position
    start + i and sees keys 0 … start + i (``start`` > 0 when earlier keys come from a KV cache)."""
    bias = np.triu(np.full((pos, start + pos), -np.inf, dtype=dtype), k=start + 1)  # [query, key]
    bias.flags.writeable = False
    return bias


def softmax(scores, in_place=False):
    """exp(s − max s) / Σ exp(s − max s) over the last axis; exp(−∞) = 0 exactly."""
    out = scores if in_place else np.empty_like(scores)  # [..., key]
    np.subtract(scores, scores.max(axis=-1, keepdims=True), out=out)  # [..., key] ≤ 0
    np.exp(out, out=out)  # [..., key]
    out /= out.sum(axis=-1, keepdims=True)  # [..., key]
    return out
