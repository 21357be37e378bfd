"""Hook points: where a forward pass can be watched and edited, TransformerLens's way.

The forward pass calls ``run_hooks(name, activation)`` at every hook point (``blocks.3.hook_resid_pre``,
``ln_final.hook_scale``, ...) and carries on with whatever it returns. A ``HookRun`` is one forward
pass's ``run_hooks``: it applies the hooks on that point, in order, then records the result into the
activation cache if that name was asked for. So the cache holds what actually flowed downstream,
edits included.

A hook is ``fn(activation, hook)`` returning a replacement array, or None to keep the activation
(an in-place edit of the array also flows downstream). ``hook`` is the model's ``HookPoint`` for
that name: it has ``hook.name``, ``hook.layer()`` and ``hook.ctx`` (a dict that lives as long as
the model, cleared by ``reset_hooks``), as in TransformerLens, and ``hook.start`` (below). A HookPoint *is* also its name (a
``str`` subclass), so hooks written ``fn(activation, name)`` for refgpt < 0.2 keep working:
``name == "blocks.0.hook_resid_pre"``, ``name.startswith(...)``. The hook is passed positionally.

A replacement must keep the activation's shape and dtype: refgpt never casts or broadcasts a
hook's output silently.

Absolute positions. In a pass given a KVCache the activations hold only the new positions, so
row 0 of an activation is position ``run.start`` (the positions already cached), not position 0.
A hook that edits given positions (a steering vector at the prompt's front positions) must know
this: it reads ``hook.start``, the absolute position of the activation's first row in the pass
now running (0 in an ordinary pass). It is refgpt's addition to TransformerLens's HookPoint (TL's
KV-cached hooks cannot tell), set by the pass before it calls the hooks on that point; a plain
``fn(activation, hook)`` reads it like ``hook.name``. In a padded pass the rows of a batch do not
share positions: a left-padded row's first real token is position 0 (TransformerLens's and HF's
count, refgpt/gpt2/padding.py). Then ``hook.positions`` [batch, new] holds each row's absolute position
of each activation row (−1 at a pad); it is None in an unpadded pass, where every row's positions
are ``hook.start + arange(new)``.

Hooks live on the model's hook points (``model.hook_dict``), as in TransformerLens:
``add_hook(name_or_filter, fn, dir="fwd"|"bwd", is_permanent=False, prepend=False)``,
``reset_hooks(including_permanent=False)``, ``remove_all_hook_fns``, and the ``hooks(...)``
context, which adds hooks at a new level and removes exactly that level's hooks on the way out,
even when the body raises (nested contexts each remove their own). ``run_with_hooks`` is one
forward pass inside such a context. Backward hooks (``dir="bwd"``) are called by the analytic
backward pass (refgpt/backward.py) with ∂loss/∂activation.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from . import hook_points
from .. import memory
from ..memory import Scratch
from ..errors import RefGPTError, RefGPTTypeError

Hook = Callable[[np.ndarray, "HookPoint"], "np.ndarray | None"]
DIRECTIONS = ("fwd", "bwd")


@dataclass
class LensHandle:
    """One hook on one hook point (TransformerLens's name): the function and how long it stays."""

    hook: Callable
    is_permanent: bool = False
    context_level: int | None = None


class HookPoint(str):
    """A hook point of one model: its name (it *is* the name, a ``str``), ``layer()``, a ``ctx``
    dict for hooks to keep state in, and the hooks attached to it, forward and backward."""

    def __new__(cls, name: str):
        point = super().__new__(cls, name)
        point.ctx, point.fwd_hooks, point.bwd_hooks = {}, [], []
        point.start = 0  # the absolute position of row 0 of the activation the hooks see now
        point.positions = None  # [batch, new] each row's positions in a padded pass (−1: pad); None unpadded
        return point

    @property
    def name(self) -> str:
        return str.__str__(self)

    def layer(self) -> int:
        """The block index of ``blocks.{L}.…``; RefGPTError for a point outside the blocks."""
        parts = self.split(".")
        if len(parts) < 2 or parts[0] != "blocks" or not parts[1].isdigit():
            raise RefGPTError(f"hook {self.name!r} is not inside a block: it has no layer")
        return int(parts[1])

    def clear_context(self):
        self.ctx = {}

    def add_hook(self, hook, dir="fwd", is_permanent=False, level=None, prepend=False):
        if dir not in DIRECTIONS:
            raise RefGPTError(f"add_hook: dir must be 'fwd' or 'bwd', found {dir!r}")
        if not callable(hook):
            raise RefGPTError(f"add_hook: the hook for {self.name!r} is not callable: {hook!r}")
        handles = self.fwd_hooks if dir == "fwd" else self.bwd_hooks
        handles.insert(0 if prepend else len(handles), LensHandle(hook, is_permanent, level))

    def remove_hooks(self, dir="fwd", including_permanent=False, level=None):
        """TransformerLens's rule: every hook if ``including_permanent``, else the non-permanent
        ones (of context ``level`` only, when given)."""
        if dir not in ("fwd", "bwd", "both"):
            raise RefGPTError(f"remove_hooks: dir must be 'fwd', 'bwd' or 'both', found {dir!r}")

        def kept(h):
            return not including_permanent and (h.is_permanent or (level is not None and h.context_level != level))
        if dir in ("fwd", "both"):
            self.fwd_hooks = [h for h in self.fwd_hooks if kept(h)]
        if dir in ("bwd", "both"):
            self.bwd_hooks = [h for h in self.bwd_hooks if kept(h)]

    def has_hooks(self, dir="both", including_permanent=True, level=None) -> bool:
        handles = (self.fwd_hooks if dir in ("fwd", "both") else []) + (self.bwd_hooks if dir in ("bwd", "both") else [])
        return any((including_permanent or not h.is_permanent) and (level is None or h.context_level == level)
                   for h in handles)

    def __repr__(self):
        return f"HookPoint({self.name!r})"

    def __reduce__(self):
        return (HookPoint, (self.name,))  # a copy is a fresh point: no hooks, empty ctx


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


def hook_entries(entries, what="fwd_hooks"):
    """[(name or predicate, fn), …] checked: each a pair with a callable fn."""
    if isinstance(entries, (str, bytes)) or not hasattr(entries, "__iter__"):
        raise RefGPTTypeError(f"{what}: expected a list of (name_or_predicate, fn), found {entries!r:.60}")
    checked = []
    for entry in entries:
        try:
            selector, fn = entry
        except (TypeError, ValueError):
            raise RefGPTError(f"{what}: each entry must be (name_or_predicate, fn), found {entry!r}") from None
        if not callable(fn):
            raise RefGPTError(f"{what}: the hook for {selector!r} is not callable: {fn!r}")
        checked.append((selector, fn))
    return checked


class HookRun:
    """The ``run_hooks`` of one forward pass: the hooks on each hook point, then caching."""

    def __init__(self, hook_dict: dict[str, HookPoint], cache_names=(), start: int = 0, positions=None,
                 scratch: Scratch | None = None):
        self.start = start  # the absolute position of the activations' first row (> 0 after a KV cache)
        self.positions = positions  # [batch, new] each row's token positions, −1 at pads; None: unpadded
        self.points = {name: hp for name, hp in hook_dict.items() if hp.fwd_hooks}
        self.hooks: dict[str, list[Hook]] = {name: [h.hook for h in hp.fwd_hooks] for name, hp in self.points.items()}
        self.cache_names = set(cache_names)
        self.cache: dict[str, np.ndarray] = {}
        self.scratch = scratch  # buffers for what nobody watches (refgpt/memory.py); None: new arrays

    def __call__(self, name: str, activation: np.ndarray) -> np.ndarray:
        if self.scratch is not None and self.watched(name) and self.scratch.holds(activation):
            kept = memory.empty(activation.shape, activation.dtype)  # a hook or the cache may keep it: never a
            np.copyto(kept, activation)  # buffer the pass reuses
            activation = kept
        for fn in self.hooks.get(name, ()):
            hook = self.points[name]
            hook.start, hook.positions = self.start, self.positions  # set before each hook: a hook may run a pass of its own
            result = fn(activation, hook)
            if result is not None:
                activation = _checked_replacement(name, activation, result)
        if name in self.cache_names:
            self.cache[name] = activation
        return activation

    def watched(self, name: str) -> bool:
        """Will anyone see this activation (a hook or the cache)? If not, it may be overwritten in place."""
        return name in self.hooks or name in self.cache_names

    def hooked(self, name: str) -> bool:
        """Will a hook see this activation (and perhaps edit it, in place or by replacing it)?"""
        return name in self.hooks

    def buffer(self, key: str, shape, dtype, *names) -> np.ndarray:
        """An array to write a value into: the pass's scratch buffer ``key``, reused between layers
        and passes, when no hook and no cache watches any of the hook points ``names`` (a value that
        is no hook point: none given); else a new one (refgpt/memory.py)."""
        if self.scratch is None or any(map(self.watched, names)):
            return memory.empty(shape, dtype)  # a hook or the cache may keep it: recycled memory
        return self.scratch.take(key, shape, dtype)

    def handed_out(self, array: np.ndarray) -> np.ndarray:
        """``array``, or a copy of it if it is scratch: what the pass returns to its caller."""
        if self.scratch is None or not self.scratch.holds(array):
            return array
        kept = memory.empty(array.shape, array.dtype)
        np.copyto(kept, array)
        return kept

    def scope(self, prefix: str) -> "Scope":
        return Scope(self, prefix)


class GradientRun:
    """The backward pass's ``run_hooks``: the backward hooks on each hook point, given ∂loss/∂activation
    as the analytic backward makes it (refgpt/backward.py, and inside attention_backward,
    mlp_backward and layer_norm_backward).

    Every hook on a point sees the gradient arriving there (not another hook's replacement, as with
    torch's backward hooks in TransformerLens); a hook may return a replacement (an array, or
    torch's ``(grad,)``), and the last one returned is what flows on.
    """

    def __init__(self, hook_dict: dict[str, HookPoint]):
        self.points = {name: hp for name, hp in hook_dict.items() if hp.bwd_hooks}

    def __call__(self, name: str, grad: np.ndarray) -> np.ndarray:
        hp = self.points.get(name)
        if hp is None:
            return grad
        flowing = grad
        for handle in list(hp.bwd_hooks):
            result = handle.hook(grad, hp)
            if isinstance(result, tuple) and len(result) == 1:  # torch's (grad,), as TransformerLens allows
                result = result[0]
            if result is not None:
                flowing = _checked_replacement(name, grad, result)
        return flowing

    def scope(self, prefix: str):
        """This run seen from inside an op: ``run_hooks("hook_q", ∂q)`` is ``run("blocks.3.attn.hook_q", ∂q)``."""
        return lambda name, grad: self(prefix + name, grad)


class HookRegistry:
    """TransformerLens's hook management (``HookedRootModule``) for a model with ``hook_dict``."""

    context_level = 0

    def hook_points(self):
        return self.hook_dict.values()

    def set_use_attn_result(self, use_attn_result: bool):
        """Compute each head's z·W_O at ``blocks.L.attn.hook_result`` (TransformerLens's switch)."""
        self.cfg.use_attn_result = use_attn_result

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool):
        """Hook the MLP's input at ``blocks.L.hook_mlp_in``."""
        self.cfg.use_hook_mlp_in = use_hook_mlp_in

    def set_use_split_qkv_input(self, use_split_qkv_input: bool):
        """Per-head copies of the stream into q, k and v: ``hook_q_input`` … (refgpt/tl/hook_points.py)."""
        self.cfg.use_split_qkv_input = use_split_qkv_input

    def set_use_attn_in(self, use_attn_in: bool):
        """A per-head copy of the stream into attention: ``blocks.L.hook_attn_in``."""
        self.cfg.use_attn_in = use_attn_in

    def add_hook(self, name, hook, dir="fwd", is_permanent=False, level=None, prepend=False):
        """Attach ``hook`` to the point ``name`` (or every point a predicate picks)."""
        names = [name] if isinstance(name, str) else select_names(name, self.hook_names, "add_hook")
        for n in names:
            self.hook_dict[self._hookable(n, "add_hook")].add_hook(hook, dir, is_permanent, level, prepend)

    def add_perma_hook(self, name, hook, dir="fwd"):
        self.add_hook(name, hook, dir=dir, is_permanent=True)

    def remove_all_hook_fns(self, direction="both", including_permanent=False, level=None):
        for hp in self.hook_dict.values():
            hp.remove_hooks(direction, including_permanent=including_permanent, level=level)

    def clear_contexts(self):
        for hp in self.hook_dict.values():
            hp.clear_context()

    def reset_hooks(self, clear_contexts=True, direction="both", including_permanent=False, level=None):
        if clear_contexts:
            self.clear_contexts()
        self.remove_all_hook_fns(direction, including_permanent, level=level)

    def hooks(self, fwd_hooks=(), bwd_hooks=(), reset_hooks_end=True, clear_contexts=False):
        """``with model.hooks(fwd_hooks=[…]):`` every pass inside runs them; on the way out (even on
        an exception) this level's hooks go, unless ``reset_hooks_end=False``. The names are
        checked here, before the ``with`` is entered."""
        chosen = [(direction, n, fn)
                  for direction, entries in (("fwd", fwd_hooks), ("bwd", bwd_hooks))
                  for selector, fn in hook_entries(entries, f"{direction}_hooks")
                  for n in self.chosen_names(selector, f"{direction}_hooks")]
        return self._hooks_context(chosen, reset_hooks_end, clear_contexts)

    @contextlib.contextmanager
    def _hooks_context(self, chosen, reset_hooks_end, clear_contexts):
        self.context_level += 1
        try:
            for direction, name, fn in chosen:
                self.hook_dict[name].add_hook(fn, direction, level=self.context_level)
            yield self
        finally:
            if reset_hooks_end:
                self.reset_hooks(clear_contexts, including_permanent=False, level=self.context_level)
            self.context_level -= 1

    def chosen_names(self, selector, what) -> list[str]:
        """The hook points a selector (a name, names, a predicate; None: all) picks: a predicate
        among the points the forward reaches now; a name must be one of them (``_hookable``)."""
        if selector is None or callable(selector):
            return select_names(selector, self.hook_names, what)
        return [self._hookable(n, what) for n in select_names(selector, list(self.hook_dict), what)]

    def _hookable(self, name, what):
        """``name`` if this model computes it now; a RefGPTError naming the cfg switch otherwise."""
        if name not in self.hook_dict:
            select_names(name, list(self.hook_dict), what)  # raises with a suggestion
        switch = hook_points.switch_of(name)
        if switch and not getattr(self.cfg, switch):
            raise RefGPTError(f"{what}: {name!r} exists only with model.cfg.{switch} = True "
                              f"(or model.set_{switch}(True)), as in TransformerLens")
        return name


