"""The one exception refgpt raises on bad input.

Every error a user can cause (a broken checkpoint, a bad config, tokens out of range, ...) is a
``RefGPTError``. It subclasses ``ValueError`` so ``except ValueError`` keeps working, and its
message names the file, key, shape or value at fault — never a raw traceback from deep inside.
An activation missing from a cache is reported one way, by ``need``, wherever it is missed.

A value of the wrong *type* (``decode([True])``, a string where a number belongs) raises
``RefGPTTypeError``, which is both a ``RefGPTError`` and a ``TypeError``: ``except RefGPTError``
catches every bad input refgpt refuses, and code written for Python's convention (``except
TypeError``) keeps working. A value of the right type but out of range is a plain ``RefGPTError``
(a ``ValueError``). ``real_number``, ``whole_number`` and ``as_path`` are how the Python API checks
a numeric or path argument; ``size_shown`` is how a number of bytes is printed, everywhere.
``one_line`` is how an error is shown in one line (the CLI's ``refgpt: error: …``, a failed
prompt's record in a sweep).
"""

import math
import numbers


class RefGPTError(ValueError):
    """Bad input to refgpt: the message says which file, key, shape or value is at fault."""


class RefGPTTypeError(RefGPTError, TypeError):
    """Bad input of the wrong type: a RefGPTError (one line on the CLI) and a TypeError."""


def real_number(value, what: str, *, least: float | None = None, above: float | None = None) -> float:
    """``value`` as a finite float, or a RefGPTError naming ``what``: bools and non-numbers are
    type errors; NaN, ±∞, values < ``least`` or ≤ ``above`` are value errors."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RefGPTTypeError(f"{what} must be a number, found {value!r:.60}")
    number = float(value)
    if not math.isfinite(number):
        raise RefGPTError(f"{what} must be a finite number, found {number}")
    if least is not None and not number >= least:
        raise RefGPTError(f"{what} must be ≥ {least:g}, found {number:g}")
    if above is not None and not number > above:
        raise RefGPTError(f"{what} must be > {above:g}, found {number:g}")
    return number


def shown(value, limit: int = 60) -> str:
    """``repr(value)`` on one line (an array's repr spans several), cut to ``limit`` characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def size_shown(nbytes) -> str:
    """A number of bytes in the unit that fits, for people: bytes below 1 KiB ("512 bytes"), else the
    largest of KiB, MiB, GiB, TiB it holds at least one of, to a tenth ("50.8 KiB", "3.2 GiB")."""
    nbytes = int(nbytes)
    if abs(nbytes) < 2**10:
        return f"{nbytes:,} byte{'s' if nbytes != 1 else ''}"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:,.1f} {unit}"


def whole_number(value, what: str, *, least: int | None = None, below: int | None = None) -> int:
    """``value`` as an int, or a RefGPTError naming ``what``: an integer of any kind (Python's, or
    NumPy's at any width) is taken as it is, never truncated or wrapped; a bool, a float (2.0
    included: a position or a count is not a measurement) or a non-number is a type error; a value
    < ``least`` or ≥ ``below`` is a value error."""
    bound = (f" in [{least}, {below})" if least is not None and below is not None
             else f" ≥ {least}" if least is not None else f" < {below}" if below is not None else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise RefGPTTypeError(f"{what} must be a whole number{bound}, found {shown(value)}"
                              + (f" ({type(value).__name__})" if not isinstance(value, (str, float)) else ""))
    number = int(value)
    if (least is not None and number < least) or (below is not None and number >= below):
        raise RefGPTError(f"{what} must be a whole number{bound}, found {number}")
    return number


def whole_numbers(values, what: str):
    """``values`` (a number or an array-like of them) as an int64 array, or a RefGPTError naming
    ``what``: integers only (a float array such as [1.5] is never truncated, a bool is not a
    position), each representable in int64 (a uint64 ≥ 2⁶³ is refused with its own value, never
    wrapped to a negative)."""
    import numpy as np

    try:
        array = np.asarray(values)
    except (ValueError, TypeError, OverflowError) as error:  # ragged, or integers beyond 64 bits
        raise RefGPTError(f"{what}: not an array of whole numbers ({str(error).splitlines()[0][:80]})") from None
    if array.size == 0:
        return array.astype(np.int64)
    if array.dtype == bool or array.dtype.kind not in "iu":
        raise RefGPTTypeError(f"{what} must be whole numbers, found {array.dtype} {shown(array.ravel()[:4].tolist())}")
    if array.dtype.kind == "u" and array.dtype.itemsize == 8 and (array > np.iinfo(np.int64).max).any():
        raise RefGPTError(f"{what}: {int(array[array > np.iinfo(np.int64).max].ravel()[0])} is out of range")
    return array.astype(np.int64)


def one_line(message) -> str:
    """``message`` with every control character (newline, carriage return, …) escaped."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in str(message))


def as_path(value, what: str = "path"):
    """``value`` (a str or os.PathLike) as a Path, or a RefGPTTypeError naming ``what``."""
    import os
    from pathlib import Path

    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise RefGPTTypeError(f"{what} must be a path (str or os.PathLike), found {value!r:.60}")
    return Path(value)


class MissingActivation(RefGPTError, KeyError):
    """An activation the cache does not hold: a KeyError (the cache is a Mapping) and a RefGPTError
    (the CLI prints it on one line)."""

    def __str__(self):
        return str(self.args[0])


def need(cache, name, user=None, hint=None):
    """``cache[name]``, or the one error for a missing activation: who needed it, and how to cache it.

    ``user``: what needed it ("attribute"); ``hint``: how to get it, by default caching every hook
    point. Every reader of a cache that needs an activation asks for it here.
    """
    if name in cache:
        return cache[name]
    who = f"{user}: " if user else ""
    raise MissingActivation(f"{who}the cache has no {name!r}; "
                            f"{hint or 'run_with_cache without names= caches every hook point'}")
