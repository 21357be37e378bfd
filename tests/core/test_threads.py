"""Issue 30: the elementwise work on as many threads as the BLAS uses (refgpt/threads.py).

- How many threads: the BLAS's own count, read from the library NumPy loaded, so
  ``OMP_NUM_THREADS=1`` / ``OPENBLAS_NUM_THREADS=1`` mean one (subprocesses: the BLAS reads them
  when it loads); threadpoolctl, where installed, agrees; without a BLAS to ask, the variables or 1.
- Bit for bit: model(), run_with_cache, loss_and_grads and compare on 1 thread and on 3 (more than
  the cores: blocks really are handed over), with blocks of a few rows so that a small model's
  arrays split into many; and blocked ops equal the whole-array formulas (each row on its own).
(The scratch buffers and recycled memory: tests/core/test_memory.py.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from random_models import random_model, random_tokens
from refgpt import Config, threads
from refgpt.gpt2 import activations
from refgpt.gpt2.layernorm import layer_norm
from refgpt.gpt2.loss import lm_cross_entropy_loss, softmax_cross_entropy, next_token_targets
from refgpt.oracle import comparison, golden

REPO = Path(__file__).resolve().parents[2]
CFG = Config(d_model=16, n_layers=2, n_heads=2, d_mlp=40, d_vocab=37, n_ctx=80)
#: Blocks of ~2 rows and no size below which work stays on one thread: every op splits.
SPLIT = dict(block_bytes=64, parallel_bytes=0)


@pytest.fixture(scope="module", params=["float64", "float32"])
def model(request):
    return random_model(CFG, seed=30, dtype=request.param, scale=1.0)


# ---- how many threads --------------------------------------------------------------------------


def _count_in_subprocess(**env):
    clean = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    code = ("import json, refgpt.threads as t\n"
            "try:\n    from threadpoolctl import threadpool_info\n"
            "    tp = [i['num_threads'] for i in threadpool_info() if i['internal_api'] == 'openblas']\n"
            "except ImportError:\n    tp = []\n"
            "print(json.dumps([t.blas_threads(), t.count(), tp, t._blas_getter() is not None]))")
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env, "PYTHONPATH": os.pathsep.join(sys.path)},
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("variable", ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"])
def test_one_blas_thread_means_one_thread(variable):
    blas, count, tp, found = _count_in_subprocess(**{variable: "1"})
    assert found, "the BLAS NumPy loaded was not found"
    assert blas == count == 1
    assert tp in ([], [1])


def test_the_count_is_the_blas_count():
    blas, count, tp, found = _count_in_subprocess()
    assert found and 1 <= blas == count <= os.cpu_count()
    if tp:
        assert tp == [blas]  # threadpoolctl's view


def test_without_a_blas_to_ask_the_variables_or_one(monkeypatch):
    monkeypatch.setattr(threads, "_blas_getter", lambda: None)
    for name in threads._VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert threads.blas_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.blas_threads() == min(2, threads._cpus())
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")  # OpenBLAS reads its own first
    assert threads.blas_threads() == 1


def test_limit_is_for_this_context_only():
    outer = threads.count()
    with threads.limit(3):
        assert threads.count() == 3
        seen = []
        t = threading.Thread(target=lambda: seen.append(threads.count()))
        t.start(), t.join()
        assert seen == [outer]  # another thread keeps the BLAS's count
        with threads.limit(1):
            assert threads.count() == 1
        assert threads.count() == 3
    assert threads.count() == outer
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError):
            with threads.limit(bad):
                pass


def test_blocks_keep_their_order_errors_and_errstate():
    blocks = threads.row_blocks(10, 1)
    assert blocks[0][0] == 0 and blocks[-1][1] == 10
    with threads.limit(3, block_bytes=3, parallel_bytes=0):
        blocks = threads.row_blocks(10, 1)
        assert blocks == [(0, 3), (3, 6), (6, 9), (9, 10)]
        names = threads.map_blocks(lambda a, b: (a, b, threading.current_thread().name), blocks, 10)
        assert [n[:2] for n in names] == blocks
        assert len({n[2] for n in names}) == 3  # the caller and two workers
        with np.errstate(divide="raise"):  # the caller's errstate holds in the workers
            with pytest.raises(FloatingPointError):
                threads.map_blocks(lambda a, b: np.float64(1.0) / np.float64(a - 6), blocks, 10)

        def nested(a, b):  # a block that splits rows itself runs them on its own thread: no deadlock
            return threads.map_blocks(lambda c, d: (c, d), threads.row_blocks(b - a, 1), 10)

        assert threads.map_blocks(nested, blocks, 10) == [[(0, 3)], [(0, 3)], [(0, 3)], [(0, 1)]]

        def fail(a, b):
            raise KeyError(a)

        with pytest.raises(KeyError) as raised:
            threads.map_blocks(fail, blocks, 10)
        assert raised.value.args == (0,)  # the first block's, as one thread raises it


# ---- bit for bit on 1 and N threads --------------------------------------------------------------


def _same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)
    else:
        assert a == b or (a != a and b != b)


def _both(fn):
    with threads.limit(1, **SPLIT):
        one = fn()
    with threads.limit(3, **SPLIT):
        many = fn()
    return one, many


@pytest.mark.slow
def test_forward_and_cache_are_the_same_on_any_number_of_threads(model):
    tokens = random_tokens(CFG, 70)
    with threads.limit(1):  # the default blocks, mostly one per array: the whole-array numbers
        whole, whole_cache = model(tokens), model.run_with_cache(tokens)[1].cache_dict
    (one, one_cache), (many, many_cache) = _both(lambda: (model(tokens), model.run_with_cache(tokens)[1].cache_dict))
    _same(one, many)
    _same(one_cache, many_cache)
    _same(whole, one)  # rows are independent: small blocks give the whole array's bits
    _same(whole_cache, one_cache)
    loss = _both(lambda: model(tokens, return_type="loss", loss_per_token=True))
    _same(*loss)


def test_loss_and_grads_are_the_same_on_any_number_of_threads(model):
    tokens = random_tokens(CFG, 33)
    one, many = _both(lambda: dataclasses.asdict(model.loss_and_grads(tokens)))
    _same(one, many)


def test_compare_is_the_same_on_any_number_of_threads(monkeypatch):
    reference = random_model(CFG, seed=31)
    tokens = random_tokens(CFG, 40, batch=1)
    ref = golden.compute(reference, tokens)
    params = dict(reference.params)
    params["blocks.1.mlp.b_in"] = params["blocks.1.mlp.b_in"] + 1e-3  # a small bug: some tensors fail
    cand = golden.compute(type(reference)(CFG, params, dtype="float32"), tokens)
    monkeypatch.setattr(comparison, "BLOCK_BYTES", 3 * 8 * CFG.d_vocab)  # 3 rows of logits a block
    one, many = _both(lambda: comparison.compare(ref, cand, profile="float32").to_dict())
    assert one == many
    assert not all(t["status"] == "ok" for t in one["tensors"])


def test_blocked_ops_are_the_whole_array_formulas():
    """Each op by blocks of two rows on three threads = the plain NumPy formula on the whole array."""
    rng = np.random.default_rng(0)
    for dtype in (np.float64, np.float32):
        x = (rng.standard_normal((3, 17, 29)) * 4).astype(dtype)  # [batch, pos, n], n odd: SIMD tails
        g = rng.standard_normal(x.shape).astype(dtype)
        w, b = rng.standard_normal(29).astype(dtype), rng.standard_normal(29).astype(dtype)
        with threads.limit(3, **SPLIT):
            blocked = {"softmax": activations.softmax(x), "log_softmax": activations.log_softmax(x),
                       "layer_norm": layer_norm(x, w, b, 1e-5),
                       **{n: f(x) for n, f in activations.ACTIVATIONS.items()},
                       **{n + "'": f(x, g) for n, f in activations.BACKWARDS.items()},
                       "add": threads.add(x, g), "add row": threads.add(x, w)}
        shifted = x - x.max(-1, keepdims=True)
        centered = x - x.mean(-1, keepdims=True)
        plain = {"softmax": np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True),
                 "log_softmax": shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)),
                 "layer_norm": layer_norm(x, w, b, 1e-5, lambda name, a: a),  # the stepwise path, a hook on each point
                 "add": x + g, "add row": x + w}
        for name, f in activations.ACTIVATIONS.items():
            plain[name] = f(x[None])[0]  # another shape: one block of all rows
        for name, f in activations.BACKWARDS.items():
            plain[name + "'"] = f(x[None], g[None])[0]
        with threads.limit(1):
            plain["gelu_new"] = activations.gelu_new(x.reshape(-1, 29)).reshape(x.shape)
        del centered
        for name in blocked:
            assert blocked[name].dtype == dtype, name
            assert np.array_equal(blocked[name], plain[name]), name


def test_the_loss_by_blocks_is_the_whole_array_loss():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((2, 9, 37)) * 3  # [batch, pos, d_vocab]
    tokens = rng.integers(0, 37, (2, 9))
    shifted = logits[:, :-1] - logits[:, :-1].max(-1, keepdims=True)
    whole = np.log(np.exp(shifted).sum(-1)) - np.take_along_axis(shifted, tokens[:, 1:, None], -1)[..., 0]
    with threads.limit(3, **SPLIT):
        assert np.array_equal(lm_cross_entropy_loss(logits, tokens, per_token=True), whole)
        assert lm_cross_entropy_loss(logits, tokens) == whole.sum() / whole.size
        loss, grad = softmax_cross_entropy(logits, next_token_targets(tokens))
    with threads.limit(1, block_bytes=2**30):
        assert (loss, grad.tolist()) == (lambda r: (r[0], r[1].tolist()))(
            softmax_cross_entropy(logits, next_token_targets(tokens)))


def test_every_block_has_finished_before_the_caller_raises():
    """A failing first block, or a Ctrl-C while the caller waits, is raised only after the workers'
    blocks have finished: none writes into an array once its caller has given up on it."""
    import signal
    import time

    blocks = [(0, 1), (1, 2)]
    finished = []

    def slow(a, b):
        if a == 0:
            raise ValueError("first")
        time.sleep(0.3)
        finished.append(a)

    with threads.limit(2, parallel_bytes=0):
        with pytest.raises(ValueError):
            threads.map_blocks(slow, blocks, 2)
        assert finished == [1]

        def interrupt(signum, frame):
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            with pytest.raises(KeyboardInterrupt):
                threads.map_blocks(lambda a, b: time.sleep(0.3) or finished.append(a) if a else None, blocks, 2)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert finished == [1, 1]


BITS = r"""
import hashlib
from random_models import random_model, random_tokens
from refgpt import Config, threads
cfg = Config(d_model=128, n_layers=2, n_heads=4, d_mlp=512, d_vocab=3000, n_ctx=300)  # [300, 512]: > PARALLEL_BYTES
digest = hashlib.sha256()
for dtype in ("float64", "float32"):
    model = random_model(cfg, seed=3, dtype=dtype, scale=1.0)
    for T in (1, 300):
        tokens = random_tokens(cfg, T)
        digest.update(model(tokens).tobytes())
        _, cache = model.run_with_cache(tokens)
        for name in sorted(cache.keys()):
            digest.update(name.encode() + cache[name].tobytes())
print(threads.count(), digest.hexdigest())
"""


@pytest.mark.slow
def test_one_thread_for_everything_gives_the_same_bits():
    """The whole process on one thread (OMP_NUM_THREADS=1: the BLAS's products too, and refgpt's
    blocks follow it) and on the BLAS's default count give the same logits and cache, bit for bit,
    at a size where the blocks really go to the threads (the default block and hand-off sizes)."""
    clean = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    runs = {}
    for n in ("1", None):
        env = {**clean, "PYTHONPATH": os.pathsep.join(sys.path), **({"OMP_NUM_THREADS": n} if n else {})}
        done = subprocess.run([sys.executable, "-c", BITS], env=env, capture_output=True, text=True, check=True)
        count, digest = done.stdout.split()
        runs[int(count)] = digest
    assert 1 in runs and len(set(runs.values())) == 1, runs
