"""Issue 17: ``compare`` judges each tensor in blocks of rows (comparison.BLOCK_BYTES), and its report is
the one the whole-tensor judgement gives: same verdicts, first and worst element, maxima and counts;
the signed mean error, RMS error and bias bound equal to the rounding of a blocked sum.

The whole-tensor judgement is the reference's rule, refgpt/reference/compare.py's ``judge``
(tests/whole_compare.py dresses it as the engine's TensorResult): the specification the blocked one must meet. BLOCK_BYTES is forced down to a few rows so that tensors
smaller than a block, exactly a block and a block plus a row are all exercised."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from refgpt.gpt2.activations import log_softmax
from refgpt.oracle import comparison, golden
from refgpt.oracle.comparison import GROWTH, UNIT_ROUNDOFF, TensorResult
from whole_compare import _rms, whole_compare_tensor, whole_logits_summary

# ---- random goldens and candidates with planted errors -------------------------------------------

PLANTS = ("none", "noise", "one large", "several large", "tied large", "bias", "nan", "inf", "huge values", "row factor")


def _reference(kind, rows, last, rng, scale):
    """A reference tensor of this kind with about ``rows`` rows of ``last`` entries, and its name."""
    if kind == "tokens":
        return "tokens", rng.integers(0, 50, size=(1, rows * last))
    if kind == "scalar":
        return "loss_mean", np.asarray(rng.normal() * scale)
    if kind in ("scores", "grad pattern"):
        heads = max(1, rows // last)
        x = rng.normal(size=(1, heads, last, last)) * scale  # [batch, head, pos, key_pos]
        if kind == "scores":
            x[..., ~np.tril(np.ones((last, last), dtype=bool))] = -np.inf  # the causal mask
            return "blocks.0.attn.hook_attn_scores", x
        return "grad.blocks.0.attn.hook_pattern", x
    if kind == "logits":
        return "logits", rng.normal(size=(1, rows, last)) * scale  # [batch, pos, d_vocab]
    if kind == "probs":
        return "probs", np.exp(log_softmax(rng.normal(size=(1, rows, last)) * 3))  # [batch, pos, d_vocab]
    if kind == "pattern":
        heads = max(1, rows // last)
        x = rng.normal(size=(1, heads, last, last)) * 3  # [batch, head, pos, key_pos]
        x[..., ~np.tril(np.ones((last, last), dtype=bool))] = -np.inf
        return "blocks.0.attn.hook_pattern", np.exp(log_softmax(x))
    if kind == "log_probs":
        return "log_probs", log_softmax(rng.normal(size=(1, rows, last)) * 3)  # [batch, pos, d_vocab]
    if kind == "grad b_K":
        return "grad.blocks.0.attn.b_K", rng.normal(size=(rows, last)) * scale * 1e-12  # [head, d_head]
    return "blocks.0.hook_resid_pre", rng.normal(size=(rows, last) if rows % 2 else (1, rows, last)) * scale


def _candidate(r, plant, u, rng):
    c = np.array(r, dtype=np.float64 if r.dtype.kind == "f" else r.dtype)
    if r.dtype.kind in "iub":
        if plant != "none" and c.size:
            c.flat[rng.integers(c.size, size=1 + int(rng.integers(3)))] += 1
        return c
    finite = np.isfinite(c)
    if plant != "none":  # rounding-sized noise everywhere
        c[finite] += rng.normal(size=int(finite.sum())) * u * np.abs(c[finite]) * rng.uniform(0, 8)
    if c.size and plant in ("one large", "several large", "nan", "inf"):
        where = rng.integers(c.size, size=1 if plant != "several large" else 1 + int(rng.integers(c.size)))
        c.flat[where] = {"nan": np.nan, "inf": np.inf}.get(plant, 0.0) + (
            c.flat[where] * (1 + rng.normal(size=len(where)) * 1e-2) if plant in ("one large", "several large") else 0)
    if plant == "tied large" and finite.any():  # equal errors at equal values: the worst is the first of them
        where = rng.choice(np.flatnonzero(finite), size=1 + int(rng.integers(4)))
        r.flat[where], c.flat[where] = 0.5, 0.75
    if plant == "row factor" and c.ndim:  # a row's one sum off: the row scaled, some rows far beyond rounding
        c *= 1 + rng.normal(size=(*c.shape[:-1], 1)) * rng.choice([1e-6, 1e-3])
    if plant == "bias":
        c[finite] += rng.uniform(0.5, 40) * u * np.sqrt(np.mean(np.square(r[finite]))) if finite.any() else 0
    return c


def _assert_same(blocked: TensorResult, whole: TensorResult):
    """Everything equal, except the three sums (mean error, RMS error, RMS(X_ref) in the bias bound),
    which may differ by their rounding: relative γ = (2⌈log₂ n⌉ + 4)·2⁻⁵³ of Σ|terms|, and the rows'
    t (exact sums against NumPy's), within 10⁻⁹ of it."""
    b, w = dataclasses.asdict(blocked), dataclasses.asdict(whole)
    n = max(2, math.prod(whole.shape))
    gamma = (2 * math.ceil(math.log2(n)) + 4) * 2.0**-53
    for key in ("rms", "bias_tolerance"):
        if math.isfinite(w[key]) and w[key] != 0:
            assert abs(b[key] - w[key]) <= gamma * abs(w[key]), (key, b[key], w[key])
            b[key] = w[key]
    if w["row_t"] is not None and math.isfinite(w["row_t"]):  # exact sums (blocked) against NumPy's: rounding apart
        assert b["row_t"] is not None and abs(b["row_t"] - w["row_t"]) <= 1e-9 * max(1.0, abs(w["row_t"])), (
            b["row_t"], w["row_t"])
        b["row_t"] = w["row_t"]
    if math.isfinite(w["mean_error"]) and math.isfinite(w["rms"]):
        assert abs(b["mean_error"] - w["mean_error"]) <= gamma * w["rms"], (b["mean_error"], w["mean_error"])
        b["mean_error"] = w["mean_error"]
    np.testing.assert_equal(b, w)


@pytest.fixture
def tiny_blocks(monkeypatch):
    def force(rows_per_block, last):
        monkeypatch.setattr(comparison, "BLOCK_BYTES", 8 * max(1, last) * rows_per_block)
    return force


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["activation", "scores", "grad pattern", "logits", "probs", "pattern", "log_probs",
                             "tokens", "grad b_K", "scalar"]),
       block_rows=st.integers(1, 3), blocks=st.integers(0, 3), extra=st.sampled_from([-1, 0, 1]),
       last=st.integers(1, 7), plant=st.sampled_from(PLANTS), profile=st.sampled_from(["float32", "bfloat16", None]),
       with_log_probs=st.booleans(), with_r_X=st.sampled_from([None, 0.0, 3.0]), seed=st.integers(0, 2**32 - 1))
