"""TransformerLens's errors, from refgpt's: where TransformerLens asserts, the torch-facing model's
refusal is also an AssertionError.

refgpt refuses bad input with a RefGPTError (a ValueError) naming what is at fault; TransformerLens
``assert``s. TransformerLens code — its own tests, a user's ``except AssertionError`` — should see
the error it expects, and refgpt's code should see its own. So at the torch-facing model's
boundary a RefGPTError leaves as ``TLAssertionError``, which is both (as RefGPTTypeError is both a
RefGPTError and a TypeError): same message, ``except RefGPTError``, ``except ValueError`` and
``except AssertionError`` all catch it. A MissingActivation stays one (a KeyError, as
TransformerLens's cache raises); errors raised inside a user's hook pass through untouched.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

from ..errors import MissingActivation, RefGPTError


class TLAssertionError(RefGPTError, AssertionError):
    """A RefGPTError where TransformerLens asserts: catchable as either."""


def converted(error: RefGPTError) -> RefGPTError:
    if isinstance(error, (TLAssertionError, MissingActivation)):
        return error
    return TLAssertionError(*error.args)


@contextlib.contextmanager
def tl_errors():
    """A RefGPTError raised inside leaves as a TLAssertionError."""
    try:
        yield
    except RefGPTError as error:
        new = converted(error)
        if new is error:
            raise
        raise new.with_traceback(error.__traceback__) from None


def tl_semantics(cls):
    """Wrap every public method of ``cls`` (and ``__call__``, ``__getitem__``) in ``tl_errors``."""
    for name, value in list(vars(cls).items()):
        if name.startswith("_") and name not in ("__call__", "__getitem__", "__init__"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            kind, fn = type(value), value.__func__
        elif inspect.isfunction(value) and not inspect.isgeneratorfunction(value):
            kind, fn = None, value
        else:
            continue

        def wrapped(*args, __fn=fn, **kwargs):
            with tl_errors():
                return __fn(*args, **kwargs)

        functools.update_wrapper(wrapped, fn)
        setattr(cls, name, kind(wrapped) if kind else wrapped)
    return cls
