"""The rule that judges a port: one tensor of the candidate against the golden file's, whole.

A port's tensor X passes when every element is within its tolerance and its errors are not
systematic. With a format's unit roundoff u (``UNIT_ROUNDOFF``) and what the golden file measured
at X — c_X, the largest error refgpt's float32 passes made there, r_X their RMS error, f_X the
largest row factor or shift, all in units of 2⁻²⁴ (golden.py) — and S_X = max(1, max|X_ref|)
(a gradient's own max|X_ref|):

    1. elementwise   |c − r| ≤ atol + rtol·|r|,  rtol = G·u,  atol = G·u·(c_X + S_X),  G = 64
    2. rows          a softmax row (probs, attention patterns) is judged after its one factor is
                     divided out, a log-softmax row (log_probs) after its one shift is taken away,
                     logits after any shift; the factor − 1 or the shift itself must be ≤ G·u·(f_X + 1)
    3. bias          |mean(c − r)| ≤ 4·u·(r_X + RMS(r))·max(1, √(128/n))  (n ≥ 16 elements), unless
                     the rows' mean errors disagree (their t < 5): a wrong constant is small
                     everywhere but the same everywhere
    probabilities (probs) are judged relative to p: |Δp| ≤ p·(atol + rtol) + float32's smallest normal;
    a non-finite reference element (masked scores, −∞) is not judged, nor ∂pattern above the
    diagonal; rule 3 only where rules 1–2 passed, never for ∂b_K (zero in exact arithmetic) nor a
    tensor whose RMS is only rounding (≤ r_X·2⁻²⁴); integer tensors (tokens) must be equal.

With explicit ``atol``/``rtol`` instead of u, rule 1 is NumPy's ``allclose`` rule, and logits are
still judged after their row shift. G is measured,
not derived (docs/oracle.md; benchmarks/oracle_tolerance.py). The engine's comparison
(refgpt/oracle/comparison.py) judges in blocks of rows, threaded and memory-mapped, and reports
more; it takes the rule's constants, the row rule and the bias bound from here (its own row t sums
exactly, block by block) and is tested to give the same verdicts as ``judge``
(tests/oracle/test_blocked_compare.py).
"""

import math
import re
from dataclasses import dataclass, field

import numpy as np

#: Unit roundoff of each format: half the distance from 1 to the next representable number.
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
GROWTH = 64  # G, rule 1
F32_TINY = float(np.finfo(np.float32).tiny)  # the least tolerance of a probability (a port may flush below it)
BIAS_GROWTH, BIAS_MIN_ELEMENTS, BIAS_FULL_ELEMENTS = 4, 16, 128  # rule 3
ROW_T, ROW_T_MIN_ROWS = 5.0, 4  # rule 3: the rows must agree (t ≥ 5) where there are ≥ 4 of them
#: A factor within [1/2, 3/2] (|factor − 1| ≤ 1/2; a shift within ±ln 2) rescales a row and is
#: taken out; beyond, the row has another shape and is judged as it is.
MAX_ROW_FREEDOM = {"factor": 0.5, "shift": math.log(2.0)}
FACTOR_ENTRIES = 64  # a softmax row's factor is read from its 64 largest reference entries
GRAD = "grad."  # a golden's gradients: "grad." + the name of what was differentiated


def inner_name(name):
    """A decode golden's ``step.3.logits`` → ``logits``; any other name as it is."""
    m = re.fullmatch(r"step\.\d+\.(.+)", name)
    return m.group(1) if m else name


def is_gradient(name):
    return name.startswith(GRAD)


def row_freedom_of(name):
    """("factor" | "shift", bounded?) for a tensor judged up to one factor or shift per row; else None."""
    name = inner_name(name)
    if name in ("logits", "next_logits"):
        return "shift", False  # logits are defined up to a constant per position
    if name == "log_probs":
        return "shift", True
    if name == "probs" or (name.endswith("attn.hook_pattern") and not is_gradient(name)):
        return "factor", True
    return None


