"""The whole-tensor judgement: ``compare``'s code before issue 17, kept verbatim as the
specification the blocked one (refgpt/oracle/comparison.py) must meet. Shared by
tests/oracle/test_blocked_compare.py (blocked against whole, on refgpt's values) and
tests/core/test_plain.py (blocked on refgpt's golden against whole on plain's values)."""

from __future__ import annotations

import numpy as np

from refgpt.gpt2.activations import log_softmax
from refgpt.oracle.comparison import (BIAS_FULL_ELEMENTS, BIAS_GROWTH, BIAS_MIN_ELEMENTS, GROWTH, Element,
                                      LogitsSummary, TensorResult, _F32_TINY, _top_k, _where,
                                      is_zero_in_exact_arithmetic, tensor_scale)
from refgpt.oracle.name_maps import is_gradient, layer_of



def whole_compare_tensor(name, r, c, tol, conditioning, ref, error_rms=None) -> TensorResult:
    res = TensorResult(name, layer_of(name), "ok", list(r.shape), list(c.shape))
    if c.shape != r.shape and r.ndim >= 1 and r.shape[0] == 1 and c.shape == r.shape[1:]:
        c = c[None]  # a candidate without the batch axis, for a batch of one
        res.notes.append("candidate has no batch axis: compared as batch 1")
    if c.shape != r.shape:
        res.status = "shape mismatch"
        return res
    if r.dtype.kind in "iub" or c.dtype.kind in "iub":
        differ = np.argwhere(r != c)  # [n_differ, ndim]
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
    judged_name, jr, jc = name, r64, c64
    if name == "logits":  # shift-invariant: judge log-softmax against log-softmax
        jc = log_softmax(c64)
        jr = np.asarray(ref["log_probs"], np.float64) if "log_probs" in ref else log_softmax(r64)  # [batch, pos, d_vocab]
        judged_name = "log_probs" if "log_probs" in conditioning else "logits"
        res.notes.append("judged shift-invariantly: log-softmax of the logits")
    scale = tensor_scale(name, jr[compared], ref)
    if tol["profile"]:
        u = tol["unit_roundoff"]
        res.rtol = GROWTH * u
        res.atol = GROWTH * u * (conditioning.get(judged_name, 0.0) + scale)
    else:
        res.rtol, res.atol = tol["rtol"], tol["atol"]
    with np.errstate(invalid="ignore"):  # −∞ − −∞ in the masked part, which is not compared
        diff = np.where(compared, np.abs(c64 - r64), 0.0)  # [...] raw error, reported
        jdiff = np.where(compared, np.abs(jc - jr), 0.0)  # [...] judged error
    diff = np.where(np.isnan(diff), np.inf, diff)  # [...] a NaN candidate is infinitely wrong
    jdiff = np.where(np.isnan(jdiff), np.inf, jdiff)  # [...]
    if name == "probs" and tol["profile"]:  # |Δp| = p·|Δlog p|: log_probs' tolerance, relative to p
        limit = (res.atol + res.rtol) * np.abs(np.where(compared, jr, 0.0)) + GROWTH * tol["unit_roundoff"] * _F32_TINY
        res.notes.append("probabilities judged relative to p: |Δp| ≤ p·(log_probs' tolerance)")
    else:
        limit = res.atol + res.rtol * np.abs(np.where(compared, jr, 0.0))  # [...]
    bad = jdiff > limit  # [...]
    res.max_abs = float(diff.max(initial=0.0))
    res.max_rel = res.max_abs / tensor_scale(name, r64[compared], ref)
    res.max_over_tol = float(np.max(np.where(compared, jdiff / np.maximum(limit, _F32_TINY * _F32_TINY), 0.0),
                                    initial=0.0))
    n = int(compared.sum())
    res.frac_out = float(bad.sum() / n) if n else 0.0
    if bad.any():
        res.status = "out of tolerance"
        first = np.unravel_index(int(np.argmax(bad)), bad.shape)
        worst = np.unravel_index(int(np.argmax(np.where(bad, jdiff / np.maximum(limit, _F32_TINY), -1.0))), bad.shape)
        res.first_bad = _element(name, first, jr, jc, limit)
        res.worst = _element(name, worst, jr, jc, limit)
    if tol["profile"] and n and error_rms is not None:
        _check_systematic(res, jr[compared], jc[compared], jdiff[compared], tol["unit_roundoff"],
                          error_rms.get(judged_name, 0.0))
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


def _element(name, index, r, c, limit):
    i = tuple(int(k) for k in index)
    return Element(i, _where(name, i), float(r[i]), float(c[i]), float(limit[i]))


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