class Scope:
    """A HookRun seen from inside a component: ``run_hooks("hook_q", q)`` is ``run("blocks.3.attn.hook_q", q)``."""

    __slots__ = ("run", "prefix")

    def __init__(self, run: HookRun, prefix: str):
        self.run, self.prefix = run, prefix

    def __call__(self, name: str, activation: np.ndarray) -> np.ndarray:
        return self.run(self.prefix + name, activation)

    def watched(self, name: str) -> bool:
        return self.run.watched(self.prefix + name)

    def hooked(self, name: str) -> bool:
        return self.run.hooked(self.prefix + name)

    def buffer(self, key: str, shape, dtype, *names) -> np.ndarray:
        return self.run.buffer(key, shape, dtype, *(self.prefix + name for name in names))


def _checked_replacement(name, old, new):
    if not isinstance(new, np.ndarray):
        raise RefGPTError(f"hook at {name}: returned {type(new).__name__}, expected a numpy array or None")
    if type(new) is not np.ndarray:  # np.ma.MaskedArray, np.matrix, a memmap, …: other arithmetic, or none
        raise RefGPTError(f"hook at {name}: returned a {type(new).__module__}.{type(new).__name__}, an ndarray "
                          "subclass whose arithmetic is not NumPy's; return a plain array (np.asarray(x))")
    if new.shape != old.shape:
        raise RefGPTError(f"hook at {name}: returned shape {list(new.shape)}, expected {list(old.shape)}")
    if new.dtype != old.dtype:
        raise RefGPTError(
            f"hook at {name}: returned {new.dtype}, expected {old.dtype} (refgpt does not cast silently)"
        )
    if new.strides != old.strides:  # in the layout of the activation it replaces: NumPy's matmul takes
        laid_out = np.empty_like(old)  # another BLAS kernel (another summation order, other last bits)
        laid_out[...] = new  # for a Fortran-ordered or strided array of the same values
        new = laid_out
    return new
