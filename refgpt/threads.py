"""Row-parallel work: the forward pass's elementwise steps on as many threads as the BLAS uses.

The matrix products of a pass run on every BLAS thread; what is left of it (softmax, GELU,
LayerNorm, the residual adds, the loss's log-softmax, the oracle's judgement) NumPy runs on one.
Each of those works on rows independently (a LayerNorm or a softmax reads one position's row), so
it is split here into **blocks of whole rows**, and the blocks are handed to threads. NumPy
releases the GIL inside its loops, so the threads run at once.

Bit for bit the same on any number of threads. The blocks are fixed by the array's shape alone
(``row_blocks``: rows of ``block_bytes`` at most), never by the thread count: one thread runs the
same NumPy calls on the same views in the same order, only one after another. Inside a block, a
reduction (the max and sum of a softmax, a LayerNorm's mean) runs along each row, in NumPy's own
pairwise order over that row, and never across rows; a result that combines blocks (the oracle's
sums and maxima) is folded in block order by the caller, after every block is done. Which thread
ran a block changes nothing (tests/core/test_threads.py: np.array_equal on 1 and N threads).

How many threads: the BLAS's own count (``blas_threads``), read from the BLAS NumPy loaded, as
threadpoolctl reads it (``openblas_get_num_threads``), at every call, so ``OMP_NUM_THREADS=1`` or
``OPENBLAS_NUM_THREADS=1`` (or a threadpoolctl limit) means one thread here too; ``limit(n)`` sets
refgpt's own count for a block of code. A BLAS it cannot ask (none found) counts as the
``*_NUM_THREADS`` variables say, or 1.

Workers run each task in a copy of the caller's context (``contextvars``), so ``np.errstate`` and
``limit`` hold inside them; an exception in a block is raised in the caller (the first block's,
in block order), and only once every block has finished, a Ctrl-C in the caller too (no block
writes into an array after its caller has moved on). Small arrays (``parallel_bytes``) are not
worth a thread's hand-off and run on the caller's thread, in the same blocks.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import math
import os
import queue
import threading
from pathlib import Path
from typing import NamedTuple

import numpy as np

#: Rows per block: as many as fit in this many bytes (at least one). A block of LayerNorm or GELU
#: then stays in a core's cache through all of its steps.
BLOCK_BYTES = 256 * 2**10
#: Work below this many bytes runs on the caller's thread: handing a block to another thread and
#: back costs ~50–150 µs, more than a pass over 1 MB takes.
PARALLEL_BYTES = 1 * 2**20


class Tuning(NamedTuple):
    """The thread count (None: the BLAS's) and the two sizes above, as ``limit`` sets them."""

    threads: int | None = None
    block_bytes: int = BLOCK_BYTES
    parallel_bytes: int = PARALLEL_BYTES


_tuning: contextvars.ContextVar[Tuning] = contextvars.ContextVar("refgpt_threads", default=Tuning())


@contextlib.contextmanager
def limit(threads: int | None = None, *, block_bytes: int | None = None, parallel_bytes: int | None = None):
    """Inside the ``with``, refgpt's row-parallel work uses ``threads`` threads (None: the BLAS's
    count), in this thread and context only: the BLAS's own count is not touched (threadpoolctl
    limits that). ``block_bytes`` and ``parallel_bytes`` change the block size and the size below
    which work stays on one thread (tests use them to split small arrays)."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a whole number ≥ 1 or None, found {threads!r}")
    now = _tuning.get()
    token = _tuning.set(Tuning(threads, now.block_bytes if block_bytes is None else max(1, block_bytes),
                               now.parallel_bytes if parallel_bytes is None else max(0, parallel_bytes)))
    try:
        yield
    finally:
        _tuning.reset(token)


def count() -> int:
    """Threads for row-parallel work now: ``limit``'s, else the BLAS's."""
    threads = _tuning.get().threads
    return threads if threads is not None else blas_threads()


# ---- the BLAS's thread count ----------------------------------------------------------------------

#: Thread-count getters, by library: OpenBLAS (scipy-openblas64 as NumPy's wheels bundle it, its
#: 32-bit-int build, a plain libopenblas), MKL, BLIS.
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
            "openblas_get_num_threads", "MKL_Get_Max_Threads", "bli_thread_get_num_threads")
_NAMES = ("openblas", "mkl_rt", "libmkl", "libblis", "libblas")
_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def blas_threads() -> int:
    """The number of threads NumPy's BLAS uses now (threadpoolctl's ``num_threads``), at least 1 and
    at most the CPUs this process may run on. Without a BLAS to ask: the ``*_NUM_THREADS``
    variables, as OpenBLAS reads them at start-up, or 1."""
    getter = _blas_getter()
    n = getter() if getter is not None else _threads_from_environment()
    return max(1, min(int(n), _cpus()))


@functools.lru_cache(maxsize=1)
def _blas_getter():
    """The loaded BLAS's thread-count function (a ctypes function), or None. Only a library already
    loaded into this process is opened (RTLD_NOLOAD): nothing new is ever loaded."""
    for path in _blas_libraries():
        try:
            library = ctypes.CDLL(str(path), mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_LOCAL)
        except OSError:
            continue
        for name in _GETTERS:
            function = getattr(library, name, None)
            if function is not None:
                function.restype, function.argtypes = ctypes.c_int, []
                return function
    return None


def _blas_libraries() -> list[Path]:
    """Candidate BLAS libraries, NumPy's own first: those mapped into this process (Linux), else those
    shipped beside NumPy (its wheels' numpy.libs, or numpy/.dylibs on macOS)."""
    import numpy

    home = Path(numpy.__file__).resolve().parent
    beside = [home.parent / "numpy.libs", home / ".dylibs"]
    mapped = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
            if path.startswith("/") and any(n in Path(path).name.lower() for n in _NAMES) and path not in mapped:
                mapped.append(path)
    if not mapped:
        mapped = [str(p) for d in beside if d.is_dir() for p in sorted(d.iterdir())
                  if any(n in p.name.lower() for n in _NAMES)]
    return sorted((Path(p) for p in mapped), key=lambda p: not any(d in p.parents for d in beside))


def _threads_from_environment() -> int:
    for name in _VARIABLES:
        try:
            n = int(os.environ.get(name, "").split(",")[0])
        except ValueError:
            continue
        if n >= 1:
            return n
    return 1


@functools.lru_cache(maxsize=1)
def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ---- blocks of rows, on the threads ----------------------------------------------------------------


def row_blocks(rows: int, row_bytes: int, block_bytes: int | None = None) -> list[tuple[int, int]]:
    """(start, stop) of consecutive blocks of whole rows, each at most ``block_bytes`` (default: the
    ``limit``'s, ``BLOCK_BYTES``; at least one row): a function of the shape only, so every thread
    count runs the same blocks. No rows, no blocks."""
    block_bytes = _tuning.get().block_bytes if block_bytes is None else block_bytes
    step = max(1, block_bytes // max(1, row_bytes))
    return [(a, min(a + step, rows)) for a in range(0, rows, step)]


def map_blocks(fn, blocks, total_bytes: int) -> list:
    """[fn(*block) for block in blocks] (a block: (start, stop), or any tuple of arguments), the
    blocks spread over ``count()`` threads (contiguous runs of blocks, the first on the caller's
    thread) when ``total_bytes`` of work is worth it. Results in block order; the first failing
    block's exception is raised after every block has finished."""
    if len(blocks) < 2 or total_bytes < _tuning.get().parallel_bytes:
        return [fn(*block) for block in blocks]
    threads = min(count(), len(blocks))
    if threads == 1:
        return [fn(*block) for block in blocks]
    cuts = [len(blocks) * k // threads for k in range(threads + 1)]
    runs = [blocks[cuts[k]:cuts[k + 1]] for k in range(threads)]

    def run(part):
        return [fn(*block) for block in part]

    done = queue.SimpleQueue()  # (run index, error, results) from each worker
    for k, inbox in enumerate(_inboxes(threads - 1), start=1):
        inbox.put((contextvars.copy_context(), run, runs[k], k, done))
    results, errors = [None] * threads, [None] * threads
    try:
        results[0] = contextvars.copy_context().run(_alone, run, runs[0])
    except BaseException as error:  # noqa: BLE001 — raised below, once the other threads are done
        errors[0] = error
    interrupted = None
    for _ in range(threads - 1):
        while True:
            try:
                k, error, part = done.get()
                break
            except BaseException as signal:  # noqa: BLE001 — a Ctrl-C while waiting: wait on (below)
                interrupted = interrupted or signal
        results[k], errors[k] = part, error
    # Every worker has finished before anything is raised, a KeyboardInterrupt too: a block still
    # running would otherwise write into arrays its caller has given up (a model's scratch buffers
    # that the next pass takes).
    failure = interrupted or next((e for e in errors if e is not None), None)  # the first block's, as one thread raises it
    if failure is not None:
        raise failure
    return [r for part in results for r in part]


def for_rows(fn, n_rows: int, row_bytes: int) -> None:
    """fn(a, b) for every block of ``n_rows`` rows of ``row_bytes`` each, on the threads."""
    map_blocks(fn, row_blocks(n_rows, row_bytes), n_rows * row_bytes)


def rows(x):
    """``x`` [..., n] seen as [rows, n] (a scalar as [1, 1]; an empty one too, e.g. [1, 0]): a view
    when ``x`` is C-contiguous."""
    return x.reshape(1, 1) if x.ndim == 0 else x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def by_rows(f, *arrays, out=None):
    """f(*blocks) a block of rows at a time, the blocks on the threads, written into ``out``
    (default: a new C-order array of the inputs' common shape and dtype). For an ``f`` that reads
    each element, or each row, alone: the result is f(*arrays)'s, bit for bit."""
    arrays = [np.asarray(a) for a in arrays]
    x = arrays[0]
    if any(a.shape != x.shape for a in arrays):  # broadcasting: not by rows
        result = f(*arrays)
        if out is None:
            return result
        out[...] = result
        return out
    if out is None:
        out = np.empty(x.shape, np.result_type(*arrays))
    if x.size == 0 or not out.flags.c_contiguous:
        out[...] = f(*arrays)
        return out
    blocks, dest = [rows(a) for a in arrays], rows(out)  # [rows, n] each (an input may be copied; dest is a view)

    def block(a, b):
        dest[a:b] = f(*(r[a:b] for r in blocks))

    for_rows(block, len(dest), dest.shape[1] * dest.itemsize)
    return out


def into_by_rows(f, x, out):
    """f(x rows, out rows) for each block of rows of ``x`` and ``out`` (x's shape, C order; it may
    be ``x``), on the threads; returns ``out``. For an ``f`` that writes each row from that row alone."""
    if x.ndim == 0 or x.size == 0:
        f(x, out)
        return out
    x_rows, out_rows = rows(x), rows(out)  # [rows, n] (x_rows a copy if x is not C-contiguous; out_rows a view)
    for_rows(lambda a, b: f(x_rows[a:b], out_rows[a:b]), len(out_rows), out_rows.shape[1] * out.itemsize)
    return out


def add(x, y, out=None):
    """x + y (``y`` of x's shape, or one row [n] added to every row), by blocks of rows on the
    threads; into ``out`` (it may be ``x``) or a new array. Bit for bit np.add's."""
    if out is None:
        out = np.empty(np.broadcast_shapes(x.shape, y.shape), np.result_type(x, y))
    if not (x.ndim and x.size and x.shape == out.shape and y.shape in (x.shape, x.shape[-1:])
            and x.flags.c_contiguous and y.flags.c_contiguous and out.flags.c_contiguous):
        return np.add(x, y, out=out)
    x_rows, o_rows = rows(x), rows(out)  # [rows, n] views
    y_rows = rows(y) if y.shape == x.shape else y  # [rows, n] or [n]

    def block(a, b):
        np.add(x_rows[a:b], y_rows[a:b] if y_rows.ndim == 2 else y_rows, out=o_rows[a:b])

    for_rows(block, len(o_rows), o_rows.shape[1] * out.itemsize)
    return out


_lock = threading.Lock()
_workers: list[queue.SimpleQueue] = []  # one inbox per worker thread; worker k runs the k-th run of blocks


def _inboxes(n: int) -> list[queue.SimpleQueue]:
    """The inboxes of the first ``n`` worker threads, started on first use (daemons that sleep in
    ``get`` when idle: they take no CPU)."""
    with _lock:
        while len(_workers) < n:
            inbox = queue.SimpleQueue()
            threading.Thread(target=_work, args=(inbox,), name=f"refgpt-rows-{len(_workers) + 1}", daemon=True).start()
            _workers.append(inbox)
        return _workers[:n]


def _work(inbox):
    while True:
        context, run, part, k, done = inbox.get()
        try:
            done.put((k, None, context.run(_alone, run, part)))
        except BaseException as error:  # noqa: BLE001 — handed to the caller, in block order
            done.put((k, error, None))
        context = run = part = done = None  # hold nothing while idle


def _alone(run, part):
    """run(part) with row-parallel work inside it on this thread only (in this task's own context):
    a block that itself splits rows (the oracle's log-softmax) must not wait for busy workers."""
    _tuning.set(_tuning.get()._replace(threads=1))
    return run(part)


def _forget_workers():
    """In a forked child the parent's worker threads do not exist: start new ones on demand."""
    global _lock
    _lock = threading.Lock()
    _workers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers)