def weighted_median_ratio(r, x, k=FACTOR_ENTRIES):
    """[..., n] → [..., 1]: per row, the median of x/r over the k largest entries of r > 0, each
    weighted by r; 1 for a row with no positive r, NaN if x is NaN at one of those entries."""
    rows_r = r.reshape(-1, r.shape[-1]) if r.ndim else r.reshape(1, 1)  # [rows, n]
    rows_x = x.reshape(rows_r.shape)
    n = rows_r.shape[-1]
    clean = np.where(np.isfinite(rows_r) & (rows_r > 0), rows_r, 0.0)  # [rows, n]
    if n > k:
        top = np.argpartition(-clean, k - 1, axis=-1)[:, :k]  # [rows, k] the k largest
    else:
        top = np.broadcast_to(np.arange(n), clean.shape)  # [rows, n]
    w = np.take_along_axis(clean, top, -1)  # [rows, k]
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(w > 0, np.take_along_axis(rows_x, top, -1) / np.where(w > 0, w, 1.0), np.inf)  # [rows, k]
    nan = (np.isnan(ratio) & (w > 0)).any(-1)  # [rows]
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    order = np.argsort(ratio, axis=-1, kind="stable")  # [rows, k]
    w_sorted = np.take_along_axis(w, order, -1)  # [rows, k]
    half = w_sorted.sum(-1, keepdims=True) / 2  # [rows, 1]
    at = np.argmax(np.cumsum(w_sorted, -1) >= half, axis=-1)[:, None]  # [rows, 1] the weighted median
    median = np.take_along_axis(np.take_along_axis(ratio, order, -1), at, -1)  # [rows, 1]
    median = np.where(half > 0, median, 1.0)
    median = np.where(nan[:, None], np.nan, median)
    return median.reshape(*r.shape[:-1], 1) if r.ndim else median.reshape(())


def row_adjusted(name, r, x):
    """(x with its per-row factor or shift relative to r taken out, the factor − 1 or shift per row
    [...]) for a tensor of ``row_freedom_of``; (x, None) for any other. Both are robust: the factor
    is ``weighted_median_ratio``, the shift the median of x − r where r is finite."""
    freedom = row_freedom_of(name)
    if freedom is None:
        return x, None
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if freedom[0] == "factor":
            free = weighted_median_ratio(r, x)  # [..., 1]
            return np.where(free != 0, x / np.where(free != 0, free, 1.0), x), (free - 1.0)[..., 0]
        used = np.isfinite(r)  # [..., n]
        d = np.where(used, x - r, np.nan)  # [..., n]
        if used.all():
            free = np.median(d, axis=-1, keepdims=True)  # [..., 1]
        else:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a row with nothing used: NaN, made 0 below
                free = np.where(np.isnan(d) & used, np.nan, np.nanmedian(d, axis=-1, keepdims=True))
            free = np.where(used.any(-1, keepdims=True), free, 0.0)
        return x - free, free[..., 0]


def is_zero_in_exact_arithmetic(name):
    """∂loss/∂b_K: softmax(s + c) = softmax(s), so no loss depends on b_K; its values are rounding."""
    return is_gradient(name) and name.endswith("attn.b_K")


def tensor_scale(name, values, reference=None):
    """S_X: max(1, max|X|) for an activation; max|X| for a gradient (F32_TINY if 0); for ∂b_K, the
    size of the sum its rounding comes from, max over (head, d_head) of Σ_{batch, pos} |∂k|."""
    top = float(np.max(np.abs(values), initial=0.0))
    if is_zero_in_exact_arithmetic(name) and reference is not None:
        k = GRAD + name[len(GRAD):-len("b_K")] + "hook_k"
        if k in reference:
            top = max(top, float(np.abs(np.asarray(reference[k], np.float64)).sum(axis=(0, 1)).max(initial=0.0)))
    if is_gradient(name):
        return top if top > 0 else F32_TINY
    return max(1.0, top)


def rms(x):
    """√mean(x²), without overflow: max|x|·√mean((x/max|x|)²) where the squares would overflow."""
    with np.errstate(over="ignore"):
        plain = float(np.sqrt(np.mean(np.square(x))))
    if np.isfinite(plain):
        return plain
    top = float(np.max(np.abs(x)))
    return top * float(np.sqrt(np.mean(np.square(x / top))))


def bias_bound(u, r_X, n, ref_rms):
    """Rule 3's bound on |mean(c − r)| for n compared elements of RMS ``ref_rms``; 0: not judged."""
    if n < BIAS_MIN_ELEMENTS or ref_rms <= r_X * 2.0**-24:  # too few, or only rounding noise
        return 0.0
    return BIAS_GROWTH * u * (r_X + ref_rms) * max(1.0, np.sqrt(BIAS_FULL_ELEMENTS / n))


def row_t(means):
    """mean(m)/(sd(m)/√R) of the rows' mean errors m [R]: ±∞ if all equal; None below ROW_T_MIN_ROWS rows."""
    R = len(means)
    if R < ROW_T_MIN_ROWS or not np.isfinite(means).all():
        return None
    top = float(np.max(np.abs(means)))
    if top == 0.0:
        return 0.0
    m = means / top  # t does not change with the scale, and nothing overflows
    mean, var = float(np.mean(m)), float(np.var(m, ddof=1))
    if var <= 0.0:
        return float(np.copysign(np.inf, mean)) if mean else 0.0
    return mean / np.sqrt(var / R)


