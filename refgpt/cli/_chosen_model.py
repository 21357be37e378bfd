"""The model a subcommand runs on, and the text it reads: what ``--model``, ``--dtype`` and TEXT mean.

Every subcommand takes ``--model DIR`` or a hub name such as ``--model gpt2`` (refgpt.files.hub.resolve;
default: the embedded model, ``refgpt.default_model_path()``)
and ``--dtype float64|float32``. A model directory carrying an ``UNTRAINED`` marker (a random
initialisation, as the embedded default was before it was trained) gets a warning in everything a
command prints: :func:`untrained_note` for tables, ``"untrained": true`` in JSON. Every answer
starts the same way: :func:`header` for tables, :func:`print_json` for ``--json``.
"""

from __future__ import annotations

import numpy as np

from .. import strict_json
from ..files.checkpoint import load
from ..dtypes import COMPUTE_DTYPES
from ..files.default_model import default_model_path, is_untrained
from ..errors import RefGPTError
from ._output import shown


def add_text_arguments(p):
    """TEXT and --bos, as every text-reading subcommand takes them."""
    p.add_argument("text", metavar="TEXT", help="the text to run (put -- before TEXT if it starts with -)")
    p.add_argument("--bos", action="store_true", help="put <|endoftext|> before the text, as GPT-2 saw "
                   "documents start in training (needed to run on empty TEXT)")


def load_chosen(args):
    """The model ``--model`` names (default: the embedded one) in ``--dtype``, with its tokenizer."""
    if args.dtype not in COMPUTE_DTYPES:
        args.usage_error(f"argument --dtype: invalid choice: {args.dtype!r} (choose from "
                         f"{', '.join(map(repr, COMPUTE_DTYPES))})")
    return load(args.model if args.model is not None else default_model_path(), dtype=args.dtype)


def untrained_note(model) -> str | None:
    """The warning a table starts with when the model is UNTRAINED, else None."""
    if not is_untrained(model.source):
        return None
    return ("UNTRAINED MODEL: a seeded, randomly initialised GPT-2, so its predictions are noise.\n"
            "For GPT-2 itself, pass --model gpt2 (see the README: refgpt download gpt2).")


def tokens_of(model, args) -> np.ndarray:
    """TEXT (after <|endoftext|> with --bos) as token ids [pos], checked against the context length."""
    tokens = model.to_tokens(args.text, prepend_bos=args.bos, truncate=False)[0]  # [pos]: the CLI adds no BOS unless --bos
    if len(tokens) == 0:
        raise RefGPTError("TEXT is empty: there is nothing to run (add --bos to start from <|endoftext|>)")
    if len(tokens) > model.cfg.n_ctx:
        raise RefGPTError(f"TEXT is {len(tokens)} tokens long, but the model's context holds at most "
                          f"{model.cfg.n_ctx} (n_positions in {model.source / 'config.json'})")
    return tokens


def text_line(args, tokens) -> str:
    """The header line that says what was run: TEXT and its token count."""
    n = len(tokens)
    bos = " (<|endoftext|> first)" if args.bos else ""
    return f"text:  {shown(args.text)} = {n} token{'s' if n != 1 else ''}{bos}"


def token_text(model, token_id) -> str:
    """One token as the tables show it: repr() of its text, or of its bytes if they are not whole UTF-8."""
    raw = model.tokenizer.decode_bytes([int(token_id)])
    try:
        return shown(raw.decode("utf-8"))
    except UnicodeDecodeError:  # one byte of a multi-byte character, e.g. b'\xe2'
        return repr(raw)


def token_json(model, token_id) -> dict:
    """One token for --json: its id, its text (U+FFFD for a partial character) and its bytes in hex."""
    raw = model.tokenizer.decode_bytes([int(token_id)])
    return {"id": int(token_id), "text": raw.decode("utf-8", errors="replace"), "bytes": raw.hex()}


def model_json(model) -> dict:
    """Which model produced a --json answer, and whether it is UNTRAINED."""
    return {"model": str(model.source), "untrained": is_untrained(model.source), "dtype": model.dtype.name}


def header(model, args=None, tokens=None, detail="") -> list[str]:
    """The lines a table answer starts with: the UNTRAINED warning (if any), the model, TEXT."""
    note = untrained_note(model)
    return [*([note, ""] if note else []), f"model: {model.source} ({model.dtype.name}{detail})",
            *([text_line(args, tokens)] if tokens is not None else [])]


def print_json(model, answer: dict) -> int:
    """Print a --json answer: which model (``model_json``), then ``answer``; exit status 0."""
    print(strict_json.dumps({**model_json(model), **answer}, indent=2))
    return 0
