"""Measurements of a run: how big the residual stream is, and how much an intervention changed.

Why these three. When a vector k·d is added to the stream at one position, the blocks after it
see that position through LayerNorm, which divides by the stream's own scale (docs/layernorm.md
§4). So what matters is not k but the *ratio* of the injected vector's norm to the stream's:

    resid_norms(cache)                 ‖resid‖ at every block and position, before and after each
                                       sublayer: where the stream is huge and where it is not
    injection_ratio(cache, v, …)       ‖v‖ / ‖resid‖ per layer: → 1 as k grows, the stream *is* v
    kl_divergence(steered, clean)      KL between next-token distributions, per position: what
                                       the edit did to the predictions, position by position

Norms are taken in float64 whatever the model's dtype (``norm``): a float32 stream holding a huge
injected vector is finite, but its squared norm overflows float32 long before (at 1.8·10¹⁹).

A stream index M runs over the streams entering each block and the final one: M < n_layers is
``blocks.M.hook_resid_pre``, M = n_layers is the last ``hook_resid_post`` (what ln_final reads).
"""

from __future__ import annotations

import numpy as np

from ..gpt2.activations import log_softmax
from ..errors import RefGPTError, need, whole_number, whole_numbers

RESID_KINDS = ("resid_pre", "resid_mid", "resid_post")


def norm(array) -> np.ndarray:
    """2-norms over the last axis, computed in float64 (exact upcast of float32: no overflow)."""
    return np.linalg.norm(np.asarray(array, dtype=np.float64), axis=-1)


def resid_norms(cache, batch: int = 0) -> dict[str, np.ndarray]:
    """{"resid_pre" | "resid_mid" | "resid_post": [layer, pos]} 2-norms of one batch row's stream."""
    n_layers = cache.model.cfg.n_layers
    return {kind: np.stack([norm(need(cache, f"blocks.{L}.hook_{kind}")[batch])  # [pos]
                            for L in range(n_layers)])  # [layer, pos]
            for kind in RESID_KINDS}


def streams(cache) -> np.ndarray:
    """The streams entering each block and the final stream: [n_layers + 1, batch, pos, d_model]."""
    n_layers = cache.model.cfg.n_layers
    names = [f"blocks.{L}.hook_resid_pre" for L in range(n_layers)] + [f"blocks.{n_layers - 1}.hook_resid_post"]
    return np.stack([need(cache, name) for name in names])  # [stream, batch, pos, d_model]


def stream_labels(n_layers: int) -> list[str]:
    """Names of the rows of ``streams``: "0_pre", "1_pre", …, "final_post" (TransformerLens's)."""
    return [f"{L}_pre" for L in range(n_layers)] + ["final_post"]


def injection_ratio(cache, vector, positions, batch: int = 0) -> np.ndarray:
    """‖vector row‖ / ‖stream‖ at each stream M and each position in ``positions``: [n_layers + 1, m].

    ``vector`` is the injected [d_model] or [m, d_model] (coefficient included); rows of streams
    before the injection layer compare it with a stream that does not yet contain it.
    """
    where = whole_numbers(positions, "positions").reshape(-1)  # [m]
    if not len(where):
        raise RefGPTError("positions: none given")
    rows = np.asarray(vector).reshape(-1, np.shape(vector)[-1])  # [m or 1, d_model]
    if len(rows) not in (1, len(where)):
        raise RefGPTError(f"vector has {len(rows)} rows but {len(where)} positions were given")
    every = streams(cache)  # [stream, batch, pos, d_model]
    batch = whole_number(batch, "batch", least=-every.shape[1], below=every.shape[1])
    outside = where[(where >= every.shape[2]) | (where < -every.shape[2])]
    if len(outside):
        raise RefGPTError(f"positions: {int(outside[0])} is outside the cached run's {every.shape[2]} positions")
    stream = every[:, batch][:, where]  # [stream, m, d_model]
    return norm(rows) / norm(stream)  # [stream, m]


def kl_divergence(logits_p, logits_q) -> np.ndarray:
    """KL(p ‖ q) = Σ p·(log p − log q) of the next-token distributions, per position: [..., pos].

    With p the steered run and q the clean one, this is how surprised the clean model would be by
    the steered model's predictions. Zero exactly when the two logits agree up to a constant.
    """
    logits_p, logits_q = np.asarray(logits_p), np.asarray(logits_q)
    if logits_p.shape != logits_q.shape:
        raise RefGPTError(f"kl_divergence: logits of shapes {list(logits_p.shape)} and {list(logits_q.shape)}")
    log_p, log_q = log_softmax(logits_p), log_softmax(logits_q)  # [..., pos, d_vocab]
    kl = np.sum(np.exp(log_p) * (log_p - log_q), axis=-1)  # [..., pos]
    return np.maximum(kl, 0.0)  # [..., pos] rounding can make a true 0 come out as −1e-17
