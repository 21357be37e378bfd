"""What a forward pass accepts, TransformerLens's way: text, a list of texts, or token ids.

``model(input, prepend_bos=…, padding_side=…, attention_mask=…)`` reads its input here, before the
forward pass proper (model.py) sees anything:

- **text** (a ``str`` or a list of them) is tokenized by ``model.to_tokens`` — with
  ``<|endoftext|>`` first when ``prepend_bos`` (default ``model.cfg.default_prepend_bos``, True for
  GPT-2 as in TransformerLens), padded on ``padding_side`` (default the tokenizer's, "right");
  the result always has a batch axis.
- **token ids** [pos] or [batch, pos] are checked (integers, inside the vocabulary, within n_ctx);
  [pos] gives unbatched outputs, refgpt's convention.
- **padding**: as in TransformerLens, a mask is used when an ``attention_mask`` is given, when the
  padding side is "left" (the mask is then read off the tokens: leading pad ids are pads), when a
  batch goes into a KV cache (trailing pad ids are pads) or when the KV cache already holds a mask. An all-ones mask is no mask: those inputs take the plain causal
  path, bit for bit. Right padding needs no mask (attention is causal; refgpt/gpt2/padding.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..gpt2 import padding
from ..errors import RefGPTError


@dataclass
class Padding:
    """The padding of one forward pass over ``pos`` new positions (refgpt/gpt2/padding.py)."""

    mask: np.ndarray  # [batch, keys] 1 real, 0 pad: every position so far (cached ones first)
    positions: np.ndarray  # [batch, pos] each new token's position (real tokens before it)
    real: np.ndarray  # [batch, pos] bool: is each new token real?
    score_mask: np.ndarray  # [batch, 1, pos, keys] 0 or −∞, added to the attention scores

    def hook_positions(self) -> np.ndarray:
        """[batch, pos] each new token's position, −1 at a pad: what hooks see as ``hook.positions``."""
        return np.where(self.real, self.positions, -1)

    @classmethod
    def of(cls, mask, pos: int, dtype) -> "Padding":
        start = mask.shape[1] - pos
        return cls(mask, padding.position_ids(mask, start), mask[:, start:] == 1, padding.score_mask(mask, pos, dtype))


def is_text(input) -> bool:
    return isinstance(input, str) or (isinstance(input, (list, tuple)) and len(input) > 0
                                      and all(isinstance(s, str) for s in input))


def resolve_prepend_bos(model, prepend_bos) -> bool:
    """TransformerLens's USE_DEFAULT_VALUE: None means ``model.cfg.default_prepend_bos``."""
    if prepend_bos is None:
        return bool(model.cfg.default_prepend_bos)
    if not isinstance(prepend_bos, (bool, np.bool_)):
        raise RefGPTError(f"prepend_bos must be True, False or None (the model's default), found {prepend_bos!r}")
    return bool(prepend_bos)


def resolve_padding_side(model, padding_side) -> str:
    if padding_side is None:
        if model.tokenizer is None:
            return "right"
        return padding.check_padding_side(model.tokenizer.padding_side, "tokenizer.padding_side")
    return padding.check_padding_side(padding_side)


def tokens_and_padding(model, input, prepend_bos=None, padding_side=None, attention_mask=None, past=None):
    """(tokens int64 [batch, pos], was the input batched, Padding or None) for a forward pass."""
    if is_text(input):
        input = model.to_tokens(input, prepend_bos=prepend_bos, padding_side=padding_side)
    elif isinstance(input, (list, tuple)) and len(input) and any(isinstance(s, str) for s in input):
        raise RefGPTError("input: a list must hold only strings (texts) or only token ids")
    tokens, batched = check_tokens(model.cfg, input, start=past.length if past is not None else 0)
    side = resolve_padding_side(model, padding_side)
    mask = None
    pad = model.tokenizer.pad_token_id if model.tokenizer is not None else None
    if attention_mask is not None:
        mask = padding.check_attention_mask(attention_mask, tokens.shape)
    elif side == "left":
        if pad is None:
            raise RefGPTError("padding_side='left' needs a pad token to find the pads: this model has no "
                              "tokenizer with <|endoftext|>; pass attention_mask= instead")
        mask = padding.attention_mask_from_tokens(tokens, pad, resolve_prepend_bos(model, prepend_bos), "left")
    elif past is not None and pad is not None and tokens.shape[0] > 1:
        # Into a KV cache, right pads would sit between this chunk and the next: mask them, as
        # TransformerLens does (one row alone has no pads: a trailing <|endoftext|> is text).
        mask = padding.attention_mask_from_tokens(tokens, pad, resolve_prepend_bos(model, prepend_bos), "right")
    return tokens, batched, padding_of(model, mask, tokens.shape, past)


