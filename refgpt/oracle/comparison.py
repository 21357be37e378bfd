"""The oracle: compare a candidate's activations with a golden file and name the first divergence.

An implementation that goes wrong somewhere goes wrong everywhere after it: an error in block 3's
MLP reaches every later residual stream and the logits. So "logits differ" says nothing about
*where*. The oracle walks the tensors in the order the forward pass computes them and names the
**first** one out of tolerance, with its layer, batch row, position and index.

Tolerance. An element passes when

    |candidate − reference| ≤ atol + rtol·|reference|

With ``atol``/``rtol`` given, that is all (NumPy's ``allclose`` rule). A **profile** derives both
from a format's unit roundoff u (2⁻²⁴ float32, 2⁻⁸ bfloat16, 2⁻¹¹ float16, 2⁻⁵³ float64) and, per
tensor X, from X's scale S_X = max(1, max|X_ref|) and its measured condition number c_X (the
error refgpt's own float32 pass makes at X, in units of 2⁻²⁴; refgpt/oracle/golden.py):

    rtol = G·u        atol_X = G·u·(c_X + S_X)        G = 64

G is a measured growth factor: on 5,000 random models per format, 99 % of a simulated independent
implementation's errors fit under G ≤ 11, and G = 64 flags at most 0.12 % of those correct models
(docs/oracle.md; benchmarks/oracle_tolerance.py measures it). A reference without c_X (not a
refgpt golden file) uses c_X = 0, which can flag tensors that are ill-conditioned but correct; the
report says so.

Special cases. Attention scores are compared on the causal part only (the masked part is −∞ in
refgpt and TransformerLens, −1e4 or garbage elsewhere). Logits are judged shift-invariantly, by
their log-softmax against the reference's log_probs, so a model whose unembedding was centred
(logits moved by a constant per position) is not flagged; top-1 and top-5 agreement and the
largest KL divergence are reported too. Integer tensors (tokens) must be equal.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..activations import log_softmax
from ..errors import RefGPTError
from . import golden as golden_file
from .llmc import read_activations
from .name_maps import ModelShape, axes, forward_key, forward_order, layer_of, to_refgpt

#: Unit roundoff of each format: half the distance from 1 to the next representable number.
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
#: The growth factor G (module docstring; docs/oracle.md derives it).
GROWTH = 64
_PROFILE_OF_CODE = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_PROFILE_OF_DTYPE = {"float64": "float64", "float32": "float32", "float16": "float16"}
_F32_TINY = float(np.finfo(np.float32).tiny)


@dataclass
class Element:
    """One element of a tensor: where it is, and the two values."""

    index: tuple[int, ...]
    where: dict[str, int]  # axis label → index, e.g. {"batch": 0, "pos": 3, "d_model": 17}
    reference: float
    candidate: float
    tolerance: float


@dataclass
class TensorResult:
    """The comparison of one tensor."""

    name: str
    layer: int | None
    status: str  # "ok", "out of tolerance", "shape mismatch", "values differ" (integers)
    shape: list[int]
    candidate_shape: list[int]
    max_abs: float = 0.0
    max_rel: float = 0.0  # max|Δ| / max(1, max|ref|)
    max_ulp: float = 0.0  # max |Δ| in float32 ulps of the reference value
    frac_out: float = 0.0  # share of elements outside atol + rtol·|ref|
    atol: float = 0.0
    rtol: float = 0.0
    first_bad: Element | None = None  # the first element out of tolerance, in C order
    worst: Element | None = None  # the element furthest outside its tolerance
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class LogitsSummary:
    """What the candidate's logits predict, against the reference's."""

    top1_agreement: float  # share of positions with the same argmax
    top5_agreement: float  # mean share of the reference's top 5 in the candidate's top 5
    max_kl: float  # max over positions of KL(p_ref ‖ p_cand), nats
    max_shift: float  # largest |mean(cand − ref)| over positions: a per-position constant is ignored


@dataclass
class Report:
    """The oracle's answer. ``ok`` ⇔ every compared tensor is within tolerance."""

    tensors: list[TensorResult]
    tolerance: dict
    logits: LogitsSummary | None = None
    missing: list[str] = field(default_factory=list)  # in the reference, not in the candidate
    unexpected: list[str] = field(default_factory=list)  # in the candidate, not in the reference
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tensors)

    @property
    def first_divergence(self) -> TensorResult | None:
        return next((t for t in self.tensors if not t.ok), None)

    def __getitem__(self, name) -> TensorResult:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_dict(self) -> dict:
        first = self.first_divergence
        return {"ok": self.ok, "first_divergence": asdict(first) if first else None,
                "tolerance": self.tolerance, "logits": asdict(self.logits) if self.logits else None,
                "tensors": [asdict(t) for t in self.tensors], "missing": self.missing,
                "unexpected": self.unexpected, "notes": self.notes}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, default=_json_default)

    def table(self, after_first: int | None = None) -> str:
        return format_report(self, after_first)

    __str__ = table


