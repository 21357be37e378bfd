"""Local verdicts stream (refgpt/oracle/local.py, ``_Held``): a tensor is read when an op first
needs it and let go when the walk leaves its block, the weights rounded a block's at a time, so
what the walk holds does not grow with the model's depth — measured here with tracemalloc (NumPy
reports its buffers to it) on a model 2 and 6 blocks deep, nothing else changed. And the golden's
error model makes each pass's probabilities only when it reads them (refgpt/oracle/golden.py,
``_Probs``), one pass's at a time. The cost at GPT-2 small's and medium's shapes is measured in
benchmarks/bench_local.py (RESULTS.md, "local-cost")."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from local_ports import port_forward
from random_models import random_params
from refgpt import Config, threads
from refgpt.oracle import golden, local


def _walk_peak(n_layers):
    """(tracemalloc's peak during local.judge beyond what was held before it, one block's float64
    activations of a row) for a float32 port of a model ``n_layers`` deep."""
    cfg = Config(d_model=32, n_layers=n_layers, n_heads=4, d_mlp=128, d_vocab=100, n_ctx=64)
    params = random_params(cfg, seed=1, scale=0.3)
    tokens = np.random.default_rng(0).integers(0, cfg.d_vocab, (1, 32))
    acts = port_forward(params, cfg, tokens, "float32")  # [batch, pos, …] float32 each
    block = sum(a[0].size * 8 for name, a in acts.items() if name.startswith("blocks.0."))  # float64 bytes
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        report = local.judge(params, cfg, tokens, acts, "float32")
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert report.first is None
    return peak, block


@pytest.mark.slow  # seconds: tracemalloc slows every allocation
def test_local_verdicts_hold_a_block_not_the_model():
    """Four blocks more would add four blocks' float64 activations and rounded weights to the peak if
    the walk held every tensor it read (it did: 6.1 blocks' activations more, measured before the
    change); streamed, the peak is the same but for the verdicts' bookkeeping (measured: 0.16)."""
    shallow, block = _walk_peak(2)
    deep, _ = _walk_peak(6)
    assert deep - shallow < 0.5 * block, (shallow, deep, block)


def test_the_golden_error_model_reads_probabilities_a_block_of_rows_at_a_time(monkeypatch):
    """ErrorModel.add reads the reference's and each pass's exp(log_probs) a block of rows at a time
    (``_Probs``): no whole p is made, and beside the one array of compared errors the add holds a
    few blocks (at GPT-2 medium's shape, T = 1024, a whole p is 400 MB; the four were held together
    once, then two; benchmarks/RESULTS.md, memory-issue38)."""
    monkeypatch.setattr(golden, "ERROR_BLOCK_BYTES", 2**16)  # 64 kB blocks: 2 rows of 4,000 entries
    rng = np.random.default_rng(0)
    log_probs = [np.log(rng.dirichlet(np.ones(4000), (2, 64))) for _ in range(4)]  # [batch, pos, d_vocab], 4 MB each
    whole = log_probs[0].nbytes
    errors = golden.ErrorModel()
    passes = [golden._Probs(log_probs[0]), *(golden._Probs(a.astype(np.float32)) for a in log_probs[1:])]
    tracemalloc.start()
    try:
        with threads.limit(2):  # two blocks at once, on any machine
            errors.add("probs", *passes)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the compared errors (at most one p) and, per thread, a block's ~10 temporaries (its p and the
    # pass's, row_adjusted's, masks, the compared entries): measured 1.17 p; one whole p made is 2 p
    assert peak < whole + 2 * 10 * golden.ERROR_BLOCK_BYTES, peak / whole
    direct = golden.ErrorModel()
    direct.add("probs", np.exp(log_probs[0]), *(np.exp(a.astype(np.float32).astype(np.float64)) for a in log_probs[1:]))
    assert (errors.c, errors.rms, errors.freedom) == (direct.c, direct.rms, direct.freedom)  # the same numbers
