"""Local verdicts stream (refgpt/oracle/local.py, ``_Held``): a tensor is read when an op first
needs it and let go when the walk leaves its block, the weights rounded a block's at a time, so
what the walk holds does not grow with the model's depth — measured here with tracemalloc (NumPy
reports its buffers to it) on a model 2 and 6 blocks deep, nothing else changed; with gradients
too, the backward walked block by block from the last, reading a block's activations again when it
gets there (``local._backward``). And the golden's
error model makes each pass's probabilities only when it reads them (refgpt/oracle/golden.py,
``_Probs``), one pass's at a time. The cost at GPT-2 small's and medium's shapes is measured in
benchmarks/bench_local.py (RESULTS.md, "local-cost")."""

from __future__ import annotations

import tracemalloc
import weakref

import numpy as np
import pytest

from local_ports import port_forward
from random_models import random_params
from refgpt import Config, Model
from refgpt.oracle import golden, local
from refgpt.oracle.gradients import compute_gradients


def _walk_peak(n_layers, backward=False):
    """(tracemalloc's peak during local.judge beyond what was held before it, one block's float64
    activations of a row, and their gradients if ``backward``) for a float32 port of a model
    ``n_layers`` deep: the NumPy port's forward, or refgpt's own float32 forward and backward."""
    cfg = Config(d_model=32, n_layers=n_layers, n_heads=4, d_mlp=128, d_vocab=100, n_ctx=64)
    params = random_params(cfg, seed=1, scale=0.3)
    tokens = np.random.default_rng(0).integers(0, cfg.d_vocab, (1, 32))
    if backward:
        model = Model(cfg, params, dtype="float32")
        logits, cache = model.run_with_cache(tokens)  # [batch, pos, d_vocab]
        acts = {**cache.cache_dict, "logits": logits, **compute_gradients(model, tokens)}
    else:
        acts = port_forward(params, cfg, tokens, "float32")  # [batch, pos, …] float32 each
    block = sum(a[0].size * 8 for name, a in acts.items()
                if name.startswith(("blocks.0.", "grad.blocks.0.")))  # float64 bytes
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


@pytest.mark.slow  # seconds: tracemalloc slows every allocation
def test_local_verdicts_of_the_backward_hold_a_block_not_the_model():
    """With gradients, the rows were held whole for the backward: four blocks more added 4.77
    blocks' float64 activations and gradients to the peak (measured before the change: 3.59 blocks
    at 2 layers, 8.35 at 6). Streamed, they add 0.21 (the verdicts' bookkeeping), and the peak is
    1.41 blocks at 2 layers, 1.62 at 6 (measured 2026-12-06): below 2, one block read while the
    last's gradient handed on and the block's parameters' gradients are judged."""
    shallow, block = _walk_peak(2, backward=True)
    deep, _ = _walk_peak(6, backward=True)
    assert deep - shallow < 0.5 * block, (shallow, deep, block)
    assert deep < 2 * block, (deep, block)


def test_the_golden_error_model_makes_one_pass_probabilities_at_a_time():
    """ErrorModel.add reads the reference's and each pass's exp(log_probs) when it gets to it: at
    most the reference's and one pass's are alive at once (at GPT-2 medium's shape, T = 1024, each
    is 400 MB; the four were held together before, 0.8 GB more at the golden's peak)."""
    made, most = [], [0]  # weak references to each array made, the most alive at once

    class Counted(golden._Probs):
        def __array__(self, dtype=None, copy=None):
            a = super().__array__(dtype, copy)
            made.append(weakref.ref(a))
            most[0] = max(most[0], sum(ref() is not None for ref in made))
            return a

    rng = np.random.default_rng(0)
    log_probs = [np.log(rng.dirichlet(np.ones(50), (2, 5))) for _ in range(4)]  # [batch, pos, d_vocab]
    errors = golden.ErrorModel()
    errors.add("probs", Counted(log_probs[0]), *(Counted(a.astype(np.float32)) for a in log_probs[1:]))
    assert most[0] == 2
    direct = golden.ErrorModel()
    direct.add("probs", np.exp(log_probs[0]), *(np.exp(a.astype(np.float32).astype(np.float64)) for a in log_probs[1:]))
    assert (errors.c, errors.rms, errors.freedom) == (direct.c, direct.rms, direct.freedom)  # the same numbers