def _json_default(x):
    if isinstance(x, (np.integer, np.floating)):
        return x.item()
    raise TypeError(type(x).__name__)


# ---- loading ------------------------------------------------------------------------------------


def load(source, name_map="refgpt", shape: ModelShape | None = None):
    """(tensors, stored dtype codes, Golden or None) from a path or a mapping of arrays.

    Paths: ``.safetensors`` (a golden file or any other), ``.npz``, or with ``name_map="llmc"``
    a ``.bin`` dump of llm.c's ``acts_memory`` (refgpt/oracle/llmc.py, ``read_activations``).
    """
    if isinstance(source, golden_file.Golden):
        return dict(source.tensors), dict(source.dtypes), source
    if not isinstance(source, (str, Path)):
        return {k: np.asarray(v) for k, v in dict(source).items()}, {}, None
    path = Path(source)
    if not path.is_file():
        raise RefGPTError(f"{path}: file not found")
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}, {}, None
        except (ValueError, OSError) as error:
            raise RefGPTError(f"{path}: not a readable .npz file ({error})") from None
    if path.suffix == ".bin":
        if name_map != "llmc" or shape is None:
            raise RefGPTError(f"{path}: a .bin candidate is read as llm.c's activations: pass --map llmc")
        return None, {}, None  # read by compare(), which knows B and T from the reference
    g = golden_file.read(path)
    return dict(g.tensors), dict(g.dtypes), g


def default_profile(tensors, dtypes) -> str:
    """The profile matching the candidate's precision: its logits' dtype (else its first float)."""
    names = ["logits"] + [n for n in tensors if n != "logits"]
    for name in names:
        if name in tensors and name in dtypes and dtypes[name] in _PROFILE_OF_CODE:
            return _PROFILE_OF_CODE[dtypes[name]]
        if name in tensors and np.asarray(tensors[name]).dtype.name in _PROFILE_OF_DTYPE:
            return _PROFILE_OF_DTYPE[np.asarray(tensors[name]).dtype.name]
    return "float32"


# ---- comparing ----------------------------------------------------------------------------------


def compare(reference, candidate, *, atol=None, rtol=None, profile=None, name_map="refgpt",
            conditioning=None) -> Report:
    """Compare ``candidate`` with ``reference`` (each a path, a Golden, or a mapping name → array).

    Either ``profile`` ("float32", "bfloat16", "float16", "float64") or ``atol``/``rtol``; with
    neither, the profile of the candidate's precision. ``name_map`` ("refgpt", "hf", "tl", "llmc")
    says how the candidate names its tensors. ``conditioning`` overrides the reference's c_X.
    """
    ref, _, ref_golden = load(reference)
    if not ref:
        raise RefGPTError("the reference holds no tensors")
    shape = _model_shape(ref, ref_golden)
    cand, cand_dtypes, cand_golden = load(candidate, name_map, shape)
    if cand is None:  # an llm.c activations dump
        tokens = np.asarray(ref["tokens"]) if "tokens" in ref else None
        if tokens is None or ref_golden is None or ref_golden.config is None:
            raise RefGPTError("an llm.c activations dump needs a refgpt golden file as the reference "
                              "(it gives B, T and the model's shape)")
        cand = read_activations(candidate, ref_golden.config, *tokens.shape)
        cand_dtypes = {}
    cand, notes = to_refgpt(cand, name_map, shape)
    if conditioning is None:
        conditioning = ref_golden.conditioning if ref_golden is not None else {}
    conditioning = dict(conditioning)
    tol = _tolerance(atol, rtol, profile, cand, cand_dtypes)
    if tol["profile"] and not conditioning:
        notes.append("the reference has no measured conditioning (c_X = 0): ill-conditioned tensors may be "
                     "flagged though correct; make the reference with `refgpt golden`")
    ref = _with_derived(ref, cand, conditioning)
    common = [n for n in forward_order(ref) if n in cand]
    if not common:
        raise RefGPTError(f"no tensor names in common: the reference has e.g. {list(ref)[:3]}, the candidate "
                          f"{list(cand)[:3]}; is --map right (refgpt, hf, tl, llmc)?")
    results = []
    for n in common:  # one tensor pair in memory at a time: files are mapped, pages dropped after use
        results.append(_compare_tensor(n, np.asarray(ref[n]), np.asarray(cand[n]), tol, conditioning, ref))
        _release(n, ref_golden, cand_golden)
    summary = _logits_summary(ref, cand) if "logits" in common or "log_probs" in common else None
    _release("logits", ref_golden, cand_golden)
    _release("log_probs", ref_golden, cand_golden)
    missing = [n for n in forward_order(ref) if n not in cand and n not in _DERIVED]
    unexpected = sorted(n for n in cand if n not in ref)
    return Report(results, tol, summary, missing, unexpected, notes)