@dataclass
class Element:
    index: tuple  # into the reference tensor
    reference: float
    candidate: float
    tolerance: float
    row_free: float | None = None  # the row's factor (or shift) taken out before judging, if any


@dataclass
class Rows:
    """How the row rule (2) was used."""

    kind: str  # "factor" or "shift"
    bound: float | None  # G·u·(f_X + 1); None: any shift is right (logits)
    largest: float = 0.0  # the largest |factor − 1| or |shift| over the rows judged
    largest_at: list | None = None
    rows_out: int = 0  # rows whose factor or shift is beyond the bound
    first_out: list | None = None
    first_out_value: float | None = None  # its factor (or shift)
    first_out_sums: tuple | None = None  # its Σ candidate and Σ reference (factor rows)


@dataclass
class Verdict:
    status: str  # "ok", "out of tolerance", "systematic error", "shape mismatch", "values differ"
    atol: float = 0.0
    rtol: float = 0.0
    max_abs: float = 0.0  # the largest judged |Δ|
    max_rel: float = 0.0  # max_abs / S_X
    max_over_tol: float = 0.0  # the largest |Δ| / tolerance (≤ 1 passes)
    n_compared: int = 0
    n_out: int = 0
    frac_out: float = 0.0
    first_bad: Element | None = None  # the first element out of tolerance, in C order
    worst: Element | None = None  # the element furthest beyond its tolerance
    rows: Rows | None = None
    mean_error: float = 0.0  # rule 3's numbers (profiles, with r_X)
    rms: float = 0.0
    bias_tolerance: float = 0.0
    row_t: float | None = None
    no_batch_axis: bool = False  # the candidate lacked a batch of one
    bias_forgiven: bool = False  # beyond the bias bound, but the rows disagree (t < ROW_T)
    notes: list = field(default_factory=list)

    @property
    def ok(self):
        return self.status == "ok"


def judge(name, r, c, *, u=None, atol=None, rtol=None, c_X=0.0, r_X=None, f_X=None, reference=None):
    """Judge candidate ``c`` against reference ``r`` (the tensor ``name`` of a golden file): with the
    unit roundoff ``u`` of the candidate's format (rules 1–3; c_X, r_X, f_X from the golden file,
    r_X None: no bias rule, f_X None: the bounded row rule unused), or with ``atol`` and ``rtol``.
    ``reference``: the golden's other tensors (∂b_K's scale reads ∂k)."""
    v = Verdict("ok")
    if c.shape != r.shape and r.ndim >= 1 and r.shape[0] == 1 and c.shape == r.shape[1:]:
        c, v.no_batch_axis = c[None], True  # a candidate without the batch axis, for a batch of one
    if c.shape != r.shape:
        v.status = "shape mismatch"
        return v
    if r.dtype.kind in "iub" or c.dtype.kind in "iub":  # integers: equal
        differ = np.argwhere(r != c)  # [n_differ, ndim]
        v.n_out, v.n_compared = len(differ), r.size
        if len(differ):
            i = tuple(int(k) for k in differ[0])
            v.status, v.frac_out = "values differ", len(differ) / r.size
            v.first_bad = v.worst = Element(i, float(r[i]), float(c[i]), 0.0)
        return v
    r64, c64 = r.astype(np.float64), c.astype(np.float64)  # [...]
    compared = np.isfinite(r64)  # [...] attention scores: the causal part
    if is_gradient(name) and name.endswith("attn.hook_pattern"):  # above the diagonal no loss depends on it
        compared &= np.tril(np.ones(r.shape[-2:], dtype=bool))
    judged, free = _rule_2(name, r64, c64, compared, v, u, f_X)
    scale = tensor_scale(name, r64[compared], reference)
    if u is not None:
        v.rtol, v.atol = GROWTH * u, GROWTH * u * (c_X + scale)
    else:
        v.rtol, v.atol = rtol, atol
    with np.errstate(invalid="ignore"):  # −∞ − −∞ in the masked part, which is not compared
        diff = np.where(compared, np.abs(judged - r64), 0.0)  # [...]
    diff = np.where(np.isnan(diff), np.inf, diff)  # a NaN is infinitely wrong
    size = np.abs(np.where(compared, r64, 0.0))  # [...]
    if inner_name(name) == "probs" and u is not None:  # relative to p: a port may flush tiny probabilities to 0
        limit = (v.atol + v.rtol) * size + F32_TINY
    else:
        limit = v.atol + v.rtol * size  # [...] rule 1
    bad = diff > limit  # [...]
    v.max_abs = float(diff.max(initial=0.0))
    v.max_rel = v.max_abs / scale
    v.max_over_tol = float(np.max(np.where(compared, diff / np.maximum(limit, F32_TINY * F32_TINY), 0.0), initial=0.0))
    v.n_compared = int(compared.sum())
    v.n_out = int(bad.sum())
    v.frac_out = v.n_out / v.n_compared if v.n_compared else 0.0
    if bad.any() or (v.rows is not None and v.rows.rows_out):
        v.status = "out of tolerance"
    if bad.any():
        first = np.unravel_index(int(np.argmax(bad)), bad.shape)
        worst = np.unravel_index(int(np.argmax(np.where(bad, diff / np.maximum(limit, F32_TINY), -1.0))), bad.shape)
        v.first_bad, v.worst = (_element(i, r64, c64, limit, free) for i in (first, worst))
    if u is not None and v.n_compared and r_X is not None:
        _rule_3(v, name, r64, judged, diff, compared, u, r_X)
    return v


