"""Where a pass's big arrays live: scratch buffers for what no one sees, recycled memory for what the
user is handed.

Fresh memory is expensive. The kernel faults in and zeroes every page of it, and on a virtual
machine whose free memory goes back to the host (free page reporting) the host faults it in again:
measured on the 2-core VM these benchmarks run on, 3.6 GB of fresh arrays took 5–13 s to write,
the same arrays rewritten 0.2–0.7 s (benchmarks/RESULTS.md, issue 30). Two cases:

**Scratch** (``Scratch``, ``buffer``). A forward pass over T positions makes ~15 arrays of
[T, d_model] or [T, d_mlp] per block (the LayerNorm's output, q|k|v, the heads' copies, z,
attn_out, the MLP's pre and post, the residual stream). When no hook and no cache looks at one,
nobody but the pass ever holds it, and the next block, or the next pass, writes its own into the
same memory. The rule, kept by the pass's ``run_hooks.buffer(key, shape, dtype, *names)``
(refgpt/tl/hooks.py): a value at a hook point goes into a scratch buffer only when no hook and no
cache watches that point (any of ``names``); a value that is no hook point (``names`` empty) always
may. What the pass returns is never scratch, and a scratch array that reaches a watched point
anyway (the stream leaving block L is the one entering block L + 1) is copied there first. One
Scratch per model, taken by one pass at a time: a second pass meanwhile (another thread, or a hook
running a pass of its own) gets new arrays. A model keeps its last pass's buffers, one per key
(~12 arrays of its [T, ·] sizes: 100 MB at T = 1024 in float64); ``Model.release_scratch`` lets
them go.

**Recycled** (``empty``). What a pass hands out (the logits, every array of ``run_with_cache``'s
cache) the user holds, and lets go of when done. An array of at least ``MIN_BYTES`` made by
``empty`` lives on its own anonymous mapping, 2 MiB-aligned and advised for transparent huge
pages (``MADV_HUGEPAGE``: this array only, not the process); when the last view of it is gone,
the mapping goes back to a pool, advised ``MADV_FREE`` (the kernel may take its pages back under
memory pressure without writing them anywhere), and the next array of that size reuses it with
its pages still in place. ``RETAIN_SECONDS`` after the last pass of any model has ended (a pass
marks itself with ``passing()``) the pool is unmapped, so memory waits for the next pass however
long a pass takes, and goes back once passes stop; the pool never holds more than ``RETAIN_BYTES``. Nothing process-wide is changed (malloc's
thresholds, NUMPY_MADVISE_HUGEPAGE). Where anonymous mappings cannot be made, ``empty`` is np.empty.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import queue
import threading
import time
import weakref

import numpy as np

# ---- scratch: reused for what no one sees ------------------------------------------------------


class Scratch:
    """Buffers by key, each kept at the shape and dtype last asked for."""

    def __init__(self):
        self.buffers: dict[str, np.ndarray] = {}
        self.ids: set[int] = set()  # id() of every buffer held, to recognise one (and its views) quickly

    def take(self, key: str, shape, dtype) -> np.ndarray:
        """The buffer ``key`` at ``shape`` and ``dtype`` (its contents are garbage), a new one if it was
        another shape or dtype."""
        shape, dtype = tuple(shape), np.dtype(dtype)
        array = self.buffers.get(key)
        if array is None or array.shape != shape or array.dtype != dtype:
            if array is not None:
                self.ids.discard(id(array))
            array = self.buffers[key] = np.empty(shape, dtype)
            self.ids.add(id(array))
        return array

    def holds(self, array) -> bool:
        """Is ``array`` one of the buffers, or a view of one?"""
        return isinstance(array, np.ndarray) and (id(array) in self.ids or id(array.base) in self.ids)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.buffers.values())


def buffer(run_hooks, key: str, shape, dtype, *names) -> np.ndarray:
    """``run_hooks.buffer(key, shape, dtype, *names)`` of a pass's HookRun (refgpt/tl/hooks.py): the
    scratch buffer ``key`` when none of the hook points ``names`` is watched, else a new array. An
    op called with another ``run_hooks`` (tests, plain functions) always gets a new array."""
    get = getattr(run_hooks, "buffer", None)
    return np.empty(shape, dtype) if get is None else get(key, shape, dtype, *names)


# ---- recycled: memory handed out, taken back when the user lets go -------------------------------

MIN_BYTES = 2**20  # smaller arrays come from malloc's heap, which recycles them already
RETAIN_SECONDS = 10.0  # how long the pool waits for a next pass (jemalloc's dirty decay is 10 s too)
_HUGE = 2 * 2**20  # a transparent huge page on x86-64 and arm64 (4 KiB base pages)


def _retain_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (AttributeError, OSError, ValueError):
        return 2**30


RETAIN_BYTES = _retain_bytes()  # a quarter of the machine's memory at most waits in the pool


class _Mapping:
    """One anonymous mapping of ``size`` usable bytes from a 2 MiB boundary on."""

    __slots__ = ("map", "view", "address", "size")

    def __init__(self, size: int):
        self.map = mmap.mmap(-1, size + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.view = (ctypes.c_char * (size + _HUGE)).from_buffer(self.map)  # the address (an export of the map)
        start = ctypes.addressof(self.view)
        skip = -start % _HUGE
        self.address, self.size = start + skip, size
        _advise(self.map, getattr(mmap, "MADV_HUGEPAGE", None), skip, size)


def _advise(m, advice, start, length):
    if advice is not None:
        try:
            m.madvise(advice, start, length)
        except (OSError, ValueError):  # not supported here: the advice is only advice
            pass


class _Holder:
    """What an array made by ``empty`` (and every view of it) keeps alive: when the last one is gone,
    the mapping goes back to the pool (a weakref callback puts it on a queue: safe in any thread)."""

    __slots__ = ("__array_interface__", "mapping", "__weakref__")

    def __init__(self, mapping: _Mapping, nbytes: int):
        self.mapping = mapping
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (mapping.address, False),
                                    "version": 3}


class _Pool:
    def __init__(self):
        self.lock = threading.RLock()  # re-entrant: a weakref callback may run (garbage collection) while it is held
        self.free: dict[int, list[_Mapping]] = {}  # size → mappings, the most recently freed last
        self.held = 0  # bytes in ``free``
        self.returned: queue.SimpleQueue[_Mapping] = queue.SimpleQueue()  # from the weakref callbacks
        self.janitor: threading.Thread | None = None
        self.passes = 0  # passes running now
        self.last_pass = time.monotonic()  # when the last one ended

    def take(self, size: int) -> _Mapping:
        with self.lock:
            self._collect()
            spare = self.free.get(size)
            if spare:
                self.held -= size
                return spare.pop()
        return _Mapping(size)

    def _collect(self):
        """Move what came back into ``free`` (under the lock): the newest last, within RETAIN_BYTES."""
        while True:
            try:
                mapping = self.returned.get_nowait()
            except queue.Empty:
                return
            if self.held + mapping.size > RETAIN_BYTES:
                continue  # dropped: unmapped when the last reference goes
            _advise(mapping.map, getattr(mmap, "MADV_FREE", None), mapping.address - ctypes.addressof(mapping.view),
                    mapping.size)
            self.free.setdefault(mapping.size, []).append(mapping)
            self.held += mapping.size

    def give_back(self, mapping: _Mapping):
        self.returned.put(mapping)  # SimpleQueue.put is reentrant: safe from a weakref callback
        if self.janitor is None or not self.janitor.is_alive():
            with self.lock:
                if self.janitor is None or not self.janitor.is_alive():
                    self.janitor = threading.Thread(target=self._sweep, name="refgpt-memory", daemon=True)
                    self.janitor.start()

    def _sweep(self):
        """Unmap the pool once RETAIN_SECONDS have passed since the last pass ended; end when it is empty."""
        while True:
            time.sleep(RETAIN_SECONDS / 4)
            with self.lock:
                self._collect()
                if not self.passes and time.monotonic() - self.last_pass >= RETAIN_SECONDS:
                    self.free.clear()
                    self.held = 0
                if not self.free and self.returned.empty():
                    self.janitor = None
                    return

    def clear(self):
        with self.lock:
            self._collect()
            self.free.clear()
            self.held = 0


_pool = _Pool()


def empty(shape, dtype) -> np.ndarray:
    """np.empty(shape, dtype), on recycled memory when it is ``MIN_BYTES`` or more (module docstring)."""
    dtype = np.dtype(dtype)
    shape = tuple(int(n) for n in np.atleast_1d(shape)) if not isinstance(shape, int) else (shape,)
    nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if nbytes < MIN_BYTES or not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.empty(shape, dtype)
    size = -(-nbytes // _HUGE) * _HUGE
    try:
        mapping = _pool.take(size)
    except (OSError, ValueError, MemoryError):
        return np.empty(shape, dtype)
    holder = _Holder(mapping, nbytes)
    weakref.finalize(holder, _give_back, mapping).atexit = False  # at exit the process unmaps everything
    return np.asarray(holder).view(dtype).reshape(shape)


def _give_back(mapping: _Mapping):
    """The weakref callback: to the pool of this process now (``_pool``, looked up at the call: a
    forked child's own, never the parent's, whose lock another thread may have held at the fork)."""
    _pool.give_back(mapping)


@contextlib.contextmanager
def passing():
    """Marks a forward pass: while one runs, and for RETAIN_SECONDS after the last, the pool keeps
    what comes back for the next."""
    with _pool.lock:
        _pool.passes += 1
    try:
        yield
    finally:
        with _pool.lock:
            _pool.passes -= 1
            _pool.last_pass = time.monotonic()


def recycled(array) -> bool:
    """Was ``array`` (or the array it views) made by ``empty`` on recycled memory?"""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, _Holder)


def release() -> int:
    """Unmap every mapping waiting in the pool now; returns the bytes let go."""
    with _pool.lock:
        _pool._collect()
        held = _pool.held
    _pool.clear()
    return held


def _after_fork_in_child():
    """A forked child starts an empty pool of its own: the parent's janitor thread does not exist
    here and its lock may have been held by another thread at the fork. The arrays the child
    inherited are private copies (MAP_PRIVATE) and come back to the child's pool when it drops them."""
    global _pool
    _pool = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