def _release(name, *goldens):
    """Let go of the memory a compared tensor of a mapped file occupies (see Golden.release)."""
    for g in goldens:
        if g is not None:
            g.release(name)


def _model_shape(ref, g) -> ModelShape:
    cfg = g.config if g is not None else None
    if cfg is not None:
        return ModelShape(cfg.n_layers, cfg.n_heads, cfg.d_vocab)
    layers = {layer_of(n) for n in ref} - {None}
    n_heads = next((np.asarray(v).shape[1] for n, v in ref.items() if n.endswith("hook_pattern")), 1)
    d_vocab = next((np.asarray(ref[n]).shape[-1] for n in ("logits", "log_probs") if n in ref), 0)
    return ModelShape(max(layers) + 1 if layers else 0, n_heads, d_vocab)


def _tolerance(atol, rtol, profile, cand, dtypes) -> dict:
    if profile is not None and (atol is not None or rtol is not None):
        raise RefGPTError("give either a profile or atol/rtol, not both")
    if atol is not None or rtol is not None:
        for what, v in (("atol", atol), ("rtol", rtol)):
            if v is not None and not (np.isfinite(v) and v >= 0):
                raise RefGPTError(f"{what} must be a finite number ≥ 0, found {v!r}")
        return {"profile": None, "atol": float(atol or 0.0), "rtol": float(rtol or 0.0)}
    if profile is None:
        profile = default_profile(cand, dtypes)
    if profile not in UNIT_ROUNDOFF:
        raise RefGPTError(f"unknown profile {profile!r}; choose one of {', '.join(UNIT_ROUNDOFF)}")
    u = UNIT_ROUNDOFF[profile]
    return {"profile": profile, "unit_roundoff": u, "growth": GROWTH, "rtol": GROWTH * u,
            "atol": f"{GROWTH}·u·(c_X + S_X)"}


# Reference tensors the oracle derives when a candidate has them and the reference does not.
_DERIVED = ("probs", "loss_mean", "log_probs")


def _with_derived(ref, cand, conditioning):
    ref = dict(ref)
    if "log_probs" not in ref and "logits" in ref and ("log_probs" in cand or "probs" in cand):
        ref["log_probs"] = log_softmax(np.asarray(ref["logits"], np.float64))
    if "probs" in cand and "probs" not in ref and "log_probs" in ref:
        ref["probs"] = np.exp(np.asarray(ref["log_probs"], np.float64))  # [batch, pos, d_vocab]
        conditioning.setdefault("probs", conditioning.get("log_probs", 0.0))  # |Δp| = p·|Δlog p| ≤ |Δlog p|
    if "loss_mean" in cand and "loss_mean" not in ref and "loss" in ref:
        ref["loss_mean"] = np.asarray(np.mean(np.asarray(ref["loss"], np.float64)))
        conditioning.setdefault("loss_mean", conditioning.get("loss", 0.0))
    return ref


