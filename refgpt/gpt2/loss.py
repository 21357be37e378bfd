"""The language-modelling loss: mean cross-entropy of the next token, and its gradient, fused.

For one position with logits ℓ ∈ ℝⱽ and target token t, the loss is the negative log-probability
the model gave t:

    loss = −log softmax(ℓ)[t] = logsumexp(ℓ) − ℓ[t]
    ∂loss/∂ℓ = softmax(ℓ) − onehot(t)

The gradient is that simple only because softmax and the log cancel (docs/backward.md §5): which
is why every trainer fuses the two into one op. The model's loss is the mean over every position
that has a target, as HF's ``GPT2LMHeadModel(labels=…)``, torch's ``cross_entropy`` and llm.c
compute it, so each position's gradient is also divided by that count.

Targets are token ids [batch, pos], one per position of the logits, or ``IGNORE_INDEX`` (−100,
as torch and HF) where a position has none. ``next_token_targets(tokens)`` is HF's shift: the
target at position i is token i + 1, and the last position has none.

Numerics: logsumexp is computed as max + log Σ exp(ℓ − max), so exp never overflows, in the
logits' own dtype. Each position's loss reads only its own row of logits: both functions go a block
of positions at a time, on the BLAS's threads (refgpt/threads.py), and never hold more than a block
of exp(ℓ − max) beside the logits.
"""

from __future__ import annotations

import numpy as np

from .. import threads
from ..errors import RefGPTError

IGNORE_INDEX = -100


def next_token_targets(tokens) -> np.ndarray:
    """HF's shift: targets[:, i] = tokens[:, i + 1], and IGNORE_INDEX at the last position."""
    tokens = np.asarray(tokens)  # [batch, pos]
    targets = np.full(tokens.shape, IGNORE_INDEX, dtype=np.int64)  # [batch, pos]
    targets[:, :-1] = tokens[:, 1:]
    return targets


def check_targets(targets, shape, d_vocab) -> np.ndarray:
    """``targets`` as int64 [batch, pos], checked against the logits' [batch, pos] and vocabulary."""
    array = np.asarray(targets)
    if array.dtype == bool or array.dtype.kind not in "iu":
        raise RefGPTError(f"targets: must be integers, found dtype {array.dtype}")
    if array.ndim == 1 and len(shape) == 2 and shape[0] == 1:
        array = array[None]  # [1, pos]
    if array.shape != tuple(shape):
        raise RefGPTError(f"targets: shape {list(array.shape)}, expected {list(shape)} (one per input token)")
    array = array.astype(np.int64, copy=False)
    bad = np.argwhere((array != IGNORE_INDEX) & ((array < 0) | (array >= d_vocab)))
    if len(bad):
        where = tuple(int(i) for i in bad[0])
        raise RefGPTError(f"targets: id {int(array[where])} at index {where} is outside the vocabulary "
                          f"[0, {d_vocab}) and is not the ignore value {IGNORE_INDEX}")
    if not (array != IGNORE_INDEX).any():
        raise RefGPTError(f"targets: every position is {IGNORE_INDEX} (ignored): there is no loss to take")
    return array


def softmax_cross_entropy(logits, targets):
    """(mean loss, ∂loss/∂logits) for logits [batch, pos, d_vocab] and checked targets [batch, pos].

    The loss is a Python float (the logits' dtype, rounded once); the gradient is in the logits'
    dtype, zero at ignored positions. Position by position (each row's max and sum are its own),
    a block of rows at a time on the threads (refgpt/threads.py).
    """
    keep = targets != IGNORE_INDEX  # [batch, pos]
    count = int(keep.sum())
    vocab = logits.shape[-1]
    rows, keep_rows = threads.rows(logits), keep.reshape(-1)  # [batch·pos, d_vocab] (a copy if not C-contiguous), [batch·pos]
    target_rows = np.where(keep, targets, 0).reshape(-1)  # [batch·pos]
    losses = np.empty(len(rows), logits.dtype)  # [batch·pos]
    out = np.empty(logits.shape, logits.dtype)  # [batch, pos, d_vocab]: softmax − onehot, over count
    out_rows = out.reshape(-1, vocab)  # [batch·pos, d_vocab]

    def block(a, b):
        grad, here = out_rows[a:b], np.arange(b - a)  # [block, d_vocab], [block]
        np.subtract(rows[a:b], rows[a:b].max(axis=-1, keepdims=True), out=grad)  # [block, d_vocab] ≤ 0, shifted
        target_shifted = grad[here, target_rows[a:b]]  # [block]
        np.exp(grad, out=grad)  # [block, d_vocab]
        total = grad.sum(axis=-1, keepdims=True)  # [block, 1]
        losses[a:b] = np.log(total)[:, 0] - target_shifted  # [block]
        grad /= total  # [block, d_vocab] softmax
        kept = keep_rows[a:b]  # [block]
        grad[here[kept], target_rows[a:b][kept]] -= 1.0
        grad[~kept] = 0.0
        grad /= count  # [block, d_vocab]

    threads.for_rows(block, len(rows), vocab * logits.itemsize)
    loss = losses.reshape(keep.shape)[keep].sum() / count
    return float(loss), out


def lm_cross_entropy_loss(logits, tokens, attention_mask=None, per_token: bool = False):
    """TransformerLens's ``utils.lm_cross_entropy_loss`` (``model(…, return_type="loss")``): the
    loss of predicting each next token from logits [batch, pos, d_vocab] and tokens [batch, pos].

    ``per_token``: the losses [batch, pos − 1] (position i predicts token i + 1; masked ones 0);
    otherwise their mean, a float. With an ``attention_mask`` a prediction counts only where both
    the position and the next one are real tokens, and the mean is over those.
    """
    tokens = np.asarray(tokens)
    batch, pos, vocab = logits.shape
    losses = np.empty((batch, max(0, pos - 1)), logits.dtype)  # [batch, pos − 1]

    def block(row, a, b):  # predictions a … b − 1 of batch row ``row``
        x = logits[row, a:b]  # [block, d_vocab]
        shifted = x - x.max(axis=-1, keepdims=True)  # [block, d_vocab] ≤ 0
        log_total = np.log(np.exp(shifted).sum(axis=-1))  # [block]
        losses[row, a:b] = log_total - shifted[np.arange(b - a), tokens[row, a + 1:b + 1]]  # [block]

    blocks = [(row, a, b) for row in range(batch) for a, b in threads.row_blocks(pos - 1, vocab * logits.itemsize)]
    threads.map_blocks(block, blocks, batch * (pos - 1) * vocab * logits.itemsize)  # position by position, on the threads
    count = losses.size
    if attention_mask is not None:
        counted = np.logical_and(attention_mask[:, :-1], attention_mask[:, 1:])  # [batch, pos − 1]
        losses = np.where(counted, losses, 0.0).astype(logits.dtype)  # [batch, pos − 1]
        count = int(counted.sum())
    if per_token:
        return losses
    return losses.sum() / count
