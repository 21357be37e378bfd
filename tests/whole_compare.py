"""The whole-tensor judgement: ``compare``'s code before issue 17, kept verbatim as the
specification the blocked one (refgpt/oracle/comparison.py) must meet. Shared by
tests/oracle/test_blocked_compare.py (blocked against whole, on refgpt's values) and
tests/core/test_plain.py (blocked on refgpt's golden against whole on plain's values)."""

from __future__ import annotations

import numpy as np

from refgpt.gpt2.activations import log_softmax
from refgpt.oracle import comparison, golden
from refgpt.oracle.comparison import (BIAS_FULL_ELEMENTS, BIAS_GROWTH, BIAS_MIN_ELEMENTS, GROWTH, UNIT_ROUNDOFF,
                                      Element, LogitsSummary, RowFreedom, TensorResult, _F32_TINY, _top_k, _where,
                                      is_zero_in_exact_arithmetic, tensor_scale)
from refgpt.oracle.name_maps import is_gradient, layer_of


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
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(compared, jc - r64, 0.0).reshape(-1, r.shape[-1] if r.ndim else 1)  # [rows, last]
        count = compared.reshape(diff.shape).sum(axis=-1)  # [rows]
        row_means = diff.sum(axis=-1)[count > 0] / count[count > 0]  # [rows with anything compared]
        _check_systematic(res, r64[compared], jc[compared], jdiff[compared], tol["unit_roundoff"],
                          error_rms.get(name, 0.0), row_means)
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


def _check_systematic(res, r, c, err, u, r_X, row_means) -> None:
    finite = np.isfinite(c).all()
    res.rms = _rms(err) if finite else float("inf")
    res.mean_error = float(np.mean(c - r)) if finite else float("nan")
    res.bias_tolerance = bias_bound(u, r_X, r) if finite and not is_zero_in_exact_arithmetic(res.name) else 0.0
    res.row_t = row_t = _row_t(row_means) if finite else None
    if res.bias_tolerance and abs(res.mean_error) > res.bias_tolerance and res.ok:
        rows = "" if row_t is None else f"; the rows' mean errors lie {abs(row_t):.3g} standard errors from 0"
        if row_t is not None and abs(row_t) < comparison.ROW_T:
            res.notes.append(f"the mean signed error {res.mean_error:.3g} is {abs(res.mean_error) / res.bias_tolerance:.3g}× "
                             f"the bias bound ({res.bias_tolerance:.3g}), but the rows do not agree about it{rows} "
                             f"(< {comparison.ROW_T:g}): rounding shared within rows, not a systematic error")
            return
        res.status = "systematic error"
        res.notes.append(f"every element is within tolerance, but the mean signed error {res.mean_error:.3g} is "
                         f"{abs(res.mean_error) / res.bias_tolerance:.3g}× what rounding gives "
                         f"({res.bias_tolerance:.3g}){rows}; RMS error {res.rms:.3g}")


def _row_t(m):
    """The rows' mean errors m [R]: mean(m)/(sd(m)/√R), ±∞ if all equal; None below ROW_T_MIN_ROWS rows."""
    R = len(m)
    if R < comparison.ROW_T_MIN_ROWS or not np.isfinite(m).all():
        return None
    top = float(np.max(np.abs(m)))
    if top == 0.0:
        return 0.0
    m = m / top
    mean = float(np.mean(m))
    var = float(np.var(m, ddof=1))
    if var <= 0.0:
        return float(np.copysign(np.inf, mean)) if mean else 0.0
    return mean / np.sqrt(var / R)


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