def _compare_tensor(name, r, c, tol, conditioning, ref) -> TensorResult:
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
    judged_name = name
    if name == "logits":  # shift-invariant: judge log-softmax against log-softmax
        judged_name = "log_probs" if "log_probs" in conditioning else "logits"
        res.notes.append("judged shift-invariantly: log-softmax of the logits")
    log_probs = ref.get("log_probs") if name == "logits" else None
    chunks = list(_row_chunks(r, c, log_probs))
    # First pass: the scale of the reference, and which blocks differ at all. A block equal to the
    # reference has no element out of tolerance and 0 error: the second pass skips it.
    ref_peak, judged_peak, n_compared, differ = 0.0, 0.0, 0, []
    for r64, c64, jr, jc in _judged(name, chunks):
        compared = np.isfinite(r64)  # [rows, last] attention scores: the causal part
        n_compared += int(compared.sum())
        ref_peak = max(ref_peak, float(np.max(np.abs(r64), where=compared, initial=0.0)))
        judged_peak = ref_peak if jr is r64 else max(judged_peak, float(np.max(np.abs(jr), where=compared, initial=0.0)))
        with np.errstate(invalid="ignore"):  # −∞ − −∞ in the masked part, which is not compared
            same = _equal_where(c64, r64, compared) and (jc is c64 or _equal_where(jc, jr, compared))
        differ.append(not same)
    scale = max(1.0, judged_peak)
    if tol["profile"]:
        u = tol["unit_roundoff"]
        res.rtol = GROWTH * u
        res.atol = GROWTH * u * (conditioning.get(judged_name, 0.0) + scale)
    else:
        res.rtol, res.atol = tol["rtol"], tol["atol"]
    n_bad, worst_ratio, start = 0, -1.0, 0
    for (r64, c64, jr, jc), block_differs in zip(_judged(name, chunks, differ), differ):
        if block_differs:
            n_bad, worst_ratio = _compare_block(res, name, r.shape, start, r64, c64, jr, jc, n_bad, worst_ratio)
        start += r64.size
    res.max_rel = res.max_abs / max(1.0, ref_peak)
    res.frac_out = float(n_bad / n_compared) if n_compared else 0.0
    if n_bad:
        res.status = "out of tolerance"
    return res


def _equal_where(a, b, where) -> bool:
    """Are a and b equal wherever ``where`` holds? (A NaN is never equal.)"""
    return bool(np.all(a == b, where=where))


def _compare_block(res, name, shape, start, r64, c64, jr, jc, n_bad, worst_ratio):
    """One block of rows (starting at C-order index ``start`` of the tensor) into ``res``: the
    raw error (reported), the judged error against atol + rtol·|ref|, first and worst elements."""
    compared = np.isfinite(r64)  # [rows, last]
    with np.errstate(invalid="ignore"):  # −∞ − −∞ in the masked part, which is not compared
        diff = np.where(compared, np.abs(c64 - r64), 0.0)  # [rows, last] raw error, reported
        jdiff = diff if jc is c64 else np.where(compared, np.abs(jc - jr), 0.0)  # [rows, last] judged error
    diff = np.where(np.isnan(diff), np.inf, diff)  # a NaN candidate is infinitely wrong
    jdiff = np.where(np.isnan(jdiff), np.inf, jdiff)
    limit = res.atol + res.rtol * np.abs(np.where(compared, jr, 0.0))  # [rows, last]
    bad = jdiff > limit  # [rows, last]
    res.max_abs = max(res.max_abs, float(diff.max(initial=0.0)))
    ulp = np.spacing(np.maximum(np.abs(r64), _F32_TINY).astype(np.float32)).astype(np.float64)  # [rows, last]
    res.max_ulp = max(res.max_ulp, float(np.max(np.where(compared, diff / ulp, 0.0), initial=0.0)))
    if bad.any():
        n_bad += int(bad.sum())
        ratio = np.where(bad, jdiff / np.maximum(limit, _F32_TINY), -1.0)  # [rows, last]
        at = int(np.argmax(ratio))
        if res.first_bad is None:
            res.first_bad = _element(name, shape, start, int(np.argmax(bad)), jr, jc, limit)
        if ratio.flat[at] > worst_ratio:
            worst_ratio = float(ratio.flat[at])
            res.worst = _element(name, shape, start, at, jr, jc, limit)
    return n_bad, worst_ratio


#: Elements per block of rows a tensor is compared in: the temporaries of the comparison stay
#: this size, whatever the tensor's (GPT-2 XL's attention pattern is 25·1024² elements a layer).
_CHUNK = 1 << 20


