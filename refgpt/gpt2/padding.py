"""Padding: running sequences of different lengths as one [batch, pos] array, exactly.

A batch of prompts of different lengths is made rectangular with pad tokens (GPT-2 pads with
``<|endoftext|>``). On the **right** nothing more is needed: attention is causal, so a real
token never sees the pads after it, and its position is its index. On the **left** the pads
come first, so two things must change for the real tokens to be computed exactly as if their
row were run alone:

1. **Positions start at the first real token.** A row ``[pad, pad, t0, t1]`` uses W_pos[0],
   W_pos[1] for t0, t1: the position of a token is the number of real tokens before it
   (``cumsum(mask) − 1``). Pads get a zero position embedding (TransformerLens's choice; no real
   token ever reads them).
2. **Nobody attends to a pad.** The attention ``mask`` [batch, key] (1 real, 0 pad) adds −∞ to
   the scores of pad keys, on top of the causal −∞. A pad *query* at the start of a row then
   sees no key at all; its pattern row is all zeros (softmax of all −∞ is NaN, set to 0, as
   TransformerLens does), so its z is 0.

That is TransformerLens's and HF's scheme (``get_attention_mask``, ``get_offset_position_ids``),
and it makes padding invisible: each row of a padded batch equals that row run alone, to
rounding (tests/core/test_padding.py). Without a mask refgpt runs the plain causal pass, the
same numbers bit for bit as before padding existed.
"""

from __future__ import annotations

import numpy as np

from ..errors import RefGPTError

PADDING_SIDES = ("left", "right")


def pad_rows(rows, side: str, pad_id: int):
    """(tokens [batch, pos], attention mask [batch, pos] or None): a list of rows of token ids of any
    lengths made one array, padded with ``pad_id`` on ``side`` ("left" or "right"); a mask (1 real,
    0 pad) only where some row is shorter than the longest. An array (one sequence [pos], or a
    batch) comes back as it is, without a mask."""
    if isinstance(rows, np.ndarray):
        return rows, None
    rows = [np.asarray(r, np.int64).reshape(-1) for r in rows]  # [pos_b] each
    T = max((len(r) for r in rows), default=0)
    if all(len(r) == T for r in rows):
        return np.stack(rows) if rows else np.zeros((0, 0), np.int64), None  # [batch, pos]
    out = np.full((len(rows), T), pad_id, np.int64)  # [batch, pos]
    mask = np.zeros((len(rows), T), np.int64)  # [batch, pos]
    for b, r in enumerate(rows):
        at = slice(T - len(r), T) if side == "left" else slice(0, len(r))
        out[b, at], mask[b, at] = r, 1
    return out, mask


def check_padding_side(side, what="padding_side") -> str:
    if side not in PADDING_SIDES:
        raise RefGPTError(f"{what} must be 'left' or 'right', found {side!r}")
    return side


def attention_mask_from_tokens(tokens, pad_token_id, prepend_bos: bool, padding_side: str) -> np.ndarray:
    """TransformerLens's ``utils.get_attention_mask``: 1 for real tokens, 0 for the pads.

    Only the pads at the padded end count: leading pad ids with ``padding_side="left"``, trailing
    ones with ``"right"``; a pad id inside the text is text. With ``prepend_bos`` and BOS == pad
    (GPT-2: both ``<|endoftext|>``) the last leading "pad" of a left-padded row is its BOS, real.
    """
    tokens = np.asarray(tokens)  # [batch, pos]
    mask = np.ones(tokens.shape, dtype=np.int64)  # [batch, pos]
    if pad_token_id is None:
        return mask
    check_padding_side(padding_side)
    not_pad = tokens != pad_token_id  # [batch, pos]
    if padding_side == "right":
        trailing = np.cumsum(not_pad[:, ::-1], axis=1)[:, ::-1] == 0  # [batch, pos]
        mask[trailing] = 0
    else:
        leading = np.cumsum(not_pad, axis=1) == 0  # [batch, pos]
        mask[leading] = 0
        if prepend_bos:
            bos_at = leading.sum(axis=1) - 1  # [batch]; −1 (a row of text only) indexes no pad
            rows = np.nonzero(bos_at >= 0)[0]
            mask[rows, bos_at[rows]] = 1
    return mask


def check_attention_mask(mask, shape) -> np.ndarray:
    """A user's attention mask → int64 [batch, pos] of 0/1, or a RefGPTError naming the fault."""
    array = np.asarray(mask)
    if array.ndim == 1:
        array = array[None]
    if tuple(array.shape) != tuple(shape):
        raise RefGPTError(f"attention_mask: shape {list(array.shape)} does not match tokens {list(shape)}")
    if array.dtype != bool and array.dtype.kind not in "iuf":
        raise RefGPTError(f"attention_mask: must be numbers (0 pad, 1 real token), found dtype {array.dtype}")
    if not np.isin(array, (0, 1)).all():
        bad = array[~np.isin(array, (0, 1))].reshape(-1)[0]
        raise RefGPTError(f"attention_mask: must hold only 0 (pad) and 1 (real token), found {bad.item()!r}")
    return array.astype(np.int64)


def position_ids(mask, start: int = 0) -> np.ndarray:
    """Each token's position: the real tokens before it in its row (pads: 0). ``mask`` covers every
    position so far [batch, start + pos]; the result covers the new ones [batch, pos]."""
    shifted = np.cumsum(mask, axis=1) - 1  # [batch, start + pos]
    return np.maximum(shifted, 0)[:, start:]  # [batch, pos]


def score_mask(mask, queries: int, dtype) -> np.ndarray:
    """The score mask for ``queries`` new positions against every key so far:
    causal −∞ above the diagonal and −∞ on pad keys. ``mask`` [batch, keys] → [batch, 1, query, key]."""
    keys = mask.shape[1]
    start = keys - queries
    causal = np.triu(np.full((queries, keys), -np.inf, dtype=dtype), k=start + 1)  # [query, key]
    pads = np.where(mask[:, None, None, :] == 0, -np.inf, 0.0).astype(dtype)  # [batch, 1, 1, key]
    return causal + pads  # [batch, 1, query, key]
