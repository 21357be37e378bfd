"""The whole-tensor judgement as the engine reports it: refgpt/reference/compare.py's ``judge`` (the
rule, written to be read) dressed as a ``comparison.TensorResult`` with the engine's notes, so that
the blocked, threaded comparison (refgpt/oracle/comparison.py) can be held to it field by field.
Shared by tests/oracle/test_blocked_compare.py (blocked against whole, on refgpt's values) and
tests/core/test_plain.py (blocked on refgpt's golden against whole on the reference's values)."""

from __future__ import annotations

import numpy as np

from refgpt.gpt2.activations import log_softmax
from refgpt.oracle import comparison
from refgpt.oracle.comparison import Element, LogitsSummary, RowFreedom, TensorResult, _top_k, _where
from refgpt.oracle.name_maps import layer_of
from refgpt.reference import compare as rule
from refgpt.reference.compare import rms as _rms  # noqa: F401  (the whole-tensor RMS, for the tests)


def whole_compare_tensor(name, r, c, tol, conditioning, ref, error_rms=None, row_freedom=None, layout=None) -> TensorResult:
    profile = bool(tol["profile"])
    f_X = row_freedom[name] if profile and row_freedom and name in row_freedom else None
    v = rule.judge(name, r, c, u=tol["unit_roundoff"] if profile else None, atol=tol.get("atol"), rtol=tol.get("rtol"),
                   c_X=conditioning.get(name, 0.0), r_X=None if error_rms is None else error_rms.get(name, 0.0),
                   f_X=f_X, reference=ref)
    res = TensorResult(name, layer_of(name), v.status, list(r.shape), list(c.shape))
    if v.no_batch_axis:
        res.notes.append("candidate has no batch axis: compared as batch 1")
    if v.status == "shape mismatch":
        return res
    if r.dtype.kind in "iub" or c.dtype.kind in "iub":
        res.n_out, res.n_compared, res.frac_out = v.n_out, v.n_compared, float(v.frac_out)
        if v.first_bad is not None:
            res.first_bad = res.worst = _element(name, v.first_bad, None)
        return res
    if name.startswith("grad.") and name.endswith("attn.hook_pattern"):
        res.notes.append("∂pattern compared on the causal part (above the diagonal no loss depends on it through "
                         "the softmax; llm.c never computes it)")
    if name == "probs" and profile:
        res.notes.append("probabilities judged relative to p: |Δp| ≤ p·(atol + rtol) + float32's smallest normal "
                         "(a port may flush smaller ones to 0)")
    for key in ("atol", "rtol", "max_abs", "max_rel", "max_over_tol", "n_out", "n_compared", "rms", "mean_error",
                "bias_tolerance", "row_t"):
        setattr(res, key, getattr(v, key))
    res.frac_out = float(v.frac_out)
    if v.rows is not None:
        res.row = RowFreedom(**vars(v.rows))
        res.notes.append(comparison._row_note(res.row))
    kind = v.rows.kind if v.rows is not None else None
    res.first_bad, res.worst = (_element(name, e, kind) if e is not None else None for e in (v.first_bad, v.worst))
    if v.bias_forgiven:
        res.notes.append(f"the mean signed error {res.mean_error:.3g} is {abs(res.mean_error) / res.bias_tolerance:.3g}× "
                         f"the bias bound ({res.bias_tolerance:.3g}), but the rows do not agree about it; the rows' "
                         f"mean errors lie {abs(res.row_t):.3g} standard errors from 0 (< {rule.ROW_T:g}): rounding "
                         "shared within rows, not a systematic error")
    elif v.status == "systematic error":
        rows = "" if v.row_t is None else f"; the rows' mean errors lie {abs(v.row_t):.3g} standard errors from 0"
        res.notes.append(f"every element is within tolerance, but the mean signed error {res.mean_error:.3g} is "
                         f"{abs(res.mean_error) / res.bias_tolerance:.3g}× what rounding gives "
                         f"({res.bias_tolerance:.3g}){rows}; RMS error {res.rms:.3g}")
    return res


def _element(name, e: rule.Element, kind) -> Element:
    out = Element(e.index, _where(name, e.index), e.reference, e.candidate, e.tolerance)
    if e.row_free is not None:
        if kind == "factor":
            out.row_factor = e.row_free + 1.0
        else:
            out.row_shift = e.row_free
    return out


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
    return LogitsSummary(float(np.mean(top_r[..., 0] == top_c[..., 0])), float(np.mean(overlap)),
                         float(np.nan_to_num(kl, nan=np.inf).max()), shift)
