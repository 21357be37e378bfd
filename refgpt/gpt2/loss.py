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
logits' own dtype.
"""

from __future__ import annotations

import numpy as np

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
    dtype, zero at ignored positions.
    """
    keep = targets != IGNORE_INDEX  # [batch, pos]
    count = int(keep.sum())
    shifted = logits - logits.max(axis=-1, keepdims=True)  # [batch, pos, d_vocab] ≤ 0
    exp = np.exp(shifted)  # [batch, pos, d_vocab]
    total = exp.sum(axis=-1, keepdims=True)  # [batch, pos, 1]
    safe = np.where(keep, targets, 0)  # [batch, pos]
    target_shifted = np.take_along_axis(shifted, safe[..., None], axis=-1)  # [batch, pos, 1]
    losses = (np.log(total) - target_shifted)[..., 0]  # [batch, pos]
    loss = losses[keep].sum() / count

    grad = exp  # [batch, pos, d_vocab], reused in place: softmax − onehot, over count
    grad /= total  # [batch, pos, d_vocab] softmax
    b, t = np.nonzero(keep)  # [count] each
    grad[b, t, targets[b, t]] -= 1.0
    grad[~keep] = 0.0
    grad /= count  # [batch, pos, d_vocab]
    return float(loss), grad


def lm_cross_entropy_loss(logits, tokens, attention_mask=None, per_token: bool = False):
    """TransformerLens's ``utils.lm_cross_entropy_loss`` (``model(…, return_type="loss")``): the
    loss of predicting each next token from logits [batch, pos, d_vocab] and tokens [batch, pos].

    ``per_token``: the losses [batch, pos − 1] (position i predicts token i + 1; masked ones 0);
    otherwise their mean, a float. With an ``attention_mask`` a prediction counts only where both
    the position and the next one are real tokens, and the mean is over those.
    """
    shifted = logits[:, :-1] - logits[:, :-1].max(axis=-1, keepdims=True)  # [batch, pos − 1, d_vocab] ≤ 0
    log_total = np.log(np.exp(shifted).sum(axis=-1))  # [batch, pos − 1]
    target_shifted = np.take_along_axis(shifted, np.asarray(tokens)[:, 1:, None], axis=-1)[..., 0]  # [batch, pos − 1]
    losses = log_total - target_shifted  # [batch, pos − 1]
    count = losses.size
    if attention_mask is not None:
        counted = np.logical_and(attention_mask[:, :-1], attention_mask[:, 1:])  # [batch, pos − 1]
        losses = np.where(counted, losses, 0.0).astype(logits.dtype)  # [batch, pos − 1]
        count = int(counted.sum())
    if per_token:
        return losses
    return losses.sum() / count


def lm_cross_entropy_loss_backward(logits, tokens, grad_loss, attention_mask=None, per_token: bool = False):
    """∂metric/∂logits [batch, pos, d_vocab] from ``grad_loss`` = ∂metric/∂(``lm_cross_entropy_loss``'s
    output): a number for the mean loss, [batch, pos − 1] with ``per_token``. Each counted
    prediction's loss has gradient softmax(logits[:, i]) − onehot(tokens[:, i + 1]) at position i;
    the last position, and predictions the ``attention_mask`` does not count, get 0."""
    batch, pos, _ = logits.shape
    count = batch * (pos - 1)
    counted = np.ones((batch, pos - 1), dtype=bool)  # [batch, pos − 1]
    if attention_mask is not None:
        counted = np.logical_and(attention_mask[:, :-1], attention_mask[:, 1:])  # [batch, pos − 1]
        count = int(counted.sum())
    weight = np.asarray(grad_loss, dtype=logits.dtype)  # [] or [batch, pos − 1]
    weight = np.where(counted, weight if per_token else weight / count, 0).astype(logits.dtype)  # [batch, pos − 1]
    shifted = logits[:, :-1] - logits[:, :-1].max(axis=-1, keepdims=True)  # [batch, pos − 1, d_vocab] ≤ 0
    probs = np.exp(shifted)  # [batch, pos − 1, d_vocab]
    probs /= probs.sum(axis=-1, keepdims=True)  # softmax
    grad = np.zeros_like(logits)  # [batch, pos, d_vocab]; the last position predicts nothing
    grad[:, :-1] = probs * weight[..., None]  # [batch, pos − 1, d_vocab]
    b, i = np.indices((batch, pos - 1))  # [batch, pos − 1] each
    grad[b, i, np.asarray(tokens)[:, 1:]] -= weight  # − onehot(next token), weighted
    return grad
