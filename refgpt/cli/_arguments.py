"""What the subcommands' arguments mean, beyond TEXT: numbers, and tokens.

A TOKEN argument (``--target``, ``--against``) is text the tokenizer encodes as exactly one token,
or ``#ID`` for the token with that id; ``--NAME-id ID`` is the same by id alone. Every
subcommand that takes a token reads it here (``add_token_argument``, ``token_argument``).
"""

from __future__ import annotations

import argparse
import math
import re

from ..tl.decomposition import token_id
from ..errors import RefGPTError


def _whole(text: str, least: int) -> int:
    if not re.fullmatch(r"\s*\+?\d+\s*", text, re.ASCII) or int(text) < least:
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ {least}, found {text!r}")
    return int(text)


def positive_int(text: str) -> int:
    """argparse type: a whole number ≥ 1."""
    return _whole(text, 1)


def count(text: str) -> int:
    """argparse type: a whole number ≥ 0."""
    return _whole(text, 0)


def finite_float(text: str) -> float:
    """argparse type: a finite number (not nan, not inf)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, found {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite number ≥ 0."""
    value = finite_float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number ≥ 0, found {text!r}")
    return value


def index_list(text: str) -> list[int]:
    """argparse type: "0,3,5-7" → [0, 3, 5, 6, 7]."""
    out = []
    try:
        for part in text.split(","):
            a, _, b = part.strip().partition("-")
            out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list like 0,3,5-7") from None
    return out


def add_token_argument(p, name: str, help: str):
    """``--NAME TOKEN`` (text that is one token, or #ID) and ``--NAME-id ID``."""
    p.add_argument(f"--{name}", metavar="TOKEN", help=f"{help}: text that is one token, or #ID")
    p.add_argument(f"--{name}-id", type=int, metavar="ID", help="the same, by token id")


def token_argument(model, args, name: str) -> int | None:
    """The token id ``--NAME`` (text or #ID) or ``--NAME-id`` gives; None when neither is given."""
    text, number = getattr(args, name), getattr(args, f"{name}_id")
    if text is not None and number is not None:
        args.usage_error(f"give --{name} or --{name}-id, not both")
    if text is not None and text.startswith("#") and len(text) > 1:
        try:
            number = int(text[1:])
        except ValueError:
            raise RefGPTError(f"--{name}: {text!r} is not #ID with an integer ID") from None
    elif text is not None:
        return token_id(model, text, f"--{name}")
    if number is not None and not 0 <= number < model.cfg.d_vocab:
        raise RefGPTError(f"--{name}: id {number} is outside the vocabulary [0, {model.cfg.d_vocab})")
    return number
