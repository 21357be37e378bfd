"""Generating text: one token at a time, each step a forward pass over the new token only.

    logits of the last position → divide by temperature → keep the top k → softmax → sample

The prompt goes through the model once, filling a KVCache; every later step feeds only the token
just chosen, with the cache supplying the earlier keys and values. Temperature 0 means greedy
(the arg-max token, ties to the lowest id). Sampling uses ``numpy.random.default_rng(seed)``, so
the same seed gives the same text.
"""

from __future__ import annotations

import numpy as np

from .activations import softmax
from .errors import RefGPTError


def generate(model, tokens, max_new_tokens: int, temperature: float = 1.0, top_k=None, seed=None):
    """``tokens`` [pos] or [batch, pos] followed by ``max_new_tokens`` new ones, same leading shape."""
    tokens, batched = model.check_tokens(tokens)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise RefGPTError(f"generate: max_new_tokens must be a whole number ≥ 0, found {max_new_tokens!r}")
    if tokens.shape[1] + max_new_tokens > model.cfg.n_ctx:
        raise RefGPTError(f"generate: {tokens.shape[1]} prompt tokens + {max_new_tokens} new exceed "
                          f"n_positions={model.cfg.n_ctx}")
    if not temperature >= 0:
        raise RefGPTError(f"generate: temperature must be ≥ 0, found {temperature!r}")
    if top_k is not None and not (isinstance(top_k, int) and top_k >= 1):
        raise RefGPTError(f"generate: top_k must be a whole number ≥ 1, found {top_k!r}")
    rng = np.random.default_rng(seed)
    past = model.kv_cache(tokens.shape[0])
    out, step = tokens, tokens
    for _ in range(max_new_tokens):
        logits = model(step, past=past, last_only=True)[:, -1]  # [batch, d_vocab]
        step = choose(logits, temperature, top_k, rng)[:, None]  # [batch, 1]
        out = np.concatenate([out, step], axis=1)  # [batch, pos + 1]
    return out if batched else out[0]


def choose(logits, temperature, top_k, rng):
    """One token per row of logits [batch, d_vocab]."""
    if temperature == 0:
        return logits.argmax(-1)  # [batch]
    scaled = logits.astype(np.float64) / temperature  # [batch, d_vocab]
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = np.sort(scaled, axis=-1)[:, -top_k][:, None]  # [batch, 1] the k-th largest
        scaled = np.where(scaled >= kth, scaled, -np.inf)  # [batch, d_vocab]
    probs = softmax(scaled, in_place=True)  # [batch, d_vocab]
    return np.array([rng.choice(len(p), p=p) for p in probs])  # [batch]