def _rule_2(name, r64, c64, compared, v, u, f_X):
    """The row rule: (the candidate as judged, each row's factor − 1 or shift, or None)."""
    freedom = row_freedom_of(name)
    if freedom is None or (freedom[1] and (u is None or f_X is None)):
        return c64, None
    with np.errstate(invalid="ignore", over="ignore"):
        judged, free = row_adjusted(name, r64, c64)  # [...], [rows...]
    bound = GROWTH * u * (f_X + 1.0) if freedom[1] else None
    v.rows = Rows(freedom[0], bound)
    free = np.where(compared.any(-1), free, 0.0)  # a row with nothing judged has no factor to judge
    raw = free
    size = np.abs(np.where(np.isfinite(free), free, np.inf)).reshape(-1)  # [rows]
    if size.size:
        k = int(np.argmax(size))
        v.rows.largest, v.rows.largest_at = float(size[k]), [int(i) for i in np.unravel_index(k, r64.shape[:-1])]
    if bound is not None:  # a row beyond the bound, or no mere rescaling, gets no freedom: judged as it is
        beyond = (~(np.abs(free) <= bound) & compared.any(-1)) | ~(np.abs(free) <= MAX_ROW_FREEDOM[freedom[0]])
        judged = np.where(beyond[..., None], c64, judged)
        free = np.where(beyond, np.nan, free)
        if (size > bound).any():
            k = int(np.flatnonzero(size > bound)[0])
            v.rows.rows_out = int((size > bound).sum())
            v.rows.first_out = [int(i) for i in np.unravel_index(k, r64.shape[:-1])]
            v.rows.first_out_value = float(raw.reshape(-1)[k] + (1.0 if freedom[0] == "factor" else 0.0))
            if freedom[0] == "factor":
                rr, cc = r64.reshape(-1, r64.shape[-1])[k], c64.reshape(-1, r64.shape[-1])[k]
                v.rows.first_out_sums = (float(np.sum(cc)), float(np.sum(np.where(np.isfinite(rr), rr, 0.0))))
    return judged, free


def _rule_3(v, name, r64, judged, diff, compared, u, r_X):
    """The bias rule, on the compared elements."""
    if not np.isfinite(judged[compared]).all():
        v.rms, v.mean_error, v.row_t = float("inf"), float("nan"), None
        return
    r, c = r64[compared], judged[compared]
    v.rms, v.mean_error = rms(diff[compared]), float(np.mean(c - r))
    if not is_zero_in_exact_arithmetic(name):
        v.bias_tolerance = bias_bound(u, r_X, r.size, rms(r) if r.size else 0.0)
    last = r64.shape[-1] if r64.ndim else 1
    with np.errstate(invalid="ignore", over="ignore"):
        rows_diff = np.where(compared, judged - r64, 0.0).reshape(-1, last)  # [rows, last]
    count = compared.reshape(rows_diff.shape).sum(axis=-1)  # [rows]
    v.row_t = row_t(rows_diff.sum(axis=-1)[count > 0] / count[count > 0])
    if v.bias_tolerance and abs(v.mean_error) > v.bias_tolerance and v.ok:
        if v.row_t is not None and abs(v.row_t) < ROW_T:
            v.bias_forgiven = True  # rounding shared within rows, not a systematic error
        else:
            v.status = "systematic error"


def _element(index, r, c, limit, free):
    i = tuple(int(k) for k in index)
    row_free = None if free is None or not np.isfinite(free[i[:-1]]) else float(free[i[:-1]])
    return Element(i, float(r[i]), float(c[i]), float(limit[i]), row_free)