@pytest.mark.slow  # seconds: tracemalloc slows every allocation
def test_the_output_ops_go_a_block_of_positions_at_a_time(monkeypatch):
    """log_softmax, softmax and the loss read a row's [pos, d_vocab] a block of positions at a time: at
    GPT-2 small's shape and T = 1024 a row of it is 412 MB in float64, and the bounds' temporaries
    held whole peaked at 3.7 GB (bench_local.py, T = 1024: 3.9 GB RssAnon above the weights).
    Measured here with blocks of 1/16 of a row: the peak was 11.1 rows' float64 logits held whole,
    0.8 streamed."""
    monkeypatch.setattr(local, "BLOCK_BYTES", 128 * 2000 * 8 // 16)
    cfg = Config(d_model=16, n_layers=1, n_heads=2, d_mlp=32, d_vocab=2000, n_ctx=128)
    params = random_params(cfg, seed=1, scale=0.3)
    tokens = np.random.default_rng(0).integers(0, cfg.d_vocab, (1, 128))
    acts = port_forward(params, cfg, tokens, "float32")  # [batch, pos, …] float32 each
    targets = np.random.default_rng(1).integers(0, cfg.d_vocab, (1, 128))  # [batch, pos]
    shifted = acts["logits"] - acts["logits"].max(-1, keepdims=True)  # [batch, pos, d_vocab] float32
    acts["log_probs"] = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    acts["probs"] = np.exp(acts["log_probs"])
    acts["loss"] = -np.take_along_axis(acts["log_probs"], targets[..., None], -1)[..., 0]  # [batch, pos]
    row = 128 * 2000 * 8  # one row's logits in float64
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        report = local.judge(params, cfg, tokens, acts, "float32", targets=targets)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert report.first is None and {"log_probs", "probs"} <= {v.name for v in report.ops if v.skipped is None}
    assert peak < 1.5 * row, peak / row


@pytest.mark.parametrize("plant", [None, "key_scale"])
def test_the_backward_in_blocks_gives_the_verdicts_of_one_block(monkeypatch, plant):
    """Streaming changes when the walk reads, not what it judges: the NumPy port's float32 forward and
    backward (3 blocks, 2 rows; ∂key's scale wrong at layer 1, or no bug) judged with 4 KiB blocks (a
    head, two positions, a few columns or vocabulary entries at a time) and with one block per op (as
    before streaming) give the same ops in the same order, flagged alike at the same indices, their
    ratios equal to 1e-7 relative: float64 sums split in blocks may round in their last bit (BLAS's
    kernels for a few rows, a block of einsum's columns; measured 2026-12-06 on 66 reports of
    tests/oracle/test_local_backward.py's ports, three precisions, both kinds of bound: 5.2e-8)."""
    from local_ports import port_backward

    cfg = Config(d_model=64, n_layers=3, n_heads=4, d_mlp=256, d_vocab=200, n_ctx=32)
    params = random_params(cfg, seed=1, scale=0.3)
    tokens = np.random.default_rng(0).integers(0, cfg.d_vocab, (2, 24))
    acts = port_forward(params, cfg, tokens, "float32")
    acts.update(port_backward(params, cfg, tokens, acts, "float32", plant=plant, layer=1))
    reports = []
    for block_bytes in (2**40, 4096):
        monkeypatch.setattr(local, "BLOCK_BYTES", block_bytes)
        reports.append(local.judge(params, cfg, tokens, acts, "float32"))
    whole, blocked = reports
    assert [v.name for v in whole.ops] == [v.name for v in blocked.ops]
    where = lambda report: [(v.flagged, v.index, v.skipped) for v in report.ops]  # noqa: E731
    assert where(whole) == where(blocked)
    assert np.allclose([v.ratio for v in whole.ops], [v.ratio for v in blocked.ops], rtol=1e-7, atol=0)
    assert (whole.first is None) == (plant is None)
    if plant:
        assert whole.first.name == blocked.first.name == "grad.blocks.1.attn.hook_k"
