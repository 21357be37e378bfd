"""Text in, text out, under TransformerLens's names and meanings (``HookedTransformer`` for GPT-2).

    model.to_tokens("Hello")                    → [[50256, 15496]]  [batch, pos], <|endoftext|> first
    model.to_tokens(["a", "b c"])               → [batch, pos], padded with <|endoftext|> on the right
    model.to_string(tokens)                     → a str for [pos], a list of str for [batch, pos]
    model.to_str_tokens("Hello")                → ["<|endoftext|>", "Hello"]
    model.to_single_token(" be")                → 307 (a RefGPTError unless exactly one token)
    model.get_token_position(" be", "To be")    → 2 (with the BOS at 0)

``prepend_bos`` defaults to ``model.cfg.default_prepend_bos`` (True when the vocabulary has
``<|endoftext|>``, as TransformerLens sets it for GPT-2) and ``padding_side`` to
``model.tokenizer.padding_side`` ("right"). ``<|endoftext|>`` written in the text is the special
token, as HF's tokenizer reads it. Where TransformerLens asserts, refgpt raises ``RefGPTError``.
These are methods of ``Model`` (a mixin, so model.py stays the forward pass).
"""

from __future__ import annotations

import numpy as np

from ..errors import RefGPTError, RefGPTTypeError
from ..gpt2.padding import check_padding_side, pad_rows


class TextMethods:
    """TransformerLens's tokenizer-facing methods; needs ``self.tokenizer`` and ``self.cfg``."""

    def to_tokens(self, input, prepend_bos=None, padding_side=None, move_to_device: bool = True,
                  truncate: bool = True) -> np.ndarray:
        """Text or a list of texts → token ids int64 [batch, pos] (TransformerLens's ``to_tokens``).

        ``prepend_bos``: put ``<|endoftext|>`` first (None: ``cfg.default_prepend_bos``).
        ``padding_side``: where a shorter text is padded with ``<|endoftext|>`` (None: the
        tokenizer's, "right"). ``truncate``: keep at most n_ctx tokens of each text (the first
        ones, as HF truncates). ``move_to_device`` is accepted and means nothing (NumPy is on the CPU).
        """
        from .inputs import resolve_prepend_bos

        tok = self._need_tokenizer()
        texts = [input] if isinstance(input, str) else input
        if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
            raise RefGPTError(f"to_tokens: input must be a str or a non-empty list of str, found {type(input).__name__}")
        bos = resolve_prepend_bos(self, prepend_bos)
        side = check_padding_side(tok.padding_side if padding_side is None else padding_side)
        if bos and tok.bos_token_id is None:
            raise RefGPTError("to_tokens: prepend_bos=True, but the vocabulary has no <|endoftext|> "
                              "(pass prepend_bos=False, or set model.cfg.default_prepend_bos = False)")
        rows = [([tok.bos_token_id] if bos else []) + tok.encode(t, allowed_special="all") for t in texts]
        if truncate:
            rows = [r[:self.cfg.n_ctx] for r in rows]
        width = max(len(r) for r in rows)
        if any(len(r) < width for r in rows) and tok.pad_token_id is None:
            raise RefGPTError("to_tokens: texts of different lengths need a pad token, and the vocabulary has no <|endoftext|>")
        return pad_rows(rows, side, tok.pad_token_id if tok.pad_token_id is not None else 0)[0]  # [batch, pos]

    def to_string(self, tokens):
        """Token ids → text: a str for [pos] (or one id), a list of str for [batch, pos]."""
        tok = self._need_tokenizer()
        array = _ids(tokens, "to_string")
        if array.ndim == 2:
            return [tok.decode(row.tolist()) for row in array]
        if array.ndim > 2:
            raise RefGPTError(f"to_string: tokens must be [pos] or [batch, pos], found shape {list(array.shape)}")
        return tok.decode(array.reshape(-1).tolist())

    def to_str_tokens(self, input, prepend_bos=None, padding_side=None):
        """Each token as its text: a list of str for a text or ids [pos] / [1, pos]; a list of
        lists for a list of texts (each tokenized on its own, unpadded)."""
        tok = self._need_tokenizer()
        if isinstance(input, list) and input and all(isinstance(t, str) for t in input):
            return [self.to_str_tokens(t, prepend_bos, padding_side) for t in input]
        if isinstance(input, str):
            ids = self.to_tokens(input, prepend_bos=prepend_bos, padding_side=padding_side)[0]
        else:
            ids = np.squeeze(_ids(input, "to_str_tokens"))
            ids = ids.reshape(1) if ids.ndim == 0 else ids
            if ids.ndim != 1:
                raise RefGPTError(f"to_str_tokens: tokens must be [pos] or [1, pos], found shape {list(np.shape(input))}")
        return [tok.decode([int(i)]) for i in ids]

    def to_single_token(self, string: str) -> int:
        """The id of a text that is exactly one token (no BOS); RefGPTError otherwise."""
        ids = self.to_tokens(string, prepend_bos=False)[0]
        if len(ids) != 1:
            raise RefGPTError(f"to_single_token: {string!r} is {len(ids)} tokens, not one")
        return int(ids[0])

    def to_single_str_token(self, int_token: int) -> str:
        """The text of one token id."""
        if isinstance(int_token, bool) or not isinstance(int_token, (int, np.integer)):
            raise RefGPTError(f"to_single_str_token: expected an int token id, found {int_token!r}")
        return self.to_str_tokens(np.array([int_token]))[0]

    def get_token_position(self, single_token, input, mode: str = "first", prepend_bos=None, padding_side=None) -> int:
        """Where ``single_token`` (an id, or text that is one token) first (``mode="first"``) or
        last (``"last"``) occurs in ``input`` (text, or ids [pos] / [1, pos])."""
        if isinstance(input, str):
            ids = self.to_tokens(input, prepend_bos=prepend_bos, padding_side=padding_side)
        else:
            ids = _ids(input, "get_token_position")
        if ids.ndim == 2:
            if ids.shape[0] != 1:
                raise RefGPTError(f"get_token_position: tokens of rank 2 must be [1, pos], found {list(ids.shape)}")
            ids = ids[0]
        token = self.to_single_token(single_token) if isinstance(single_token, str) else int(single_token)
        where = np.nonzero(ids == token)[0]
        if len(where) == 0:
            raise RefGPTError(f"get_token_position: token {token} does not occur in the input")
        if mode not in ("first", "last"):
            raise RefGPTError(f"get_token_position: mode must be 'first' or 'last', not {mode!r}")
        return int(where[0] if mode == "first" else where[-1])

    def _need_tokenizer(self):
        if self.tokenizer is None:
            where = f" in {self.source}" if self.source else ""
            raise RefGPTError(f"this model has no tokenizer: no vocab.json + merges.txt{where}")
        return self.tokenizer


def _ids(tokens, what) -> np.ndarray:
    if hasattr(tokens, "detach"):  # a torch tensor, as TransformerLens users have them
        tokens = tokens.detach().cpu().numpy()
    try:
        array = np.asarray(tokens)
    except (ValueError, TypeError, OverflowError) as error:  # ragged lists, ids beyond int64
        raise RefGPTError(f"{what}: not a rectangular integer array ({str(error).splitlines()[0][:80]})") from None
    if array.size and (array.dtype == bool or array.dtype.kind not in "iu"):
        raise RefGPTTypeError(f"{what}: token ids must be integers, found dtype {array.dtype}")
    return array.astype(np.int64)