def _row_chunks(r, c, log_probs=None):
    """Slices of rows of ``r`` and ``c`` (and the reference's ``log_probs``), viewed as 2-D
    [rows, last axis], about ``_CHUNK`` elements each."""
    r2, c2 = golden_file.as_rows(r), golden_file.as_rows(c)  # [rows, last]
    lp = golden_file.as_rows(np.asarray(log_probs)) if log_probs is not None and np.shape(log_probs) == r.shape else None
    step = max(1, _CHUNK // max(1, r2.shape[1]))
    for i in range(0, max(1, len(r2)), step):
        yield r2[i:i + step], c2[i:i + step], None if lp is None else lp[i:i + step]


def _judged(name, chunks, wanted=None):
    """(reference, candidate, judged reference, judged candidate) in float64, a chunk at a time
    (None for the chunks ``wanted`` says are not). Logits are judged by their log-softmax against
    the reference's log_probs; every other tensor as it is (the judged arrays are the same)."""
    for i, (r, c, log_probs) in enumerate(chunks):
        if wanted is not None and not wanted[i]:
            yield r, None, None, None
            continue
        r64, c64 = r.astype(np.float64, copy=False), c.astype(np.float64, copy=False)  # [rows, last]
        if name != "logits":
            yield r64, c64, r64, c64
        else:
            jr = np.asarray(log_probs, np.float64) if log_probs is not None else log_softmax(r64)
            yield r64, c64, jr, log_softmax(c64)


def _where(name, index):
    return dict(zip(axes(name, len(index)), (int(i) for i in index)))


def _element(name, shape, start, k, r, c, limit):
    """The element k of a chunk of rows (``r``, ``c``, ``limit``) that starts at C-order index
    ``start`` of a tensor of ``shape``."""
    i = tuple(int(j) for j in np.unravel_index(start + k, shape))
    return Element(i, _where(name, i), float(r.flat[k]), float(c.flat[k]), float(limit.flat[k]))


def _logits_summary(ref, cand) -> LogitsSummary:
    """Top-1/top-5 agreement, the largest KL and the largest per-position shift, a block of
    positions at a time (GPT-2 XL's logits at T = 1024 are 400 MB in float64)."""
    def source(t):
        return golden_file.as_rows(np.asarray(t["logits"] if "logits" in t else t["log_probs"]))  # [positions, d_vocab]

    sr, sc = source(ref), source(cand)
    if sr.shape != sc.shape:
        return None
    both_logits = "logits" in ref and "logits" in cand
    k = min(5, sr.shape[-1])
    top1, top5, max_kl, shift = 0.0, 0.0, -np.inf, 0.0
    step = max(1, _CHUNK // max(1, sr.shape[1]))
    for i in range(0, len(sr), step):
        r, c = sr[i:i + step].astype(np.float64), sc[i:i + step].astype(np.float64)  # [rows, d_vocab]
        lr = log_softmax(r) if "logits" in ref else r  # [rows, d_vocab]
        lc = log_softmax(c) if "logits" in cand else c  # [rows, d_vocab]
        top_r, top_c = _top_k(lr, k), _top_k(lc, k)  # [rows, k] each
        top1 += float(np.sum(top_r[:, 0] == top_c[:, 0]))
        top5 += float((top_r[..., :, None] == top_c[..., None, :]).any(-1).mean(-1).sum())
        with np.errstate(invalid="ignore"):
            kl = np.sum(np.exp(lr) * (lr - lc), axis=-1)  # [rows]
        max_kl = max(max_kl, float(np.nan_to_num(kl, nan=np.inf).max(initial=-np.inf)))
        if both_logits:
            shift = max(shift, float(np.max(np.abs((c - r).mean(-1)), initial=0.0)))  # per-position constant
    n = max(1, len(sr))
    return LogitsSummary(top1 / n, top5 / n, max_kl, shift)


def _top_k(x, k):
    """The indices of the k largest entries of each row, largest first, ties to the lower index:
    ``np.argsort(-x, kind="stable")[:, :k]``, without sorting all of a 50,257-entry row. Rows
    where the k-th value is tied or NaNs appear are sorted in full."""
    if x.shape[-1] <= k:
        return np.argsort(-x, axis=-1, kind="stable")[:, :k]
    part = np.argpartition(-x, k - 1, axis=-1)[:, :k]  # [rows, k] the k largest, in no order
    kth = np.take_along_axis(x, part, -1).min(-1, keepdims=True)  # [rows, 1] the k-th largest value
    plain = ((x >= kth).sum(-1) == k) & ~np.isnan(x).any(-1)  # [rows] no tie at the k-th, no NaN
    top = np.empty((len(x), k), dtype=np.intp)  # [rows, k]
    part = np.sort(part, axis=-1)  # [rows, k] by index, so a stable sort by value breaks ties by index
    order = np.argsort(-np.take_along_axis(x, part, -1), axis=-1, kind="stable")  # [rows, k]
    top[plain] = np.take_along_axis(part, order, -1)[plain]
    if not plain.all():
        top[~plain] = np.argsort(-x[~plain], axis=-1, kind="stable")[:, :k]
    return top


# ---- the report as text ---------------------------------------------------------------------------


def format_report(report: Report, after_first: int | None = None) -> str:
    """The readable table: one row per tensor in forward order, then the verdict.

    ``after_first``: show only this many rows after the first divergence (None: every row).
    """
    first = report.first_divergence
    rows = [("tensor", "shape", "max abs", "max rel", "f32 ulps", "out", "")]
    shown = report.tensors
    if after_first is not None and first is not None:
        shown = shown[: report.tensors.index(first) + 1 + after_first]
    for t in shown:
        mark = "FIRST DIVERGENCE" if t is first else ("" if t.ok else t.status)
        if t.status in ("shape mismatch",):
            rows.append((t.name, _shape(t.shape), "-", "-", "-", "-", f"{mark}: candidate {_shape(t.candidate_shape)}"))
            continue
        rows.append((t.name, _shape(t.shape), f"{t.max_abs:.2e}", f"{t.max_rel:.2e}", f"{t.max_ulp:.3g}",
                     f"{100 * t.frac_out:.1f}%", mark))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = ["  ".join(c.ljust(w) if i == 0 or i == 1 else c.rjust(w) for i, (c, w) in enumerate(zip(r[:6], widths)))
             + ("  " + r[6] if r[6] else "") for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    if len(shown) < len(report.tensors):
        lines.append(f"… {len(report.tensors) - len(shown)} more tensors")
    lines.append("")
    tol = report.tolerance
    if tol["profile"]:
        lines.append(f"tolerance: profile {tol['profile']}: |cand − ref| ≤ atol_X + rtol·|ref|, rtol = {GROWTH}·u = "
                     f"{tol['rtol']:.2e}, atol_X = {GROWTH}·u·(c_X + S_X)  (u = {tol['unit_roundoff']:.3g})")
    else:
        lines.append(f"tolerance: |cand − ref| ≤ {tol['atol']:.3g} + {tol['rtol']:.3g}·|ref|")
    if report.logits is not None:
        s = report.logits
        lines.append(f"logits: top-1 agreement {100 * s.top1_agreement:.1f}%, top-5 {100 * s.top5_agreement:.1f}%, "
                     f"max KL {s.max_kl:.3g} nats, largest per-position shift {s.max_shift:.3g} (ignored)")
    for note in report.notes:
        lines.append(f"note: {note}")
    if report.missing:
        lines.append(f"not in the candidate ({len(report.missing)}): {_few(report.missing)}")
    if report.unexpected:
        lines.append(f"not in the reference, not compared ({len(report.unexpected)}): {_few(report.unexpected)}")
    n_ok = sum(t.ok for t in report.tensors)
    if first is None:
        lines.append(f"OK: all {len(report.tensors)} tensors within tolerance")
    else:
        lines.append(f"FAIL: {len(report.tensors) - n_ok} of {len(report.tensors)} tensors out of tolerance")
        lines.append(describe_divergence(first))
    return "\n".join(lines)


def describe_divergence(t: TensorResult) -> str:
    """One paragraph: which tensor, where, and by how much."""
    where = f"layer {t.layer}" if t.layer is not None else "outside the blocks"
    if t.status == "shape mismatch":
        return (f"first divergence: {t.name} ({where}): shape {_shape(t.candidate_shape)}, "
                f"expected {_shape(t.shape)}")
    e = t.first_bad
    at = ", ".join(f"{k} {v}" for k, v in e.where.items() if k != "1")
    text = (f"first divergence: {t.name} ({where}), first at {at} (index {list(e.index)}): candidate "
            f"{e.candidate:.9g}, reference {e.reference:.9g}, |diff| {abs(e.candidate - e.reference):.3g}")
    if t.status == "values differ":
        return text + "; everything after it ran on different input"
    text += f" > tolerance {e.tolerance:.3g}; {100 * t.frac_out:.1f}% of its elements are out"
    if t.worst is not None and t.worst.index != e.index:
        w = t.worst
        text += (f"; worst at index {list(w.index)}: |diff| {abs(w.candidate - w.reference):.3g} "
                 f"(tolerance {w.tolerance:.3g})")
    return text + ". Every tensor after it inherits the error: look here first."


def _shape(s):
    return "[" + ", ".join(str(i) for i in s) + "]"


def _few(names, k=6):
    return ", ".join(names[:k]) + (", …" if len(names) > k else "")


__all__ = ["GROWTH", "UNIT_ROUNDOFF", "Element", "LogitsSummary", "Report", "TensorResult", "compare",
           "describe_divergence", "format_report", "forward_key"]
