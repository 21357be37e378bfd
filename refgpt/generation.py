"""Generating text: one token at a time, each step a forward pass over the new token only.

    logits of the last position → divide by temperature → keep the top k → softmax → sample

The prompt goes through the model once, filling a KVCache; every later step feeds only the token
just chosen, with the cache supplying the earlier keys and values. Temperature 0 means greedy
(the arg-max token, ties to the lowest id). Sampling uses ``numpy.random.default_rng(seed)``, so
the same seed gives the same text.

Hooks active around ``generate`` (``with model.hooks(...)`` or ``with intervention:``) apply to
every step. A hook marked ``takes_start`` is told which absolute positions each step computes
(refgpt/hooks.py), so an edit of the prompt's positions — an ActAdd steering vector — is made
once, in the prompt's pass, and every generated token sees it through the KV cache.
"""

from __future__ import annotations

import numpy as np

from .activations import softmax
from .errors import RefGPTError, real_number


def generate(model, tokens, max_new_tokens: int, temperature: float = 1.0, top_k=None, seed=None):
    """``tokens`` [pos] or [batch, pos] followed by ``max_new_tokens`` new ones, same leading shape."""
    tokens, batched = model.check_tokens(tokens)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise RefGPTError(f"generate: max_new_tokens must be a whole number ≥ 0, found {max_new_tokens!r}")
    if tokens.shape[1] + max_new_tokens > model.cfg.n_ctx:
        raise RefGPTError(f"generate: {tokens.shape[1]} prompt tokens + {max_new_tokens} new exceed "
                          f"n_positions={model.cfg.n_ctx}")
    temperature = real_number(temperature, "generate: temperature", least=0)
    if top_k is not None and not (isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= 1):
        raise RefGPTError(f"generate: top_k must be a whole number ≥ 1, found {top_k!r:.60}")
    if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0):
        raise RefGPTError(f"generate: seed must be a whole number ≥ 0 or None, found {seed!r:.60}")
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
    with np.errstate(over="ignore"):
        scaled = logits.astype(np.float64) / temperature  # [batch, d_vocab]
    if not np.isfinite(scaled).all():
        raise RefGPTError(f"generate: temperature {temperature!r} is so small that logits / temperature "
                          "overflows float64; use temperature 0 for greedy decoding")
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = np.sort(scaled, axis=-1)[:, -top_k][:, None]  # [batch, 1] the k-th largest
        scaled = np.where(scaled >= kth, scaled, -np.inf)  # [batch, d_vocab]
    probs = softmax(scaled, in_place=True)  # [batch, d_vocab]
    return np.array([rng.choice(len(p), p=p) for p in probs])  # [batch]
