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


class TLAssertionError(RefGPTError, AssertionError, RuntimeError):
    """A RefGPTError where TransformerLens asserts (or where torch's ops, under TransformerLens, raise
    a RuntimeError: a shape that does not broadcast): catchable as any of them."""


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


_DUNDERS = ("__call__", "__getitem__", "__init__", "__matmul__", "__rmatmul__", "__mul__", "__rmul__")


def tl_semantics(cls):
    """Wrap every public method and property of ``cls`` — its own and those it inherits from refgpt's
    NumPy classes — and its operators in ``tl_errors``."""
    names = {name for klass in cls.__mro__ if klass.__module__.startswith("refgpt.") for name in vars(klass)}
    for name in sorted(names):
        if name.startswith("_") and name not in _DUNDERS:
            continue
        value = inspect.getattr_static(cls, name)
        if isinstance(value, (staticmethod, classmethod)):
            kind, fn = type(value), value.__func__
        elif isinstance(value, property) and value.fset is None and value.fget is not None:
            kind, fn = property, value.fget
        elif inspect.isfunction(value) and not inspect.isgeneratorfunction(value):
            kind, fn = None, value
        else:
            continue
        if getattr(fn, "__tl_errors__", False):
            continue

        def wrapped(*args, __fn=fn, **kwargs):
            with tl_errors():
                return __fn(*args, **kwargs)

        functools.update_wrapper(wrapped, fn)
        wrapped.__tl_errors__ = True
        setattr(cls, name, kind(wrapped) if kind else wrapped)
    return cls
