"""Hook points: where a forward pass can be watched and edited.

The forward pass calls ``point(name, activation)`` at every hook point (``blocks.3.hook_resid_pre``,
``ln_final.hook_scale``, ...) and carries on with whatever it returns. A ``HookRun`` is one forward
pass's ``point``: it applies the user's hooks, in the order given, then records the result into
the activation cache if that name was asked for. So the cache holds what actually flowed
downstream, edits included.

A hook is ``fn(activation, name)`` returning a replacement array, or None to keep the activation
(an in-place edit of the array also flows downstream). Hooks are chosen by exact name or by a
predicate on the name. A replacement must keep the activation's shape and dtype: refgpt never
casts or broadcasts a hook's output silently.

Absolute positions. In a pass given a KVCache the activations hold only the new positions, so
row 0 of an activation is position ``run.start`` (the positions already cached), not position 0.
A hook that edits given positions (a steering vector at the prompt's front positions) must know
this: mark it with ``fn.takes_start = True`` and it is called ``fn(activation, name, start=s)``,
s the absolute position of the activation's first row (0 in an ordinary pass).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable

import numpy as np

from .errors import RefGPTError, RefGPTTypeError

Hook = Callable[[np.ndarray, str], "np.ndarray | None"]


def select_names(selector, known: list[str], what: str) -> list[str]:
    """The hook names a selector picks: a name, a list of names, a predicate, or None (all)."""
    if selector is None:
        return list(known)
    if callable(selector):
        return [name for name in known if selector(name)]
    if not isinstance(selector, (str, list, tuple, set, frozenset)):
        raise RefGPTTypeError(f"{what}: expected a hook name, a list of names, a predicate or None, "
                              f"found {selector!r:.60}")
    names = [selector] if isinstance(selector, str) else list(selector)
    known_set = set(known)
    for name in names:
        if not isinstance(name, str) or name not in known_set:
            close = difflib.get_close_matches(str(name), known, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise RefGPTError(f"{what}: {name!r} is not a hook point of this model{hint}")
    return names


class HookRun:
    """The ``point`` of one forward pass: user hooks, then caching."""

    def __init__(self, known: list[str], fwd_hooks: Iterable = (), cache_names=(), start: int = 0):
        self.start = start  # the absolute position of the activations' first row (> 0 after a KV cache)
        self.hooks: dict[str, list[Hook]] = {}
        if isinstance(fwd_hooks, (str, bytes)) or not hasattr(fwd_hooks, "__iter__"):
            raise RefGPTTypeError(f"fwd_hooks: expected a list of (name_or_predicate, fn), found {fwd_hooks!r:.60}")
        for entry in fwd_hooks:
            try:
                selector, fn = entry
            except (TypeError, ValueError):
                raise RefGPTError(f"fwd_hooks: each entry must be (name_or_predicate, fn), found {entry!r}") from None
            if not callable(fn):
                raise RefGPTError(f"fwd_hooks: the hook for {selector!r} is not callable: {fn!r}")
            for name in select_names(selector, known, "fwd_hooks"):
                self.hooks.setdefault(name, []).append(fn)
        self.cache_names = set(cache_names)
        self.cache: dict[str, np.ndarray] = {}

    def __call__(self, name: str, activation: np.ndarray) -> np.ndarray:
        for fn in self.hooks.get(name, ()):
            result = fn(activation, name, start=self.start) if getattr(fn, "takes_start", False) else fn(activation, name)
            if result is not None:
                activation = _checked_replacement(name, activation, result)
        if name in self.cache_names:
            self.cache[name] = activation
        return activation

    def watched(self, name: str) -> bool:
        """Will anyone see this activation (a hook or the cache)? If not, it may be overwritten in place."""
        return name in self.hooks or name in self.cache_names

    def scope(self, prefix: str) -> "Scope":
        return Scope(self, prefix)


class Scope:
    """A HookRun seen from inside a component: ``point("hook_q", q)`` is ``run("blocks.3.attn.hook_q", q)``."""

    __slots__ = ("run", "prefix")

    def __init__(self, run: HookRun, prefix: str):
        self.run, self.prefix = run, prefix

    def __call__(self, name: str, activation: np.ndarray) -> np.ndarray:
        return self.run(self.prefix + name, activation)

    def watched(self, name: str) -> bool:
        return self.run.watched(self.prefix + name)


def _checked_replacement(name, old, new):
    if not isinstance(new, np.ndarray):
        raise RefGPTError(f"hook at {name}: returned {type(new).__name__}, expected a numpy array or None")
    if new.shape != old.shape:
        raise RefGPTError(f"hook at {name}: returned shape {list(new.shape)}, expected {list(old.shape)}")
    if new.dtype != old.dtype:
        raise RefGPTError(
            f"hook at {name}: returned {new.dtype}, expected {old.dtype} (refgpt does not cast silently)"
        )
    return new