def residual_input(model, resid, tokens=None, attention_mask=None, past=None):
    """``start_at_layer``: (stream [batch, pos, d_model], batched, tokens or None, Padding or None).
    The padding then comes from ``attention_mask`` only, as in TransformerLens."""
    array = np.asarray(resid)
    if array.ndim != 3 or array.shape[-1] != model.cfg.d_model or array.dtype != model.dtype:
        raise RefGPTError(f"start_at_layer: input must be the residual stream [batch, pos, d_model={model.cfg.d_model}] "
                          f"in {model.dtype}, found shape {list(array.shape)} {array.dtype}")
    if not np.isfinite(array).all():
        index = [int(i) for i in np.argwhere(~np.isfinite(array))[0]]
        raise RefGPTError(f"start_at_layer: the residual stream given holds {array[tuple(index)]} at index {index}; "
                          "a forward pass needs finite input")
    if tokens is not None:
        tokens, _ = check_tokens(model.cfg, tokens)
        if tokens.shape != array.shape[:2]:
            raise RefGPTError(f"tokens: shape {list(tokens.shape)} does not match the stream's {list(array.shape[:2])}")
    mask = None if attention_mask is None else padding.check_attention_mask(attention_mask, array.shape[:2])
    return array, True, tokens, padding_of(model, mask, array.shape[:2], past)


def check_tokens(cfg, tokens, start=0):
    """Integer tokens [pos] or [batch, pos] → (int64 array [batch, pos], was it batched).
    ``start``: positions already held in a KV cache before these."""
    try:
        array = np.asarray(tokens)
    except (ValueError, TypeError, OverflowError) as error:  # ragged lists, ids beyond int64
        raise RefGPTError(f"tokens: not a rectangular integer array ({str(error).splitlines()[0][:80]})") from None
    if array.size == 0:
        raise RefGPTError(f"tokens: empty sequence (shape {list(array.shape)})")
    if array.dtype == bool or array.dtype.kind not in "iu":
        if array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.round(array)):
            raise RefGPTError(f"tokens: must be an integer array, found {array.dtype} (cast with .astype(int))")
        raise RefGPTError(f"tokens: must be integers, found dtype {array.dtype}")
    if array.ndim not in (1, 2):
        raise RefGPTError(f"tokens: must be [pos] or [batch, pos], found {array.ndim} dimensions {list(array.shape)}")
    batched = array.ndim == 2
    array = array.reshape(-1, array.shape[-1])  # [batch, pos], the ids as given (uint64 ≥ 2⁶³ too)
    bad = np.argwhere((array < 0) | (array >= cfg.d_vocab))
    if len(bad):
        where = tuple(int(i) for i in bad[0]) if batched else int(bad[0][1])
        raise RefGPTError(
            f"tokens: id {int(array[tuple(bad[0])])} at {'index' if batched else 'position'} {where} "
            f"is outside the vocabulary [0, {cfg.d_vocab})"
        )
    array = array.astype(np.int64, copy=False)  # [batch, pos]: every id is now in [0, d_vocab)
    if start + array.shape[1] > cfg.n_ctx:
        held = f" after {start} cached" if start else ""
        raise RefGPTError(f"tokens: {array.shape[1]} positions{held}, but the model has only n_positions={cfg.n_ctx}")
    return array, batched


def padding_of(model, mask, shape, past=None):
    """The Padding of a pass over ``shape`` = [batch, pos] new positions with ``mask`` [batch, pos]
    (or None) after what ``past`` (a KVCache, or None) holds; None when no key is a pad: those
    passes take the plain causal path, bit for bit."""
    if past is not None:
        past.check(*shape)
        if past.mask is None and (mask is None or mask.all()):
            return None
        return Padding.of(past.attention_mask(mask, shape[1]), shape[1], model.dtype)  # mask: [batch, keys]
    if mask is None or mask.all():
        return None
    return Padding.of(mask, shape[1], model.dtype)