def test_blocked_judgement_is_the_whole_tensor_one(tiny_blocks, kind, block_rows, blocks, extra, last, plant,
                                                    profile, with_log_probs, with_r_X, seed):
    _check_blocked_against_whole(tiny_blocks, kind, block_rows, blocks, extra, last, plant, profile, with_log_probs,
                                 with_r_X, seed)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["activation", "scores", "grad pattern", "probs", "pattern"]), block_rows=st.integers(1, 4),
       blocks=st.integers(2, 6), extra=st.sampled_from([-1, 0, 1]), last=st.integers(3, 9),
       profile=st.sampled_from(["float32", "bfloat16"]), with_r_X=st.sampled_from([0.0, 3.0]),
       seed=st.integers(0, 2**32 - 1))
def test_blocked_bias_check_is_the_whole_tensor_one(tiny_blocks, kind, block_rows, blocks, extra, last, profile,
                                                     with_r_X, seed):
    """The systematic-error check on tensors large enough to judge (n ≥ 16), with a planted bias."""
    _check_blocked_against_whole(tiny_blocks, kind, block_rows, blocks, extra, last, "bias", profile, False,
                                 with_r_X, seed)


def _check_blocked_against_whole(tiny_blocks, kind, block_rows, blocks, extra, last, plant, profile,
                                 with_log_probs, with_r_X, seed):
    rng = np.random.default_rng(seed)
    rows = max(0, block_rows * blocks + extra)  # fewer rows than a block, exactly blocks, a block and one row
    scale = 1e160 if plant == "huge values" else 10.0 ** rng.uniform(-3, 3)  # 1e160² overflows: _rms's scaled path
    name, r = _reference(kind, rows, last, rng, scale)
    tiny_blocks(block_rows, r.shape[-1] if r.ndim else 1)
    u = UNIT_ROUNDOFF[profile or "float32"]
    c = _candidate(r, plant, u, rng)
    ref = {name: r}
    if name == "logits" and with_log_probs:
        ref["log_probs"] = log_softmax(r)
    if name == "grad.blocks.0.attn.b_K":
        ref["grad.blocks.0.attn.hook_k"] = rng.normal(size=(1, 3, *r.shape)) * 1e-9  # [batch, pos, head, d_head]
    if profile:
        tol = {"profile": profile, "unit_roundoff": u, "growth": GROWTH, "rtol": GROWTH * u, "atol": "…"}
    else:
        tol = {"profile": None, "atol": float(rng.uniform(0, 1e-6)), "rtol": float(rng.uniform(0, 1e-5))}
    conditioning = {name: float(rng.uniform(0, 100)), "log_probs": float(rng.uniform(0, 100))}
    error_rms = None if with_r_X is None else {name: with_r_X, "log_probs": with_r_X}
    row_freedom = {name: float(rng.choice([0.0, 1.0, 100.0]))} if rng.integers(2) else None  # f_X of a format-2 golden
    args = (name, r, c, tol, dict(conditioning), ref, error_rms, row_freedom)
    whole = whole_compare_tensor(*args)
    event(f"{kind}: {whole.status}")
    _assert_same(comparison._compare_tensor(*args), whole)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(block_rows=st.integers(1, 3), blocks=st.integers(1, 3), extra=st.sampled_from([-1, 0, 1]),
       d_vocab=st.integers(1, 9), ties=st.booleans(), ref_has=st.sampled_from(["logits", "log_probs", "both"]),
       cand_has=st.sampled_from(["logits", "log_probs"]), nan=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_blocked_logits_summary_is_the_whole_tensor_one(tiny_blocks, block_rows, blocks, extra, d_vocab, ties,
                                                         ref_has, cand_has, nan, seed):
    rng = np.random.default_rng(seed)
    tiny_blocks(block_rows, d_vocab)
    rows = max(1, block_rows * blocks + extra)
    logits = rng.normal(size=(1, rows, d_vocab)) * 4  # [batch, pos, d_vocab]
    if ties:
        logits = np.round(logits)
    cand_logits = logits + rng.normal(size=logits.shape) * rng.choice([0, 1e-6, 1.0]) + rng.normal(size=(1, rows, 1))
    if nan:
        cand_logits.flat[rng.integers(cand_logits.size)] = np.nan
    ref = {}
    if ref_has in ("logits", "both"):
        ref["logits"] = logits
    if ref_has in ("log_probs", "both"):
        ref["log_probs"] = log_softmax(logits)
    cand = {"logits": cand_logits} if cand_has == "logits" else {"log_probs": log_softmax(cand_logits)}
    blocked, whole = comparison._logits_summary(ref, cand), whole_logits_summary(ref, cand)
    assert blocked.top5_agreement == pytest.approx(whole.top5_agreement, rel=8 * 2.0**-53)
    np.testing.assert_equal(dataclasses.asdict(dataclasses.replace(blocked, top5_agreement=whole.top5_agreement)),
                            dataclasses.asdict(whole))


def test_running_rms_takes_the_overflow_safe_path_across_blocks():
    """Σx² overflows only when summed over blocks; the scaled sum, rescaled as larger values arrive, gives
    max|x|·√mean((x/max|x|)²), the whole-tensor ``_rms``'s overflow-safe value, to rounding."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=1000) * np.geomspace(1.0, 1e300, 1000)  # [1000]: each block's Σx² finite, the total not
    rms = comparison._RootMeanSquare()
    for a in range(0, len(x), 7):
        rms.add(x[a:a + 7])
    assert rms.value() == pytest.approx(_rms(x), rel=32 * 2.0**-53)
    assert math.isfinite(rms.value())


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), bug=st.sampled_from([None, "blocks.1.mlp.b_in", "blocks.0.ln1.w", "unembed.W_U"]),
       rows_per_block=st.integers(1, 3), profile=st.sampled_from([None, "float64"]))
def test_compare_reports_what_the_whole_tensor_compare_reported(tmp_path_factory, monkeypatch, seed, bug,
                                                                rows_per_block, profile):
    """End to end: a streamed golden (with c_X and r_X) against a float32 pass, maybe with a small bug,
    compared with blocks of a few rows and with the whole-tensor judgement: the same report."""
    from random_models import random_model
    from refgpt import Config, Model
    from refgpt.oracle import golden

    cfg = Config(d_model=16, n_layers=2, n_heads=2, d_mlp=32, d_vocab=20, n_ctx=8)
    tokens = np.random.default_rng(seed).integers(0, cfg.d_vocab, (2, 8))
    model = random_model(cfg, seed=seed)
    path = golden.write_streamed(tmp_path_factory.mktemp("g") / "g.safetensors", model, tokens, command=["t"])
    params = dict(model.params)
    if bug:
        params[bug] = params[bug] * (1 + 3e-6)  # a few float32 ulps: a systematic, not elementwise, error
    candidate = golden.compute(Model(cfg, params, dtype="float32"), tokens)
    monkeypatch.setattr(comparison, "BLOCK_BYTES", 8 * rows_per_block)  # 8 bytes a row: blocks of rows_per_block rows
    blocked = comparison.compare(path, candidate, profile=profile)
    monkeypatch.setattr(comparison, "_compare_tensor", whole_compare_tensor)
    monkeypatch.setattr(comparison, "_logits_summary", whole_logits_summary)
    whole = comparison.compare(path, candidate, profile=profile)
    assert [t.name for t in blocked.tensors] == [t.name for t in whole.tensors]
    for b, w in zip(blocked.tensors, whole.tensors):
        _assert_same(b, w)
    assert blocked.logits.top5_agreement == pytest.approx(whole.logits.top5_agreement, rel=8 * 2.0**-53)
    np.testing.assert_equal(dataclasses.asdict(dataclasses.replace(
        blocked.logits, top5_agreement=whole.logits.top5_agreement)), dataclasses.asdict(whole.logits))
    assert blocked.ok == whole.ok and blocked.notes == whole.notes


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(0, 5000), last=st.integers(0, 70000), block_bytes=st.integers(1, 2**23))
def test_compare_blocks_are_threads_row_blocks_as_before(rows, last, block_bytes):
    """Issue 37: compare cuts a tensor into threads.row_blocks (one home for the idea) with its own
    BLOCK_BYTES, and the cut is the one its former copy made, so no verdict can change."""
    from refgpt import threads

    old_step = max(1, block_bytes // (8 * max(1, last)))  # the removed copy, verbatim
    before = [(a, min(a + old_step, rows)) for a in range(0, rows, old_step)] or [(0, 0)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(comparison, "BLOCK_BYTES", block_bytes)
        patch.setattr(threads, "row_blocks", _spy := _Spy(threads.row_blocks))
        assert comparison._row_blocks(rows, last) == before
    assert _spy.calls == 1


class _Spy:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


def test_golden_has_no_dead_as_rows():
    assert not hasattr(golden, "as_rows")  # issue 37: unused; comparison._as_rows is the one in use
