"""Issue 30: where a pass's big arrays live (refgpt/memory.py).

- Scratch: what the pass reuses never reaches the user (logits, caches, a stream returned with
  stop_at_layer stay as they were after the next passes); a hook running a pass inside a pass and two
  threads running passes at once compute what one pass alone computes.
- Recycled memory: an array handed out lives while any view of it does, then its mapping is reused by
  the next array of its size; the pool keeps at most RETAIN_BYTES, and is unmapped RETAIN_SECONDS
  after the last pass; run_with_cache's big arrays and the logits are made on it.
- What the user holds is never written by a later pass: views of the logits and of cache entries
  (their arrays dropped), every activation a hook kept; threads taking recycled memory at once; a
  forked child's own pool.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from random_models import random_model, random_tokens
from refgpt import Config, memory, threads

CFG = Config(d_model=16, n_layers=3, n_heads=2, d_mlp=40, d_vocab=37, n_ctx=80)  # 3 blocks: the stream's buffers go round
SPLIT = dict(block_bytes=64, parallel_bytes=0)  # every op splits (as in test_threads.py)


@pytest.fixture(scope="module", params=["float64", "float32"])
def model(request):
    return random_model(CFG, seed=30, dtype=request.param, scale=1.0)


def _same(a, b):
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


# ---- scratch: what the pass reuses never reaches the user -----------------------------------------


def test_what_a_pass_returns_is_never_reused(model):
    a, b = random_tokens(CFG, 50, seed=1), random_tokens(CFG, 50, seed=2)
    logits_a = model(a)
    kept = logits_a.copy()
    _, cache = model.run_with_cache(a)
    cached = {k: v.copy() for k, v in cache.items()}
    stream = model(a, stop_at_layer=1)
    stream_kept = stream.copy()
    _, picked = model.run_with_cache(a, names=["blocks.1.hook_resid_pre", "blocks.0.mlp.hook_post"])
    picked_kept = {k: v.copy() for k, v in picked.items()}
    for _ in range(2):
        model(b), model(b, stop_at_layer=1), model.run_with_cache(b, names=["blocks.0.hook_resid_post"])
    assert np.array_equal(logits_a, kept) and np.array_equal(stream, stream_kept)
    _same(dict(cache.items()), cached)
    _same(dict(picked.items()), picked_kept)
    assert np.array_equal(cache["blocks.1.hook_resid_pre"], cache["blocks.0.hook_resid_post"])
    assert model.release_scratch() > 0
    assert np.array_equal(model(a), kept)


@pytest.mark.slow
def test_a_pass_inside_a_hook_and_passes_on_two_threads(model):
    a, b = random_tokens(CFG, 45, seed=3), random_tokens(CFG, 45, seed=4)
    want_a, want_b = model(a), model(b)
    inner = []

    def hook(x, hook):  # runs a pass of its own (the hook is on that pass too: once), returns nothing
        if not inner:
            inner.append(None)
            inner.append(model(b))

    assert np.array_equal(model.run_with_hooks(a, fwd_hooks=[("blocks.0.hook_attn_out", hook)]), want_a)
    assert np.array_equal(inner[1], want_b)
    got = {}

    def run(name, tokens):
        with threads.limit(2, **SPLIT):
            got[name] = [model(tokens) for _ in range(3)]

    workers = [threading.Thread(target=run, args=(n, t)) for n, t in (("a", a), ("b", b))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert all(np.array_equal(x, want_a) for x in got["a"]) and all(np.array_equal(x, want_b) for x in got["b"])


# ---- recycled memory ------------------------------------------------------------------------------

MiB = 2**20


@pytest.fixture
def pool(monkeypatch):
    """An empty pool of this test's own."""
    monkeypatch.setattr(memory, "_pool", memory._Pool())
    yield memory._pool
    memory.release()


@pytest.mark.slow
def test_an_array_lives_while_a_view_does_then_its_memory_is_reused(pool):
    a = memory.empty((3, 200, 1000), np.float64)  # 4.6 MiB
    assert memory.recycled(a) and a.shape == (3, 200, 1000) and a.dtype == np.float64
    assert a.flags.writeable and a.flags.c_contiguous and a.ctypes.data % (2 * MiB) == 0
    a[...] = 7.0
    address, view = a.ctypes.data, a[1, 5:9]
    del a
    gc.collect()
    b = memory.empty((3, 200, 1000), np.float64)
    assert b.ctypes.data != address and (view == 7.0).all()  # the view keeps its memory: not reused
    addresses = {address, b.ctypes.data}
    del view, b
    gc.collect()
    c = memory.empty((600, 1000), np.float64)  # 4.6 MiB too, another shape: the same 6 MiB mappings
    d = memory.empty((3, 200, 1000), np.float64)
    assert {c.ctypes.data, d.ctypes.data} == addresses and pool.held == 0


