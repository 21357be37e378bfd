"""Issue 17: ``compare`` judges each tensor in blocks of rows (comparison.BLOCK_BYTES), and its report is
the one the whole-tensor judgement gives: same verdicts, first and worst element, maxima and counts;
the signed mean error, RMS error and bias bound equal to the rounding of a blocked sum.

The whole-tensor judgement below is ``compare``'s code before issue 17, kept verbatim as the
specification the blocked one must meet. BLOCK_BYTES is forced down to a few rows so that tensors
smaller than a block, exactly a block and a block plus a row are all exercised."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from refgpt.gpt2.activations import log_softmax
from refgpt.oracle import comparison
from refgpt.oracle import golden
from refgpt.oracle.comparison import (BIAS_FULL_ELEMENTS, BIAS_GROWTH, BIAS_MIN_ELEMENTS, GROWTH, UNIT_ROUNDOFF,
                                      Element, LogitsSummary, RowFreedom, TensorResult, _F32_TINY, _top_k, _where,
                                      is_zero_in_exact_arithmetic, tensor_scale)
from refgpt.oracle.name_maps import is_gradient, layer_of

# ---- the whole-tensor judgement (compare before issue 17) ---------------------------------------


def whole_compare_tensor(name, r, c, tol, conditioning, ref, error_rms=None, row_freedom=None, layout=None) -> TensorResult:
    res = TensorResult(name, layer_of(name), "ok", list(r.shape), list(c.shape))
    if c.shape != r.shape and r.ndim >= 1 and r.shape[0] == 1 and c.shape == r.shape[1:]:
        c = c[None]  # a candidate without the batch axis, for a batch of one
        res.notes.append("candidate has no batch axis: compared as batch 1")
    if c.shape != r.shape:
        res.status = "shape mismatch"
        return res
    if r.dtype.kind in "iub" or c.dtype.kind in "iub":
        differ = np.argwhere(r != c)  # [n_differ, ndim]
        res.n_out, res.n_compared = len(differ), r.size
        if len(differ):
            i = tuple(int(k) for k in differ[0])
            res.status = "values differ"
            res.frac_out = float(len(differ) / r.size)
            res.first_bad = res.worst = Element(i, _where(name, i), float(r[i]), float(c[i]), 0.0)
        return res
    r64, c64 = r.astype(np.float64), c.astype(np.float64)  # [...]
    compared = np.isfinite(r64)  # attention scores: the causal part
    if is_gradient(name) and name.endswith("attn.hook_pattern"):
        compared &= np.tril(np.ones(r.shape[-2:], dtype=bool))  # [pos, key_pos]
        res.notes.append("∂pattern compared on the causal part (above the diagonal no loss depends on it through "
                         "the softmax; llm.c never computes it)")
    freedom = golden.row_freedom_of(name)
    if freedom is not None and freedom[1] and not (tol["profile"] and row_freedom and name in row_freedom):
        freedom = None
    jc, free = c64, None
    if freedom is not None:
        with np.errstate(invalid="ignore", over="ignore"):
            jc, free = golden.row_adjusted(name, r64, c64)  # [...], [rows...]
        bound = GROWTH * tol["unit_roundoff"] * (row_freedom[name] + 1.0) if freedom[1] else None
        raw_free = free
        res.row = RowFreedom(freedom[0], bound)
        free = np.where(compared.any(-1), free, 0.0)  # a row with nothing judged has no factor to judge
        raw_free = free
        size = np.abs(np.where(np.isfinite(free), free, np.inf)).reshape(-1)  # [rows]
        if size.size:
            k = int(np.argmax(size))
            res.row.largest = float(size[k])
            res.row.largest_at = [int(i) for i in np.unravel_index(k, r.shape[:-1])]
        if bound is not None:  # a row beyond the bound, or no mere rescaling, gets no freedom: judged as it is
            beyond = ~(np.abs(free) <= bound) & compared.any(-1)  # [rows...]
            beyond |= ~(np.abs(free) <= comparison.MAX_ROW_FREEDOM[freedom[0]])
            jc = np.where(beyond[..., None], c64, jc)
            free = np.where(beyond, np.nan, free)
        if bound is not None and (size > bound).any():
            k = int(np.flatnonzero(size > bound)[0])
            res.row.rows_out = int((size > bound).sum())
            res.row.first_out = [int(i) for i in np.unravel_index(k, r.shape[:-1])]
            res.row.first_out_value = float(raw_free.reshape(-1)[k] + (1.0 if freedom[0] == "factor" else 0.0))
            if freedom[0] == "factor":
                rr, cc = r64.reshape(-1, r.shape[-1])[k], c64.reshape(-1, r.shape[-1])[k]
                res.row.first_out_sums = (float(np.sum(cc)), float(np.sum(np.where(np.isfinite(rr), rr, 0.0))))
    scale = tensor_scale(name, r64[compared], ref)
    if tol["profile"]:
        u = tol["unit_roundoff"]
        res.rtol = GROWTH * u
        res.atol = GROWTH * u * (conditioning.get(name, 0.0) + scale)
    else:
        res.rtol, res.atol = tol["rtol"], tol["atol"]
    with np.errstate(invalid="ignore"):  # −∞ − −∞ in the masked part, which is not compared
        jdiff = np.where(compared, np.abs(jc - r64), 0.0)  # [...] judged error
    jdiff = np.where(np.isnan(jdiff), np.inf, jdiff)  # [...]
    if name == "probs" and tol["profile"]:
        limit = (res.atol + res.rtol) * np.abs(np.where(compared, r64, 0.0)) + _F32_TINY
        res.notes.append("probabilities judged relative to p: |Δp| ≤ p·(atol + rtol) + float32's smallest normal "
                         "(a port may flush smaller ones to 0)")
    else:
        limit = res.atol + res.rtol * np.abs(np.where(compared, r64, 0.0))  # [...]
    bad = jdiff > limit  # [...]
    res.max_abs = float(jdiff.max(initial=0.0))
    res.max_rel = res.max_abs / scale
    res.max_over_tol = float(np.max(np.where(compared, jdiff / np.maximum(limit, _F32_TINY * _F32_TINY), 0.0),
                                    initial=0.0))
    n = int(compared.sum())
    res.frac_out = float(bad.sum() / n) if n else 0.0
    res.n_out, res.n_compared = int(bad.sum()), n
    if bad.any() or (res.row is not None and res.row.rows_out):
        res.status = "out of tolerance"
    if bad.any():
        first = np.unravel_index(int(np.argmax(bad)), bad.shape)
        worst = np.unravel_index(int(np.argmax(np.where(bad, jdiff / np.maximum(limit, _F32_TINY), -1.0))), bad.shape)
        res.first_bad = _element(name, first, r64, c64, limit, freedom, free)
        res.worst = _element(name, worst, r64, c64, limit, freedom, free)
    if res.row is not None:
        res.notes.append(comparison._row_note(res.row))
    if tol["profile"] and n and error_rms is not None:
        _check_systematic(res, r64[compared], jc[compared], jdiff[compared], tol["unit_roundoff"],
                          error_rms.get(name, 0.0))
    return res


def bias_bound(u, r_X, r) -> float:
    """The most a correct port's mean signed error at a tensor with reference values ``r`` may be
    (``_check_systematic``); 0 when the tensor is too small or only rounding noise to judge."""
    n = r.size
    ref_rms = _rms(r) if n else 0.0
    if n < BIAS_MIN_ELEMENTS or ref_rms <= r_X * 2.0**-24:  # only rounding noise: no bias to see
        return 0.0
    return BIAS_GROWTH * u * (r_X + ref_rms) * max(1.0, np.sqrt(BIAS_FULL_ELEMENTS / n))


def _rms(x) -> float:
    """√mean(x²) of finite values without overflow: the squares of values beyond ~1.3e154 overflow
    float64, so then the RMS is computed as max|x|·√mean((x/max|x|)²) (the same number, scaled);
    otherwise the plain formula, bit for bit."""
    with np.errstate(over="ignore"):
        plain = float(np.sqrt(np.mean(np.square(x))))
    if np.isfinite(plain):
        return plain
    top = float(np.max(np.abs(x)))
    return top * float(np.sqrt(np.mean(np.square(x / top))))


def _check_systematic(res, r, c, err, u, r_X) -> None:
    finite = np.isfinite(c).all()
    res.rms = _rms(err) if finite else float("inf")
    res.mean_error = float(np.mean(c - r)) if finite else float("nan")
    res.bias_tolerance = bias_bound(u, r_X, r) if finite and not is_zero_in_exact_arithmetic(res.name) else 0.0
    if res.bias_tolerance and abs(res.mean_error) > res.bias_tolerance and res.ok:
        res.status = "systematic error"
        res.notes.append(f"every element is within tolerance, but the mean signed error {res.mean_error:.3g} is "
                         f"{abs(res.mean_error) / res.bias_tolerance:.3g}× what rounding gives "
                         f"({res.bias_tolerance:.3g}); RMS error {res.rms:.3g}")


def _element(name, index, r, c, limit, freedom=None, free=None):
    i = tuple(int(k) for k in index)
    e = Element(i, _where(name, i), float(r[i]), float(c[i]), float(limit[i]))
    if freedom is not None and np.isfinite(free[i[:-1]]):
        value = float(free[i[:-1]]) + (1.0 if freedom[0] == "factor" else 0.0)
        e.row_factor, e.row_shift = (value, None) if freedom[0] == "factor" else (None, value)
    return e


def whole_logits_summary(ref, cand) -> LogitsSummary:
    def logp(t):
        if "logits" in t:
            return log_softmax(np.asarray(t["logits"], np.float64))
        return np.asarray(t["log_probs"], np.float64)

    lr, lc = logp(ref), logp(cand)  # [batch, pos, d_vocab]
    if lr.shape != lc.shape:
        return None
    k = min(5, lr.shape[-1])
    top_r = _top_k(lr.reshape(-1, lr.shape[-1]), k).reshape(*lr.shape[:-1], k)  # [batch, pos, k]
    top_c = _top_k(lc.reshape(-1, lc.shape[-1]), k).reshape(*lc.shape[:-1], k)  # [batch, pos, k]
    overlap = (top_r[..., :, None] == top_c[..., None, :]).any(-1).mean(-1)  # [batch, pos]
    with np.errstate(invalid="ignore"):
        kl = np.sum(np.exp(lr) * (lr - lc), axis=-1)  # [batch, pos]
    shift = 0.0
    if "logits" in ref and "logits" in cand:
        d = np.asarray(cand["logits"], np.float64) - np.asarray(ref["logits"], np.float64)  # [batch, pos, d_vocab]
        shift = float(np.max(np.abs(d.mean(-1))))
    return LogitsSummary(float(np.mean(top_r[..., 0] == top_c[..., 0])), float(overlap.mean()),
                         float(np.nan_to_num(kl, nan=np.inf).max()), shift)


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
    which may differ by their rounding: relative γ = (2⌈log₂ n⌉ + 4)·2⁻⁵³ of Σ|terms|."""
    b, w = dataclasses.asdict(blocked), dataclasses.asdict(whole)
    n = max(2, math.prod(whole.shape))
    gamma = (2 * math.ceil(math.log2(n)) + 4) * 2.0**-53
    for key in ("rms", "bias_tolerance"):
        if math.isfinite(w[key]) and w[key] != 0:
            assert abs(b[key] - w[key]) <= gamma * abs(w[key]), (key, b[key], w[key])
            b[key] = w[key]
    if math.isfinite(w["mean_error"]) and math.isfinite(w["rms"]):
        assert abs(b["mean_error"] - w["mean_error"]) <= gamma * w["rms"], (b["mean_error"], w["mean_error"])
        b["mean_error"] = w["mean_error"]
    np.testing.assert_equal(b, w)


@pytest.fixture
def tiny_blocks(monkeypatch):
    def force(rows_per_block, last):
        monkeypatch.setattr(comparison, "BLOCK_BYTES", 8 * max(1, last) * rows_per_block)
    return force


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
