"""Scratch buffers: what no one sees is written into arrays reused from layer to layer and pass to pass.

A forward pass over T positions makes ~15 arrays of [T, d_model] or [T, d_mlp] per block (the
LayerNorm's output, q|k|v, the heads' copies, z, attn_out, the MLP's pre and post, the residual
stream). When no hook and no cache looks at one, nobody but the pass ever holds it, and the next
block (or the next pass) can write its own into the same memory instead of asking for new: fresh
memory costs the kernel a page fault and a page of zeros for every 4 KiB (on a virtual machine,
often the host's too), while memory just written is still in the caches.

The rule, kept by the pass's ``run_hooks.buffer(key, shape, dtype, *names)`` (refgpt/tl/hooks.py):
a value at a hook point goes into a scratch buffer only when no hook and no cache watches that
point (any of ``names``); a value that is no hook point (``names`` empty) always may. What the pass
returns (logits, a stream with stop_at_layer) is never scratch, and a scratch array that reaches a
watched point anyway (the stream leaving block L is the one entering block L + 1) is copied there
first. One Scratch per model, taken by one pass at a time: a second pass meanwhile (another
thread, or a hook running a pass of its own) gets new arrays. A model keeps its last pass's
buffers, one per key (~12 arrays of that pass's [T, ·] sizes: 100 MB at T = 1024 in float64);
``Model.release_scratch`` lets them go.
"""

from __future__ import annotations

import numpy as np


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