def test_small_arrays_are_plain_and_shapes_of_every_kind(pool):
    assert not memory.recycled(memory.empty((10, 10), np.float32))
    for shape in [(MiB,), MiB, (2, MiB // 2), (1, 1, MiB)]:
        a = memory.empty(shape, np.uint8)
        assert memory.recycled(a) and a.shape == np.empty(shape, np.uint8).shape


@pytest.mark.slow
def test_the_pool_is_bounded_and_released(pool, monkeypatch):
    monkeypatch.setattr(memory, "RETAIN_BYTES", 4 * MiB)
    arrays = [memory.empty(3 * MiB, np.uint8) for _ in range(3)]  # 4 MiB mappings: one fits
    del arrays
    gc.collect()
    pool.take(2 * MiB)  # collects what came back
    assert pool.held == 4 * MiB
    assert memory.release() == 4 * MiB and pool.held == 0


@pytest.mark.slow
def test_the_pool_is_unmapped_after_the_last_pass(pool, monkeypatch):
    monkeypatch.setattr(memory, "RETAIN_SECONDS", 0.05)
    with memory.passing():
        a = memory.empty(3 * MiB, np.uint8)
        del a
        gc.collect()
        time.sleep(0.2)  # a pass is running: kept
        with pool.lock:
            pool._collect()
        assert pool.held == 4 * MiB
    deadline = time.monotonic() + 5
    while pool.held and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.held == 0


@pytest.mark.slow
def test_the_cache_and_the_logits_are_recycled_memory(pool):
    cfg = Config(d_model=16, n_layers=1, n_heads=2, d_mlp=40, d_vocab=2000, n_ctx=400)
    model = random_model(cfg, seed=1)
    tokens = np.random.default_rng(0).integers(0, cfg.d_vocab, (1, 400))
    logits, cache = model.run_with_cache(tokens)
    assert memory.recycled(logits)  # [1, 400, 2000] float64, 6 MiB
    assert memory.recycled(cache["blocks.0.attn.hook_pattern"]) and memory.recycled(cache["blocks.0.attn.hook_attn_scores"])
    want = {k: v.copy() for k, v in cache.items()}
    address = cache["blocks.0.attn.hook_pattern"].ctypes.data
    del cache
    gc.collect()
    again, cache = model.run_with_cache(tokens)
    assert np.array_equal(again, logits)
    _same(dict(cache.items()), want)  # recycled memory holds the same numbers: the masked pattern is 0 again
    assert address in {a.ctypes.data for a in cache.values()} | {again.ctypes.data}


# ---- what the user holds is never written by a later pass ---------------------------------------------


@pytest.mark.slow
def test_views_and_kept_activations_are_never_overwritten(pool):
    """Views of the logits and of cache entries outlive their arrays, and a hook keeps references
    to every activation it is shown (on recycled memory here: [1, 400, 2000] logits are 6 MiB);
    passes of other tokens, with and without hooks and caches, change none of them."""
    cfg = Config(d_model=64, n_layers=2, n_heads=2, d_mlp=256, d_vocab=2000, n_ctx=400)
    model = random_model(cfg, seed=2)
    rng = np.random.default_rng(5)
    a, b = (rng.integers(0, cfg.d_vocab, (1, 400)) for _ in range(2))
    logits, cache = model.run_with_cache(a)
    kept = {"logits": logits[0, 7:300], "logits'": logits.T}  # views; the arrays themselves dropped below
    kept.update({k: v[..., 1:] for k, v in cache.items()})
    seen = {}

    def keep(x, hook):  # a hook keeping the very array it is shown, every point
        seen[hook.name] = x

    stream = model(a, stop_at_layer=1)[0]  # a view of the stream a pass handed out
    model.run_with_hooks(a, fwd_hooks=[(lambda name: True, keep)])
    assert len(seen) > 20
    kept.update({"stream": stream, **{"hook " + k: v for k, v in seen.items()}})
    want = {k: v.copy() for k, v in kept.items()}
    del logits, cache, stream, seen
    gc.collect()
    for _ in range(2):  # the memory of the dropped arrays is reused by these
        model(b), model.run_with_cache(b), model(b, stop_at_layer=1)
        model.run_with_hooks(b, fwd_hooks=[("blocks.1.hook_resid_pre", lambda x, hook: x * 2)])
        with threads.limit(2, **SPLIT):
            model.run_with_cache(b, names=["blocks.0.hook_resid_post", "blocks.1.attn.hook_pattern"])
    for k in want:
        assert np.array_equal(kept[k], want[k]), k


@pytest.mark.slow
def test_threads_taking_and_dropping_recycled_memory_never_share(pool):
    """Four threads allocate, fill, check and drop arrays of two sizes at once: no array ever sees
    another's writes (the pool hands a mapping to one array at a time)."""
    failures = []

    def work(me):
        for i in range(40):
            x = memory.empty((MiB + (i % 2) * MiB,), np.uint8)
            x[...] = me
            time.sleep(0.0005)
            if not (x == me).all():
                failures.append((me, i))
            del x
            gc.collect() if i % 10 == 0 else None

    workers = [threading.Thread(target=work, args=(n,)) for n in range(1, 5)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not failures


FORK = r"""
import gc, os, sys, threading, time
import numpy as np
from refgpt import memory
a = memory.empty((3 * 2**20,), np.uint8); a[...] = 1
b = memory.empty((3 * 2**20,), np.uint8); b[...] = 2
held = threading.Event()
def hold():  # another thread holds the pool's lock at the fork
    with memory._pool.lock:
        held.set(); time.sleep(3)
threading.Thread(target=hold, daemon=True).start(); held.wait()
pid = os.fork()
if pid == 0:
    ok = (a == 1).all() and (b == 2).all()
    del a; gc.collect()  # an inherited array dropped: back to the child's own pool, no lock wait
    c = memory.empty((3 * 2**20,), np.uint8); c[...] = 3  # may reuse a's mapping (the child's copy)
    ok = ok and (b == 2).all() and (c == 3).all()
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
assert (a == 1).all() and (b == 2).all(), "the child's writes reached the parent"
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_has_its_own_pool():
    """A child forked while another thread holds the pool's lock drops and takes recycled memory
    without waiting for that lock, and neither process sees the other's writes."""
    done = subprocess.run([sys.executable, "-c", FORK], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
