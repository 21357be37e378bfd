"""JSON the way an oracle must read and write it: every object key once, no NaN/Infinity, bounded
nesting.

Python's ``json`` keeps the last of two equal keys, accepts the non-JSON constants ``NaN`` and
``Infinity``, and answers a deeply nested document with ``RecursionError``. Each is a silent guess
or a traceback; ``loads`` turns all three into a ``RefGPTError`` naming ``where`` (a file, or a
file and a key) and the place in the text. ``dumps`` writes only standard JSON: a non-finite
float (which ``json.dumps`` would print as the non-JSON ``NaN``/``Infinity``) becomes the string
``"nan"``, ``"inf"`` or ``"-inf"``.
"""

from __future__ import annotations

import json
import math

from .errors import RefGPTError


def loads(text: str | bytes, where: str, duplicate=None):
    """Parse ``text`` as strict JSON; any problem is a one-line ``RefGPTError`` naming ``where``.
    ``duplicate(key)``, if given, words the message for a key that appears twice (a tokenizer
    names the token and its line)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise RefGPTError(f"{where}: not valid JSON (not UTF-8 text at byte {error.start})") from None

    def no_duplicates(pairs: list) -> dict:
        seen = {}
        for key, value in pairs:
            if key in seen:
                raise RefGPTError(duplicate(key) if duplicate else f"{where}: key {key!r} appears twice in one JSON object")
            seen[key] = value
        return seen

    def no_constant(name: str):
        raise RefGPTError(f"{where}: {name} is not a JSON number")

    try:
        return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except json.JSONDecodeError as error:
        raise RefGPTError(f"{where}: not valid JSON (line {error.lineno}, column {error.colno}: "
                          f"{error.msg})") from None
    except RecursionError:
        raise RefGPTError(f"{where}: JSON nested too deeply") from None
    except ValueError as error:  # int() of a number with more digits than Python converts
        if isinstance(error, RefGPTError):
            raise
        raise RefGPTError(f"{where}: not valid JSON ({error})") from None


def dumps(value, **options) -> str:
    """``json.dumps`` that never prints NaN or Infinity (see the module docstring)."""
    return json.dumps(_finite(value), allow_nan=False, **options)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0:
        return _finite(value.item())  # a NumPy scalar
    return value
