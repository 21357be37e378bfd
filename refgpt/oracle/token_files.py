"""Where a golden's tokens come from, other than TEXT: token files, and the tokenizer an llm.c
checkpoint lacks (``refgpt golden --tokens FILE``, ``--tokenizer PATH``).

``read_tokens(path)`` reads ids from: a ``.npy`` integer array [pos] or [batch, pos]; text with
whitespace-separated ids, one sequence per line (lines of different lengths: a list of rows with
``ragged``, for a padded batch); an llm.c debug state or refgpt llm.c dump (x and its targets y);
an llm.c data shard (the first ``shape`` B,T batch, as llm.c's dataloader reads it); or raw
little-endian ids of a ``RAW_TOKEN_DTYPES`` type. ``with_tokenizer(model, path)`` gives a model
the tokenizer of a directory (vocab.json + merges.txt), or returns llm.c's ``gpt2_tokenizer.bin``,
which only decodes. ``pad_token_id(model)`` is the id a golden's batch is padded with.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..errors import RefGPTError
from ..gpt2.tokenizer import Tokenizer
from . import llmc, llmc_dump


def pad_token_id(model) -> int:
    """The id a padded golden's pads hold: the tokenizer's pad token (<|endoftext|>), or 0 without one."""
    t = model.tokenizer
    return int(t.pad_token_id) if t is not None and t.pad_token_id is not None else 0


def with_tokenizer(model, path):
    """Give ``model`` the tokenizer at ``path`` (a directory with vocab.json and merges.txt), or
    return llm.c's tokenizer file there (it names tokens, it cannot encode); None when ``path`` is a
    directory."""
    t = Path(path)
    if t.is_dir():
        model.tokenizer = Tokenizer.from_dir(t)
        return None
    if not t.is_file():
        raise RefGPTError(f"{t}: tokenizer not found")
    llmc_tokenizer = llmc.read_tokenizer(t)
    if len(llmc_tokenizer.tokens) != model.cfg.d_vocab:
        raise RefGPTError(f"{t}: {len(llmc_tokenizer.tokens)} tokens, the model's vocabulary has {model.cfg.d_vocab}")
    return llmc_tokenizer


RAW_TOKEN_DTYPES = {"int32": "<i4", "uint16": "<u2", "int64": "<i8", "uint32": "<u4"}


def read_tokens(path, dtype=None, shape=None, cfg=None, ragged=False):
    """(tokens, targets or None, where they came from) from a token file (module docstring); with
    ``ragged``, a text file's lines of different lengths come back as a list of rows."""
    path = Path(path)
    if not path.is_file():
        raise RefGPTError(f"{path}: token file not found")
    if dtype is not None:
        return _raw_tokens(path, dtype, shape), None, f"raw {dtype} ids from {path}"
    magic = llmc_dump.file_magic(path) if path.suffix != ".npy" else None
    if shape is not None and magic != llmc.SHARD_MAGIC:  # refused, not ignored: the file holds its own shape
        raise RefGPTError(f"{path}: --tokens-shape B,T is for raw ids (--tokens-dtype) and llm.c data shards; "
                          f"this file's ids come in the shape it holds")
    if magic == llmc.STATE_MAGIC:
        s = llmc.read_debug_state(path, cfg.d_vocab, cfg)
        return s.x, s.y, f"x [B, T] = {list(s.x.shape)} and its targets y of llm.c's debug state {path}"
    if magic == llmc_dump.DUMP_MAGIC:
        d = llmc_dump.read_dump(path, cfg)
        return d["tokens"], d.get("targets"), f"the tokens{' and targets' if 'targets' in d else ''} of the dump {path}"
    if magic == llmc.SHARD_MAGIC:
        B, T = shape if shape is not None else (1, min(cfg.n_ctx, 64))
        x, y = llmc.read_data_shard(path, B, T)
        return x, y, f"llm.c's first batch B×T = {B}×{T} of the data shard {path}: x and targets y (B·T + 1 tokens)"
    if magic in (llmc.MODEL_MAGIC, llmc.TOKENIZER_MAGIC):
        raise RefGPTError(f"{path}: {llmc._WHAT[magic]}, not tokens"
                          f"{': pass it as --model' if magic == llmc.MODEL_MAGIC else ': pass it as --tokenizer'}")
    return _text_or_npy_tokens(path, ragged), None, f"{path}"


def _raw_tokens(path, dtype, shape):
    itemsize = np.dtype(RAW_TOKEN_DTYPES[dtype]).itemsize
    size = path.stat().st_size
    if size == 0 or size % itemsize:
        raise RefGPTError(f"{path}: {size} bytes is not a whole number of {dtype} ids ({itemsize} bytes each)")
    ids = np.fromfile(path, dtype=RAW_TOKEN_DTYPES[dtype]).astype(np.int64)  # [n]
    if shape is None:
        return ids
    if ids.size != shape[0] * shape[1]:
        raise RefGPTError(f"{path}: {ids.size} {dtype} ids, but --tokens-shape {shape[0]},{shape[1]} needs "
                          f"{shape[0] * shape[1]}")
    return ids.reshape(shape)


def _text_or_npy_tokens(path, ragged=False):
    """Token ids from a .npy file or from text: whitespace-separated whole numbers in ASCII digits
    (not "١", "²" or "1_000", which Python's int() would take), one sequence per line."""
    if path.suffix == ".npy":
        try:
            tokens = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as error:
            raise RefGPTError(f"{path}: not a readable .npy file ({str(error).splitlines()[0] if str(error) else 'truncated'})") from None
        if tokens.dtype == bool or tokens.dtype.kind not in "iu":
            raise RefGPTError(f"{path}: token ids must be integers, found {tokens.dtype}")
        return tokens
    try:
        text = path.read_text(encoding="utf-8")
        if "\x00" in text:
            raise UnicodeDecodeError("utf-8", b"\x00", 0, 1, "NUL byte")
    except UnicodeDecodeError:
        raise RefGPTError(f"{path}: a binary file, not text ids: give --tokens-dtype int32|uint16 for raw ids, "
                          f"or an llm.c debug state, data shard or dump, or a .npy array") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words:
            continue
        bad = next((w for w in words if not re.fullmatch(r"[0-9]{1,18}", w)), None)
        if bad is not None:
            raise RefGPTError(f"{path}, line {n}: {bad!r:.40} is not an integer token id")
        rows.append([int(word) for word in words])
    if not rows:
        raise RefGPTError(f"{path}: no token ids")
    if len({len(r) for r in rows}) != 1:
        if ragged:
            return [np.array(r, dtype=np.int64) for r in rows]
        raise RefGPTError(f"{path}: sequences have different lengths {sorted({len(r) for r in rows})}; "
                          "a batch needs one length, or --padding-side left|right to pad them")
    return np.array(rows if len(rows) > 1 else rows[0], dtype=np.int64)
