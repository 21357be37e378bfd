"""The oracle: compare a candidate's activations with a golden file and name the first divergence.

An implementation that goes wrong somewhere goes wrong everywhere after it: an error in block 3's
MLP reaches every later residual stream and the logits. So "logits differ" says nothing about
*where*. The oracle walks the tensors in the order the forward pass computes them, then the
gradients (``grad.*``, refgpt/oracle/gradients.py) in the order the backward pass computes them,
and names the **first** one out of tolerance, with its layer, batch row, position and index —
for a gradient, the op whose backward computes it (name_maps.backward_op).

Tolerance. An element passes when

    |candidate − reference| ≤ atol + rtol·|reference|

With ``atol``/``rtol`` given, that is all (NumPy's ``allclose`` rule). A **profile** derives both
from a format's unit roundoff u (2⁻²⁴ float32, 2⁻⁸ bfloat16, 2⁻¹¹ float16, 2⁻⁵³ float64) and, per
tensor X, from X's scale S_X = max(1, max|X_ref|) and its measured condition number c_X (the
error refgpt's own float32 pass makes at X, in units of 2⁻²⁴; refgpt/oracle/golden.py):

    rtol = G·u        atol_X = G·u·(c_X + S_X)        G = 64

G is a measured growth factor (docs/oracle.md; benchmarks/oracle_tolerance.py measures it on
thousands of random and trained models). For a gradient S_X = max|X_ref|, its own scale. Beyond
the elementwise bound, a tensor's **bias** — its mean signed error — must stay within what
rounding gives (``_check_systematic``): a wrong constant is small everywhere but the same
everywhere, and is named at its own op as a "systematic error". A reference without c_X and r_X
(not a refgpt golden file) uses 0 for both, which can flag tensors that are ill-conditioned but
correct; the report says so.

Special cases. Attention scores are compared on the causal part only (the masked part is −∞ in
refgpt and TransformerLens, −1e4 or garbage elsewhere). Logits are judged shift-invariantly, by
their log-softmax against the reference's log_probs, so a model whose unembedding was centred
(logits moved by a constant per position) is not flagged; top-1 and top-5 agreement and the
largest KL divergence are reported too. Integer tensors (tokens) must be equal.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..gpt2.activations import log_softmax
from .. import strict_json, threads
from ..errors import RefGPTError, RefGPTTypeError, real_number
from ..files.atomic_write import refuse_temporary
from . import golden as golden_file
from . import llmc, llmc_dump
# The rule's constants and its row and bias rules are the reference's (refgpt/reference/compare.py);
# this module judges the same way in blocks of rows, threaded and memory-mapped, and reports more.
from ..reference.compare import (BIAS_FULL_ELEMENTS, BIAS_GROWTH, BIAS_MIN_ELEMENTS, F32_TINY, GROWTH,  # noqa: F401
                                 MAX_ROW_FREEDOM, ROW_T, ROW_T_MIN_ROWS, UNIT_ROUNDOFF, bias_bound as _bias_bound,
                                 is_zero_in_exact_arithmetic, row_adjusted, row_freedom_of, tensor_scale)
from .name_maps import (ModelShape, axes, backward_op, decode_to_refgpt, forward_key, forward_order, inner_name,
                        is_gradient, layer_of, split_step, to_refgpt)

_PROFILE_OF_CODE = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_PROFILE_OF_DTYPE = {"float64": "float64", "float32": "float32", "float16": "float16"}



@dataclass
class Element:
    """One element of a tensor: where it is, and the two files' values there."""

    index: tuple[int, ...]
    where: dict[str, int]  # axis label → index, e.g. {"batch": 0, "pos": 3, "d_model": 17}
    reference: float  # the reference file's value at ``index``
    candidate: float  # the candidate file's value at ``index``
    tolerance: float  # the most |judged difference| may be here
    row_shift: float | None = None  # the row's shift taken out before judging (logits, log_probs)
    row_factor: float | None = None  # the row's factor divided out before judging (probs, attention patterns)

    @property
    def judged_difference(self) -> float:
        """|candidate − shift − reference|, |candidate/factor − reference| or |candidate − reference|."""
        c = self.candidate
        if self.row_shift is not None:
            c = c - self.row_shift
        if self.row_factor is not None and self.row_factor != 0:
            c = c / self.row_factor
        return abs(c - self.reference)


@dataclass
class RowFreedom:
    """How a tensor judged up to one factor or shift per row (row_freedom_of, refgpt/reference/compare.py) used it."""

    kind: str  # "factor" (softmax rows: Σ candidate / Σ reference) or "shift" (median of candidate − reference)
    bound: float | None  # the most |factor − 1| or |shift| may be (None: any shift is right, the logits)
    largest: float = 0.0  # the largest |factor − 1| or |shift| over the rows
    largest_at: list[int] | None = None  # the row's index (every axis but the last)
    rows_out: int = 0  # rows whose factor or shift is beyond the bound
    first_out: list[int] | None = None  # the first such row
    first_out_value: float | None = None  # its factor (or shift)
    first_out_sums: tuple[float, float] | None = None  # its Σ candidate and Σ reference (factor rows)


@dataclass
class Layout:
    """Where a golden's elements sit in its sequences: which positions are pads (not judged unless
    ``judge_pads``) and, in a decode golden, the absolute position each step's first new row is at.

    ``mask`` [batch, positions] (1 real, 0 pad; None: no padding) covers every position of the golden,
    a decode golden's generated ones too; ``starts`` maps a decode step to its first position."""

    mask: np.ndarray | None = None
    starts: dict[int, int] = field(default_factory=dict)
    judge_pads: bool = False

    @classmethod
    def of(cls, ref, judge_pads=False) -> "Layout":
        mask = np.asarray(ref["attention_mask"]) if "attention_mask" in ref else None
        news = {}
        for name in ref:
            step, inner = split_step(name)
            if step is not None and inner == "tokens":
                news[step] = np.shape(ref[name])[1]
        starts, total = {}, 0
        for step in sorted(news):
            starts[step], total = total, total + news[step]
        return cls(mask if mask is not None and not mask.all() else None, starts, judge_pads)

    def offset(self, name) -> int:
        """The absolute position of index 0 of ``name``'s position axis (a KV cache's is 0)."""
        step, inner = split_step(name)
        if step is None or inner.endswith(("attn.cache_k", "attn.cache_v")):
            return 0
        return self.starts.get(step, 0)

    def judged(self, name, shape):
        """None (every element is judged), or fn(a, b) → bool [b − a, last] (or [b − a, 1]): which
        elements of rows a … b − 1 (every axis but the last) sit at real positions."""
        if self.mask is None or self.judge_pads or len(shape) < 2:
            return None
        labels = axes(name, len(shape))
        if "batch" not in labels or "pos" not in labels:
            return None
        batch, pos, offset, mask = labels.index("batch"), labels.index("pos"), self.offset(name), self.mask
        pairs = inner_name(name) in ("loss", "targets") and shape[-1] == mask.shape[1] - 1  # next-token: t and t + 1

        def real(b, p):
            ok = mask[b, offset + p] == 1
            return ok & (mask[b, offset + p + 1] == 1) if pairs else ok

        if pos == len(shape) - 1:  # [batch, pos]: positions along the rows
            def judged(a, b):
                rows = np.unravel_index(np.arange(a, b), shape[:-1])[batch]  # [block]
                return real(rows[:, None], np.arange(shape[-1])[None, :])  # [block, pos]
        else:
            def judged(a, b):
                rows = np.unravel_index(np.arange(a, b), shape[:-1])  # per axis [block]
                return real(rows[batch], rows[pos])[:, None]  # [block, 1]
        return judged


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
    max_over_tol: float = 0.0  # max |Δ| / tolerance over the elements (≤ 1 passes)
    rms: float = 0.0  # RMS of the (judged) error over the compared elements
    mean_error: float = 0.0  # mean signed error (candidate − reference): the bias
    bias_tolerance: float = 0.0  # the most rounding gives to |mean_error| (profiles, ≥ 16 elements; 0: not checked)
    row_t: float | None = None  # the rows' mean errors: their mean over its standard error (the bias's consistency)
    golden_error: float | None = None  # the reference's own measured error, relative like max_rel (--certify)
    n_layers: int | None = None  # the reference model's, to say which op's backward computes a gradient
    frac_out: float = 0.0  # share of elements outside atol + rtol·|ref|
    n_out: int = 0  # elements outside it (beyond their row's shift or factor, where one is allowed)
    n_compared: int = 0  # elements judged (attention scores: the causal part)
    atol: float = 0.0
    rtol: float = 0.0
    first_bad: Element | None = None  # the first element out of tolerance, in C order
    worst: Element | None = None  # the element furthest outside its tolerance
    row: RowFreedom | None = None  # judged up to a factor or shift per row: how much of it was used
    step: int | None = None  # a decode golden's step (refgpt/oracle/decode.py)
    offset: int = 0  # the absolute position of index 0 of its position axis (a decode step's first new one)
    sequences: bool = False  # a decode or padded golden's: name rows and positions as such
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
    too_little: list[str] = field(default_factory=list)  # why the candidate cannot be judged OK

    @property
    def ok(self) -> bool:
        return not self.too_little and all(t.ok for t in self.tensors)

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
                "unexpected": self.unexpected, "notes": self.notes, "too_little": self.too_little}

    def to_json(self) -> str:
        return strict_json.dumps(self.to_dict(), indent=1, default=_json_default)

    def table(self, after_first: int | None = None, names=None, failing: bool = False) -> str:
        return format_report(self, after_first, names, failing)

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
        return numeric_arrays(source), {}, None
    path = Path(source)
    if not path.is_file():
        raise RefGPTError(f"{path}: file not found")
    refuse_temporary(path)
    if path.suffix == ".npz":
        try:
            # The file is opened here, not by np.load, which leaks its handle when the zip is broken.
            with open(path, "rb") as handle, np.load(handle, allow_pickle=False) as z:
                return _npz_arrays(path, z), {}, None
        except RefGPTError:
            raise
        except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile, NotImplementedError) as error:
            raise RefGPTError(f"{path}: not a readable .npz file ({type(error).__name__}: "
                              f"{str(error).splitlines()[0] if str(error) else 'truncated'})") from None
    if path.suffix == ".bin":
        if name_map != "llmc" or shape is None:
            raise RefGPTError(f"{path}: a .bin candidate is read as llm.c's (a raw acts_memory dump, refgpt's llm.c "
                              f"dump or a debug state): pass --map llmc")
        return None, {}, None  # read by compare(), which knows B and T from the reference
    g = golden_file.read(path)
    return dict(g.tensors), dict(g.dtypes), g


def _npz_arrays(path, z) -> dict[str, np.ndarray]:
    """Every member of an .npz archive, each an .npy array of numbers: a member that is not an .npy
    file (np.load would hand its raw bytes over) is refused, as is one whose name repeats."""
    members = z.zip.namelist()
    if len(set(members)) != len(members):
        twice = next(m for m in members if members.count(m) > 1)
        raise RefGPTError(f"{path}: the archive holds {twice!r} twice; which copy is meant is ambiguous")
    arrays = {}
    for member in members:
        if not member.endswith(".npy"):
            raise RefGPTError(f"{path}: archive member {member!r:.80} is not an .npy array (np.savez names "
                              "every array NAME.npy)")
        name = member[: -len(".npy")]
        _check_npy_header(path, z.zip, member)
        array = z[name]
        if not isinstance(array, np.ndarray) or array.dtype.kind not in "biuf":
            raise RefGPTError(f"{path}: {name!r:.80} holds {getattr(array, 'dtype', type(array).__name__)}, "
                              "expected numbers")
        arrays[name] = array
    return arrays


def _check_npy_header(path, archive, member) -> None:
    """An .npy member must hold the bytes its header declares (read before NumPy allocates them: a
    few compressed bytes may declare terabytes) and numbers, not objects."""
    from numpy.lib import format as npy

    info = archive.getinfo(member)
    with archive.open(member) as f:
        version = npy.read_magic(f)
        read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, _, dtype = read(f)
        room = info.file_size - f.tell()
    if dtype.hasobject or dtype.kind not in "biuf":
        raise RefGPTError(f"{path}: {member[:-4]!r:.80} holds {dtype}, expected numbers")
    declared = math.prod(shape) * dtype.itemsize
    if declared > room:
        raise RefGPTError(f"{path}: {member[:-4]!r:.80} declares shape {list(shape)} ({declared:,} bytes) but holds "
                          f"{max(room, 0):,}: truncated, or not an array NumPy wrote")


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
            conditioning=None, forward_only=False, judge_pads=False) -> Report:
    """Compare ``candidate`` with ``reference`` (each a path, a Golden, or a mapping name → array).

    Either ``profile`` ("float32", "bfloat16", "float16", "float64") or ``atol``/``rtol``; with
    neither, the profile of the candidate's precision. ``name_map`` ("refgpt", "hf", "tl", "llmc")
    says how the candidate names its tensors. ``conditioning`` overrides the reference's c_X.

    A candidate with gradients against a reference without them (made without ``--backward``)
    cannot be vouched for: the report fails, naming them, unless ``forward_only``, which judges
    the forward pass alone (the candidate's gradients, and the reference's, are left out).

    A padded golden's pad positions (its ``attention_mask``'s 0s) are not judged unless
    ``judge_pads``: only what a real position computes must agree. A decode golden's steps are
    walked in order, and each element is named at its absolute position (``Layout``).
    """
    _check_not_swapped(reference, candidate)
    ref, _, ref_golden = load(reference)
    if not ref:
        raise RefGPTError("the reference holds no tensors")
    check_reference_finite(ref, ref_golden)
    shape = _model_shape(ref, ref_golden)
    steps = sorted({split_step(n)[0] for n in ref} - {None})  # a decode golden's steps (refgpt/oracle/decode.py)
    if isinstance(candidate, (str, Path)) and Path(candidate).is_dir():
        if not steps or name_map != "llmc":
            raise RefGPTError(f"{candidate} is a directory: a candidate directory holds llm.c's per-step dumps "
                              f"(step0.bin, step1.bin, …) of a decode, compared with --map llmc against a decode golden")
        candidate = llmc_dump.read_steps(candidate, ref, ref_golden)
        name_map = "refgpt"
    cand, cand_dtypes, cand_golden = load(candidate, name_map, shape)
    if cand_golden is not None and ref_golden is not None and _is_golden(cand_golden) and not _is_golden(ref_golden):
        raise RefGPTError(f"{candidate} is a refgpt golden file and {reference} is not: arguments swapped? The "
                          f"golden comes first: refgpt compare GOLDEN CANDIDATE")
    if cand is None:  # an llm.c .bin
        cand = _read_llmc_bin(candidate, ref, ref_golden)
        cand_dtypes = {}
    notes = []
    if name_map == "llmc" and any(k.startswith(("grads.", "grads_acts.")) for k in cand):
        if ref_golden is None or ref_golden.config is None:
            raise RefGPTError("llm.c gradients need a refgpt golden file as the reference (its config gives the "
                              "model's shape)")
        cand, notes = llmc_dump.to_refgpt_gradients(cand, ref_golden.config)
    elif name_map != "llmc":
        _hint_llmc_names(candidate, cand)
    cand, map_notes = (decode_to_refgpt(cand, name_map, shape, steps[-1]) if steps else to_refgpt(cand, name_map, shape))
    notes += map_notes
    cand, target_notes = _reconcile_targets(ref, cand)
    notes += target_notes
    if steps:
        ref, cand, step_notes = _decode_tokens(ref, cand, steps)
        notes += step_notes
    if conditioning is None:
        conditioning = ref_golden.conditioning if ref_golden is not None else {}
    conditioning = golden_file.checked_conditioning(dict(conditioning), "conditioning")
    old_format = ref_golden is not None and ref_golden.format_version < 2
    if old_format and "log_probs" in conditioning:  # format 1 measured the logits raw: take log_probs' (as it judged)
        conditioning["logits"] = conditioning["log_probs"]
    tol = _tolerance(atol, rtol, profile, cand, cand_dtypes)
    if tol["profile"] and not conditioning:
        notes.append("the reference has no measured conditioning (c_X = 0): ill-conditioned tensors may be "
                     "flagged though correct; make the reference with `refgpt golden`")
    ref = _with_derived(ref, cand, conditioning)
    if forward_only:
        backward = [n for n in cand if is_gradient(n) or n == "loss_mean"]
        if backward:
            notes.append(f"--forward-only: the candidate's {len(backward)} backward tensors are not judged")
        cand = {n: v for n, v in cand.items() if n not in backward}
        ref = {n: v for n, v in ref.items() if not is_gradient(n) and n != "loss_mean"}
    common = [n for n in forward_order(ref) if n in cand]
    if not common:
        raise RefGPTError(f"no tensor names in common: the reference has e.g. {list(ref)[:3]}, the candidate "
                          f"{list(cand)[:3]}; is --map right (refgpt, hf, tl, llmc)?")
    error_rms = dict(ref_golden.error_rms) if ref_golden is not None else {}
    if old_format and "log_probs" in error_rms:
        error_rms["logits"] = error_rms["log_probs"]
    if tol["profile"] and conditioning and not error_rms:  # a golden file written before r_X was recorded
        error_rms = None
        notes.append("the reference records c_X but not r_X (an older golden file): the bias of each tensor is "
                     "not judged; remake it with `refgpt golden`")
    row_freedom = dict(ref_golden.row_freedom) if ref_golden is not None else {}
    for alias, source in _ALIASES(ref).items():  # derived tensors are judged with their source's measured errors
        for measured in (conditioning, error_rms or {}, row_freedom):
            if source in measured:
                measured.setdefault(alias, measured[source])
    if tol["profile"] and conditioning and not row_freedom:
        notes.append("the reference records no row freedom f_X (a golden file older than format 2): softmax rows "
                     "are judged element by element, without their one shared factor; remake it with `refgpt golden`")
    layout = Layout.of(ref, judge_pads)
    results = []
    for n in common:  # files are mapped: each tensor's pages are let go once compared (Golden.release)
        _check_unchanged(ref_golden, cand_golden)  # a mapped file that shrank would end the process (SIGBUS)
        results.append(_compare_tensor(n, np.asarray(ref[n]), np.asarray(cand[n]), tol, conditioning, ref, error_rms,
                                       row_freedom, layout))
        _release(n, ref_golden, cand_golden)
    results, off_path = _off_the_path(results, ref, cand)
    certified = ref_golden.golden_error if ref_golden is not None else {}
    for t in results:
        t.golden_error = certified.get(t.name)
        t.n_layers = shape.n_layers
    if certified:
        notes.append(f"the golden is certified: each tensor's own error was measured against "
                     f"{ref_golden.metadata.get('golden_error_precision', 'extended precision')} (column 'golden err')")
    _check_unchanged(ref_golden, cand_golden)
    summary = _logits_summary(ref, cand) if "logits" in common or "log_probs" in common else None
    _release("logits", ref_golden, cand_golden)
    _release("log_probs", ref_golden, cand_golden)
    missing = [n for n in forward_order(ref) if n not in cand and inner_name(n) not in _DERIVED]
    unexpected = forward_order(n for n in cand if n not in ref)
    reasons = too_little(common, ref) + off_path
    no_backward = [n for n in unexpected if is_gradient(n) or n == "loss_mean"]
    if no_backward:
        reasons.append(f"the candidate has {len(no_backward)} backward tensors ({_few(no_backward, 3)}) the reference "
                       f"lacks: it was made without --backward. Remake it with `refgpt golden … --backward`, or pass "
                       f"--forward-only to judge the forward pass alone")
    return Report(results, tol, summary, missing, unexpected, notes, reasons)


def compare_groups(reference, groups: list[dict], **options) -> Report:
    """One report over several candidates that name the same tensors (a runtime that caches one
    tensor under several names: TransformerLens 4's bridge, refgpt/runtimes/tl_bridge.py). Each group
    maps a refgpt name to (the candidate's own name, its tensor); every group is judged by ``compare``
    with ``options`` (the first group's profile for the rest), and the report is the first group's
    with every later group's tensors put in forward order after the first group's of the same name.
    A failing tensor whose own name is not refgpt's is named in the notes by its own name."""
    if isinstance(reference, (str, Path)):
        reference = golden_file.read(reference)
    report = compare(reference, {k: v for k, (_, v) in groups[0].items()}, **options)
    if report.tolerance["profile"] and options.get("atol") is None and options.get("rtol") is None:
        options = {**options, "profile": report.tolerance["profile"]}
    tensors = [(t, groups[0]) for t in report.tensors]
    known = reference.tensors if hasattr(reference, "tensors") else reference
    for group in groups[1:]:
        group = {k: v for k, v in group.items() if k in known}  # the rest are in the first report's unexpected
        if group:
            tensors += [(t, group) for t in compare(reference, {k: v for k, (_, v) in group.items()}, **options).tensors]
    tensors.sort(key=lambda tg: forward_key(tg[0].name))  # stable: the first group's first
    report.tensors = [t for t, _ in tensors]
    for t, group in tensors:
        own = group.get(t.name, (t.name,))[0]
        if not t.ok and own != t.name:
            report.notes.append(f"{t.name} ({t.status}) is the candidate's {own}")
    report.notes.append(f"{sum(len(g) for g in groups)} tensors under {len(groups[0])} names: every one judged")
    return report


def _decode_tokens(ref, cand, steps):
    """A decode golden's ``tokens`` (the prompt and every chosen token) judged on the prompt: each
    chosen token is judged at its own step (``step.S.chosen``), where a wrong one is named. A
    candidate with only the whole sequence (HF's ``sequences``) gets its steps' tokens from it."""
    if "tokens" not in ref or "step.0.tokens" not in ref:
        return ref, cand, []
    P = np.shape(ref["step.0.tokens"])[1]
    ref, cand, notes = dict(ref), dict(cand), []
    if "tokens" in cand:
        full = np.asarray(cand["tokens"])
        if full.ndim == 2 and full.shape[1] >= P:
            for S in steps:
                if P + S < full.shape[1] and f"step.{S}.chosen" not in cand:
                    cand[f"step.{S}.chosen"] = full[:, P + S]  # [batch]
                if S > 0 and P + S - 1 < full.shape[1] and f"step.{S}.tokens" not in cand:
                    cand[f"step.{S}.tokens"] = full[:, P + S - 1:P + S]  # [batch, 1]
            cand["tokens"] = full[:, :P]
            notes.append("tokens judged on the prompt; each generated token at its step (step.S.chosen)")
    ref["tokens"] = np.asarray(ref["tokens"])[:, :P]
    if "attention_mask" in ref and "attention_mask" in cand:
        cand["attention_mask"] = np.asarray(cand["attention_mask"])[:, :np.shape(ref["attention_mask"])[1]]
    return ref, cand, notes


def _off_the_path(results, ref, cand):
    """(results, reasons): a greedy decode candidate that chose another token than the golden at a
    step where the golden's two logits are within the logits' tolerance of each other took a
    near-tie the other way — no bug, but every later step ran on other tokens: those steps are
    left out and the report says so (a forced continuation judges every step)."""
    for i, t in enumerate(results):
        step, inner = split_step(t.name)
        if step is None or inner != "chosen" or t.status != "values differ":
            continue
        logits = next((x for x in results if x.name in (f"step.{step}.logits", f"step.{step}.next_logits")), None)
        if logits is None or not logits.ok:
            return results, []
        row = t.first_bad.index[0]
        r = np.asarray(ref[f"step.{step}.logits"], np.float64)[row, -1]  # [d_vocab]
        mine, theirs = int(t.first_bad.candidate), int(t.first_bad.reference)
        gap = float(r[theirs] - r[mine])
        limit = 2 * (logits.atol + logits.rtol * float(np.max(np.abs(r[[mine, theirs]]))))
        if gap > limit:
            return results, []
        t.status = "near tie"
        t.notes.append(f"row {row}: the candidate chose token {mine}, the golden {theirs}; the golden's logits of "
                       f"the two differ by {gap:.3g}, within twice the logits' tolerance ({limit:.3g}): a near-tie")
        later = [x.name for x in results[i + 1:] if x.step is not None and x.step > step]
        kept = [x for x in results if x.step is None or x.step <= step]
        return kept, [f"the decode left the golden's path at step {step} by a near-tie (row {row}: token {mine} "
                      f"against the golden's {theirs}, whose logits differ by {gap:.3g}, within tolerance): no bug, "
                      f"but every later step ran on other tokens and {len(later)} tensors are not judged; make the "
                      f"golden with a forced continuation (refgpt golden --tokens PROMPT_AND_CONTINUATION "
                      f"--generate N) to judge every step"]
    return results, []


# ---- failing closed -------------------------------------------------------------------------------


def numeric_arrays(source) -> dict[str, np.ndarray]:
    """A mapping of name → array given in Python, checked: numbers only (no strings or objects)."""
    if not isinstance(source, Mapping):
        raise RefGPTTypeError(f"expected a path, a Golden or a mapping of name → array, found {type(source).__name__}")
    arrays = {}
    for name, value in source.items():
        try:
            arrays[name] = np.asarray(value)
        except (ValueError, TypeError) as error:
            raise RefGPTError(f"tensor {name!r}: not an array ({str(error).splitlines()[0][:80]})") from None
        if arrays[name].dtype.kind not in "biuf":
            raise RefGPTTypeError(f"tensor {name!r}: expected numbers, found dtype {arrays[name].dtype}")
    return arrays


def _check_unchanged(*goldens):
    """A RefGPTError if a mapped golden file shrank since it was opened (another process truncated
    it): reading its lost pages would end the process with SIGBUS (docs/files.md)."""
    for g in goldens:
        if g is not None and g.file is not None:
            g.file.check_size()


def _release(name, *goldens):
    """Let go of the memory a compared tensor of a mapped file occupies (see Golden.release)."""
    for g in goldens:
        if g is not None:
            g.release(name)


def check_reference_finite(ref, golden=None) -> None:
    """A reference value that is NaN or ±∞ cannot judge anything: refuse it, naming the tensor.
    The one exception is −∞ in attention scores, refgpt's (and TransformerLens's) causal mask."""
    for name, value in ref.items():
        _check_unchanged(golden)
        a = np.asarray(value)
        if a.dtype.kind not in "fc":
            continue
        bad = ~np.isfinite(a)
        if name.endswith("hook_attn_scores"):
            bad &= a != -np.inf
        _release(name, golden)
        if bad.any():
            i = tuple(int(k) for k in np.argwhere(bad)[0])
            raise RefGPTError(f"the reference's {name!r} holds {a[i]} at index {list(i)} "
                              f"({int(bad.sum())} non-finite values): a reference must be finite")


def too_little(common, ref) -> list[str]:
    """Why comparing only ``common`` cannot vouch for the candidate: no logits (unless it is a
    gradient candidate: its ``grad.*`` tensors end in the loss), or no float tensor at all."""
    reasons = []
    gradients = any(n.startswith("grad.") for n in common)
    if (any(n in ref for n in ("logits", "log_probs")) and not gradients
            and not any(n in common for n in ("logits", "log_probs"))):
        reasons.append("the candidate has no logits (or log_probs) to compare")
    if not any(np.asarray(ref[n]).dtype.kind == "f" for n in common):
        reasons.append(f"the candidate shares only {', '.join(common)} with the reference: no activation "
                       "was compared")
    return reasons


def _is_golden(g) -> bool:
    return g.metadata.get("format") == golden_file.FORMAT


def _check_not_swapped(reference, candidate) -> None:
    """A reference that is an llm.c file is the candidate given first."""
    if not isinstance(reference, (str, Path)) or not Path(reference).is_file():
        return
    if Path(reference).suffix == ".bin":
        raise RefGPTError(f"{reference} is a candidate's dump ({Path(reference).suffix}), not a golden file: "
                          f"arguments swapped? The golden comes first: refgpt compare GOLDEN CANDIDATE")


#: llm.c ActivationTensors names that no other map uses: their presence means the candidate is llm.c's.
_LLMC_ONLY = ("encoded", "ln1", "ln1_mean", "ln1_rstd", "qkv", "atty", "preatt", "att", "attproj", "residual2",
              "ln2", "fch", "fch_gelu", "fcproj", "residual3", "lnf", "lnf_mean", "lnf_rstd", "losses")


def _hint_llmc_names(candidate, cand) -> None:
    llmc_names = [k for k in cand if k in _LLMC_ONLY or k.startswith(("grads.", "grads_acts."))]
    if llmc_names:
        raise RefGPTError(f"{candidate if isinstance(candidate, (str, Path)) else 'the candidate'} names its tensors "
                          f"as llm.c does ({', '.join(llmc_names[:4])}{', …' if len(llmc_names) > 4 else ''}): "
                          f"pass --map llmc")


def _read_llmc_bin(candidate, ref, ref_golden) -> dict:
    """An llm.c .bin candidate: refgpt's dump, a debug state, or a raw acts_memory dump (by magic)."""
    tokens = np.asarray(ref["tokens"]) if "tokens" in ref else None
    if tokens is None or ref_golden is None or ref_golden.config is None:
        raise RefGPTError("an llm.c .bin candidate needs a refgpt golden file as the reference "
                          "(it gives B, T and the model's shape)")
    cfg = ref_golden.config
    if tokens.ndim != 2:
        raise RefGPTError(f"the reference's tokens have shape {list(tokens.shape)}; an llm.c candidate is judged "
                          "against a batch [B, T] (a golden file's tokens are [batch, pos])")
    magic = llmc_dump.file_magic(candidate)
    if magic == llmc_dump.DUMP_MAGIC:
        return llmc_dump.read_dump(candidate, cfg)
    if magic == llmc.STATE_MAGIC:
        return llmc_dump.read_debug_state_candidate(candidate, cfg)
    if magic in (llmc.MODEL_MAGIC, llmc.TOKENIZER_MAGIC, llmc.SHARD_MAGIC):
        raise RefGPTError(f"{candidate}: {llmc._WHAT[magic]}, not a run's activations: compare takes a dump of "
                          f"acts_memory (docs/oracle.md), refgpt's llm.c dump, or a debug state")
    return llmc.read_activations(candidate, cfg, *tokens.shape)


def _reconcile_targets(ref, cand) -> tuple[dict, list[str]]:
    """Line up a candidate with llm.c's targets (y, one per position) and a golden without them."""
    notes = []
    rt, ct = ref.get("targets"), cand.get("targets")
    rl, cl = ref.get("loss"), cand.get("loss")
    T = np.asarray(ref["tokens"]).shape[-1] if "tokens" in ref else None
    golden_has_y = rt is not None and np.asarray(rt).shape[-1] == T
    if ct is not None and not golden_has_y and np.asarray(ct).shape[-1] == T and T is not None:
        if any(is_gradient(k) or k == "loss_mean" for k in cand):
            raise RefGPTError("the candidate's loss and gradients are over llm.c's targets y, one per position "
                              "(B×T), the golden's over next-token targets inside its tokens (B×(T − 1)): make "
                              "the golden from the same file, refgpt golden --tokens CANDIDATE_OR_DEBUG_STATE "
                              "--backward")
        cand = dict(cand)
        cand["targets"] = np.asarray(ct)[:, :-1]
        notes.append("candidate targets y [B, T]: compared on the first T − 1 positions, which the golden has")
    if cl is not None and rl is not None and np.asarray(cl).shape[-1] == np.asarray(rl).shape[-1] + 1:
        cand = dict(cand)
        cand["loss"] = np.asarray(cl)[:, :-1]
        notes.append("llm.c losses: last position dropped (its target is the token after the golden's input)")
    return cand, notes


def _model_shape(ref, g) -> ModelShape:
    cfg = g.config if g is not None else None
    if cfg is not None:
        return ModelShape(cfg.n_layers, cfg.n_heads, cfg.d_vocab, cfg)
    layers = {layer_of(n) for n in ref} - {None}
    n_heads = next((np.asarray(v).shape[1] for n, v in ref.items() if n.endswith("hook_pattern")), 1)
    d_vocab = next((np.asarray(ref[n]).shape[-1] for n in ("logits", "log_probs") if n in ref), 0)
    return ModelShape(max(layers) + 1 if layers else 0, n_heads, d_vocab)


def _tolerance(atol, rtol, profile, cand, dtypes) -> dict:
    if profile is not None and (atol is not None or rtol is not None):
        raise RefGPTError("give either a profile or atol/rtol, not both")
    if atol is not None or rtol is not None:
        for what, v in (("atol", atol), ("rtol", rtol)):
            if v is not None:
                real_number(v, what, least=0)
        return {"profile": None, "atol": float(atol or 0.0), "rtol": float(rtol or 0.0)}
    if profile is None:
        profile = default_profile(cand, dtypes)
    if profile not in UNIT_ROUNDOFF:
        raise RefGPTError(f"unknown profile {profile!r}; choose one of {', '.join(UNIT_ROUNDOFF)}")
    u = UNIT_ROUNDOFF[profile]
    return {"profile": profile, "unit_roundoff": u, "growth": GROWTH, "rtol": GROWTH * u,
            "atol": f"{GROWTH}·u·(c_X + S_X)"}


# Reference tensors the oracle derives when a candidate has them and the reference does not.
_DERIVED = ("probs", "loss_mean", "log_probs", "next_logits")


def _ALIASES(ref) -> dict[str, str]:
    """Derived reference tensors → the tensor whose measured errors judge them."""
    out = {"probs": "log_probs", "loss_mean": "loss"}
    for step in sorted({split_step(n)[0] for n in ref} - {None}):
        out[f"step.{step}.next_logits"] = f"step.{step}.logits"
        out[f"step.{step}.probs"] = f"step.{step}.log_probs"
    return out


def _with_derived(ref, cand, conditioning):
    ref = dict(ref)
    for step in sorted({split_step(n)[0] for n in cand} - {None}):
        p = f"step.{step}."
        if p + "next_logits" in cand and p + "next_logits" not in ref and p + "logits" in ref:
            ref[p + "next_logits"] = np.asarray(ref[p + "logits"])[:, -1]  # [batch, d_vocab]: the logits that choose
        if p + "probs" in cand and p + "probs" not in ref and p + "log_probs" in ref:
            ref[p + "probs"] = np.exp(np.asarray(ref[p + "log_probs"], np.float64))  # [batch, new, d_vocab]
    if "log_probs" not in ref and "logits" in ref and ("log_probs" in cand or "probs" in cand):
        ref["log_probs"] = log_softmax(np.asarray(ref["logits"], np.float64))
    if "probs" in cand and "probs" not in ref and "log_probs" in ref:
        ref["probs"] = np.exp(np.asarray(ref["log_probs"], np.float64))  # [batch, pos, d_vocab]
        conditioning.setdefault("probs", conditioning.get("log_probs", 0.0))  # |Δp| = p·|Δlog p| ≤ |Δlog p|
    if "loss_mean" in cand and "loss_mean" not in ref and "loss" in ref:
        ref["loss_mean"] = np.asarray(np.mean(np.asarray(ref["loss"], np.float64)))
        conditioning.setdefault("loss_mean", conditioning.get("loss", 0.0))
    return ref


#: Each tensor is judged in blocks of whole rows (its last axis) of at most this many bytes of float64,
#: so comparing needs a few blocks of memory, not a few copies of the largest tensor (issue 17): the
#: judgement's temporaries are ~16 blocks (~64 MiB). Smaller blocks are also faster (they stay in
#: cache): a GPT-2-medium golden, T = 512, took 15 s with 4 MiB blocks, 17 s with 8, 20 s with 16.
BLOCK_BYTES = 4 * 2**20


def _as_rows(x):
    """``x`` seen as [rows, last] (a scalar as [1, 1]), a view when ``x`` is contiguous."""
    return x.reshape(1, 1) if x.ndim == 0 else x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def _row_blocks(rows, last):
    """threads.row_blocks of float64 rows of ``last`` numbers, each block at most BLOCK_BYTES (read at
    each call: tests make it smaller); a tensor without rows is one empty block, judged like any other."""
    return threads.row_blocks(rows, 8 * max(1, last), BLOCK_BYTES) or [(0, 0)]


def _sum(parts) -> float:
    """Σ of per-block float64 sums, each block's sum rounded once more (math.fsum of the block sums,
    exactly rounded); inf/NaN propagate as in a plain sum."""
    if all(map(math.isfinite, parts)):
        try:
            return math.fsum(parts)
        except OverflowError:  # finite block sums whose total overflows: ±inf, as a plain sum gives
            pass
    return float(sum(parts))


class _RootMeanSquare:
    """RMS of finite values given block by block: whole-tensor ``rms(x)`` (refgpt/reference/compare.py), √mean(x²), equal to rounding.

    Σx² is kept twice: plainly, and scaled by the largest |x| so far (rescaled when a larger one
    arrives), so that when the plain sum overflows, max|x|·√mean((x/max|x|)²) is still there."""

    def __init__(self):
        self.n, self.plain, self.top, self.scaled = 0, [], 0.0, 0.0

    def add(self, x):
        self.add_block(self.block(x))

    @staticmethod
    def block(x) -> tuple[int, float, float, float]:
        """One block's own part, which a thread can compute alone: (size, Σx², max|x|, Σ(x/max|x|)²)."""
        if not x.size:
            return 0, 0.0, 0.0, 0.0
        with np.errstate(over="ignore"):
            plain = float(np.sum(np.square(x)))
        top = float(np.max(np.abs(x)))
        scaled = float(np.sum(np.square(x / top))) if 0.0 < top < np.inf else 0.0
        return x.size, plain, top, scaled

    def add_block(self, part):
        """Fold in one block's ``block(x)``, in block order."""
        size, plain, top, scaled = part
        self.n += size
        if not size:
            return
        self.plain.append(plain)
        if top > self.top:
            self.scaled *= (self.top / top) ** 2
            self.top = top
        if 0.0 < self.top < np.inf:
            self.scaled += scaled * (top / self.top) ** 2

    def value(self) -> float:
        plain = math.sqrt(_sum(self.plain) / self.n)
        if math.isfinite(plain):
            return plain
        if not math.isfinite(self.top):  # as rms: inf·√mean((x/inf)²) is NaN
            return math.nan
        return self.top * math.sqrt(self.scaled / self.n)


def _compare_tensor(name, r, c, tol, conditioning, ref, error_rms=None, row_freedom=None,
                    layout: Layout | None = None) -> TensorResult:
    """Judge candidate ``c`` against reference ``r`` block of rows by block of rows (BLOCK_BYTES).

    Whole-tensor, the judgement is (masked: not compared)

        c′ = c up to its row's freedom (row_adjusted): logits − the row's shift (free),
             log_probs − its shift, probs and attention patterns / the row's factor (each bounded:
             |shift| or |factor − 1| ≤ G·u·(f_X + 1), f_X from ``row_freedom``; without it, c′ = c)
        err = |c′ − r|,  limit = atol + rtol·|r|,  bad = err > limit,  first/worst = first bad, largest err/limit
        max_abs = max err,  max_over_tol = max err/limit,  frac_out = #bad / #compared
        mean_error = Σ(c′ − r)/n,  rms = √(Σ err²/n),  RMS(X_ref) = √(Σ r²/n)    (the bias bound)

    Maxima, counts and the first element are the same numbers blocked (a row's freedom is the row's
    alone); the three sums are summed per block and then exactly (math.fsum), so they differ from
    numpy's pairwise whole-tensor sum by rounding only: relative ≤ (⌈log₂ n⌉ + ⌈log₂ b⌉ + 1)·2⁻⁵³ of
    Σ|terms| (b: elements in a block). atol needs S_X = max|X_ref| before any block is judged: a
    first pass finds it."""
    res = TensorResult(name, layer_of(name), "ok", list(r.shape), list(c.shape))
    layout = layout or Layout()
    res.step = split_step(name)[0]
    res.sequences = res.step is not None or layout.mask is not None
    if c.shape != r.shape and r.ndim >= 1 and r.shape[0] == 1 and c.shape == r.shape[1:]:
        c = c[None]  # a candidate without the batch axis, for a batch of one
        res.notes.append("candidate has no batch axis: compared as batch 1")
    if c.shape != r.shape:
        res.status = "shape mismatch"
        return res
    r2, c2 = _as_rows(r), _as_rows(c)  # [rows, last]
    rows, last = r2.shape
    blocks = _row_blocks(rows, last)

    def index(a, k):  # flat index k in the block starting at row a → index into r
        return tuple(int(i) for i in np.unravel_index(a * last + int(k), r.shape))

    def row_index(a, k):  # row k of the block starting at row a → the row's index (every axis but the last)
        return [int(i) for i in np.unravel_index(a + int(k), r.shape[:-1])] if r.ndim > 1 else []

    at_real = layout.judged(name, r.shape)  # None, or which elements sit at real (not pad) positions
    offset = res.offset = layout.offset(name)
    if at_real is not None:
        res.notes.append("pad positions not judged (--judge-pads judges them)")

    if r.dtype.kind in "iub" or c.dtype.kind in "iub":
        n_differ, n_judged, first = 0, 0, None
        for a, b in blocks:
            differ = r2[a:b] != c2[a:b]  # [block, last]
            judged = np.ones_like(differ) if at_real is None else np.broadcast_to(at_real(a, b), differ.shape)
            differ = np.flatnonzero(differ & judged)  # [n_differ in block]
            if first is None and len(differ):
                first = index(a, differ[0])
            n_differ += len(differ)
            n_judged += int(judged.sum())
        res.n_out, res.n_compared = n_differ, n_judged
        if n_differ:
            res.status = "values differ"
            res.frac_out = float(n_differ / n_judged)
            res.first_bad = res.worst = Element(first, _where(name, first, offset), float(r[first]), float(c[first]), 0.0)
        return res
    causal = is_gradient(name) and name.endswith("attn.hook_pattern")
    if causal:
        res.notes.append("∂pattern compared on the causal part (above the diagonal no loss depends on it through "
                         "the softmax; llm.c never computes it)")
    freedom = row_freedom_of(name)
    if freedom is not None and freedom[1] and not (tol["profile"] and row_freedom and name in row_freedom):
        freedom = None  # a bounded freedom needs its measured f_X (a golden of format 2) and a profile
    if freedom is not None:
        kind, bounded = freedom
        bound = (GROWTH * tol["unit_roundoff"] * (row_freedom[name] + 1.0)) if bounded else None
        res.row = RowFreedom(kind, bound)

    def block(a, b):  # the block's compared mask, raw values, judged values and its rows' freedom
        r64, c64 = r2[a:b].astype(np.float64), c2[a:b].astype(np.float64)  # [block, last]
        compared = np.isfinite(r64)  # attention scores: the causal part
        if at_real is not None:
            compared &= at_real(a, b)  # pads are not judged
        if causal:
            pos = (np.arange(a, b) % r.shape[-2])[:, None]  # [block, 1] query position of each row
            compared &= np.arange(last)[None, :] <= pos  # [block, last] key_pos ≤ pos
        jc, free = c64, None
        if freedom is not None:
            with np.errstate(invalid="ignore", over="ignore"):
                jc, free = row_adjusted(name, r64, c64)  # [block, last], [block]
            if res.row.bound is not None:  # a row beyond the bound, or no mere rescaling, gets no freedom
                beyond = ~(np.abs(free) <= res.row.bound) & compared.any(-1)  # [block] (NaN: beyond)
                unfree = beyond | ~(np.abs(free) <= MAX_ROW_FREEDOM[res.row.kind])  # judged as it is
                jc = np.where(unfree[:, None], c64, jc)
                return compared, r64, c64, jc, np.where(unfree, np.nan, free), free
        return compared, r64, c64, jc, free, free

    def tops(a, b):  # the block's max|X_ref| over the compared part
        compared, r64, _, _, _, _ = block(a, b)
        return np.max(np.abs(r64[compared]), initial=0.0)

    work = rows * last * 8  # bytes of float64 the judgement reads: the blocks go to the threads (refgpt/threads.py)
    top_judged = 0.0
    for judged in threads.map_blocks(tops, blocks, work):  # folded in block order
        top_judged = float(np.max([top_judged, judged]))
    scale = tensor_scale(name, np.array([top_judged]), ref)
    if tol["profile"]:
        u = tol["unit_roundoff"]
        res.rtol = GROWTH * u
        res.atol = GROWTH * u * (conditioning.get(name, 0.0) + scale)
    else:
        res.rtol, res.atol = tol["rtol"], tol["atol"]
    probs = inner_name(name) == "probs"
    if probs and tol["profile"]:
        res.notes.append("probabilities judged relative to p: |Δp| ≤ p·(atol + rtol) + float32's smallest normal "
                         "(a port may flush smaller ones to 0)")

    def element(a, k, local, r64, c64, limit, free):
        local = tuple(int(i) for i in local)
        e = Element(index(a, k), {}, float(r64[local]), float(c64[local]), float(limit[local]))
        e.where = _where(name, e.index, offset)
        if freedom is not None and free is not None and np.isfinite(free[local[0]]):  # NaN: a row judged as it is
            setattr(e, "row_factor" if freedom[0] == "factor" else "row_shift", float(
                free[local[0]] + (1.0 if freedom[0] == "factor" else 0.0)))
        return e

    def judge(a, b):  # one block's verdicts and sums, on its own (a thread's work)
        compared, r64, c64, jc, free, row_free = block(a, b)
        with np.errstate(invalid="ignore"):  # −∞ − −∞ in the masked part, which is not compared
            jdiff = np.where(compared, np.abs(jc - r64), 0.0)  # [block, last] judged error
        jdiff = np.where(np.isnan(jdiff), np.inf, jdiff)  # a NaN candidate is infinitely wrong
        if probs and tol["profile"]:  # |Δp| ≤ p·(atol + rtol), and a flushed subnormal passes
            limit = (res.atol + res.rtol) * np.abs(np.where(compared, r64, 0.0)) + F32_TINY
        else:
            limit = res.atol + res.rtol * np.abs(np.where(compared, r64, 0.0))  # [block, last]
        bad = jdiff > limit  # [block, last]
        part = {"max_abs": float(jdiff.max(initial=0.0)),
                "max_over_tol": np.max(np.where(compared, jdiff / np.maximum(limit, F32_TINY * F32_TINY), 0.0),
                                       initial=0.0),
                "n": int(compared.sum()), "n_bad": int(bad.sum()), "worst": None, "first_bad": None, "rows": None}
        if res.row is not None and free is not None:  # rows with nothing judged (a pad's) have no factor to judge
            part["rows"] = _rows_part(res.row, np.where(compared.any(-1), row_free, 0.0), a, row_index, r64, c64)
        ratio = np.where(bad, jdiff / np.maximum(limit, F32_TINY), -1.0)  # [block, last]
        if ratio.size:
            k = int(np.argmax(ratio))  # argmax: first of the largest (or first NaN)
            part["worst"] = (ratio.flat[k], element(a, k, np.unravel_index(k, bad.shape), r64, c64, limit, free))
        if bad.any():
            k = int(np.argmax(bad))
            part["first_bad"] = element(a, k, np.unravel_index(k, bad.shape), r64, c64, limit, free)
        if tol["profile"]:
            jc_in, jr_in = jc[compared], r64[compared]  # [compared in block]
            part["finite"] = bool(np.isfinite(jc_in).all())
            if part["finite"]:
                with np.errstate(over="ignore", invalid="ignore"):
                    part["signed"] = float(np.sum(jc_in - jr_in))
                    part["row_means"] = _row_means(np.where(compared, jc - r64, 0.0), compared)
                part["err_rms"], part["ref_rms"] = _RootMeanSquare.block(jdiff[compared]), _RootMeanSquare.block(jr_in)
        return part

    n = n_bad = 0
    max_abs = max_over_tol = 0.0
    worst_ratio = None
    signed, err_rms, ref_rms, all_finite = [], _RootMeanSquare(), _RootMeanSquare(), True
    row_means = []  # every block's rows' mean errors, in block order
    for part in threads.map_blocks(judge, blocks, work):  # folded in block order: the numbers of one thread
        if part["rows"] is not None:
            _fold_rows(res.row, part["rows"])
        max_abs = max(max_abs, part["max_abs"])
        max_over_tol = float(np.max([max_over_tol, part["max_over_tol"]]))
        n += part["n"]
        n_bad += part["n_bad"]
        if part["worst"] is not None:
            ratio, worst = part["worst"]
            if worst_ratio is None or (not np.isnan(worst_ratio) and (np.isnan(ratio) or ratio > worst_ratio)):
                worst_ratio, res.worst = ratio, worst
        if part["first_bad"] is not None and res.first_bad is None:
            res.first_bad = part["first_bad"]
        if tol["profile"]:
            all_finite = all_finite and part["finite"]
            if all_finite:
                signed.append(part["signed"])
                row_means.append(part["row_means"])
                err_rms.add_block(part["err_rms"])
                ref_rms.add_block(part["ref_rms"])
    res.max_abs = max_abs
    res.max_rel = res.max_abs / scale
    res.max_over_tol = max_over_tol
    res.frac_out = float(n_bad / n) if n else 0.0
    res.n_out, res.n_compared = n_bad, n
    if n_bad or (res.row is not None and res.row.rows_out):
        res.status = "out of tolerance"
    if not n_bad:
        res.worst = None
    if res.row is not None:
        res.notes.append(_row_note(res.row))
    if tol["profile"] and n and error_rms is not None:
        _check_systematic(res, n, all_finite, _sum(signed) / n if all_finite else math.nan,
                          err_rms.value() if all_finite else math.inf, ref_rms.value() if all_finite else 0.0,
                          tol["unit_roundoff"], error_rms.get(name, 0.0),
                          row_consistency(np.concatenate(row_means)) if all_finite and row_means else None)
    return res


def _row_means(diff, compared) -> np.ndarray:
    """The mean signed error of each row [rows] of a block with anything compared in it."""
    count = compared.sum(axis=-1)  # [block]
    has = count > 0
    return diff.sum(axis=-1)[has] / count[has]  # [rows with anything compared]




def row_consistency(means) -> float | None:
    """t = mean(m)/(sd(m)/√R) of the rows' mean errors m [R] (sd with R − 1): how consistently the
    rows err the same way. ±∞ when every row errs by the same amount; None with fewer than
    ROW_T_MIN_ROWS rows. Sums exact (math.fsum), so the same on any number of threads."""
    R = len(means)
    if R < ROW_T_MIN_ROWS or not np.isfinite(means).all():  # a row mean that overflowed: the bound alone
        return None
    top = float(np.max(np.abs(means)))
    if top == 0.0:
        return 0.0
    m = means / top  # [R] in [−1, 1]: t does not change with the scale, and nothing overflows
    mean = math.fsum(m.tolist()) / R
    var = math.fsum(((m - mean) ** 2).tolist()) / (R - 1)
    if var <= 0.0:
        return math.copysign(math.inf, mean) if mean else 0.0
    return mean / math.sqrt(var / R)


def _rows_part(row: RowFreedom, free, a, row_index, r64, c64) -> dict | None:
    """The rows' factors − 1 or shifts ``free`` [block] of the block starting at row ``a``, summed up
    on their own (a thread's work; ``row`` is only read): the largest and where, how many rows are
    beyond the bound, and the first of them. None for an empty block."""
    size = np.abs(np.where(np.isfinite(free), free, np.inf))  # [block] a NaN factor is infinitely far
    if not size.size:
        return None
    k = int(np.argmax(size))
    part = {"largest": float(size[k]), "largest_at": row_index(a, k), "rows_out": 0, "first_out": None}
    if row.bound is None:
        return part
    out = np.flatnonzero(size > row.bound)
    part["rows_out"] = len(out)
    if len(out):
        k = int(out[0])
        sums = None
        if row.kind == "factor":
            sums = (float(np.sum(c64[k])), float(np.sum(np.where(np.isfinite(r64[k]), r64[k], 0.0))))
        part["first_out"] = (row_index(a, k), float(free[k] + (1.0 if row.kind == "factor" else 0.0)), sums)
    return part


def _fold_rows(row: RowFreedom, part: dict | None) -> None:
    """Record one block's ``_rows_part`` in ``row``, in block order."""
    if part is None:
        return
    if row.largest_at is None or part["largest"] > row.largest:
        row.largest, row.largest_at = part["largest"], part["largest_at"]
    row.rows_out += part["rows_out"]
    if part["first_out"] is not None and row.first_out is None:
        row.first_out, row.first_out_value, sums = part["first_out"]
        if sums is not None:
            row.first_out_sums = sums


def _row_note(row: RowFreedom) -> str:
    what = ("up to a factor per row (each softmax row is divided by one sum; the factor: the median of "
            "candidate/reference over the row's largest entries, weighted by the reference)"
            if row.kind == "factor" else "up to a shift per row (the median over the row of candidate − reference)")
    at = f" at row {row.largest_at}" if row.largest_at else ""
    size = "|factor − 1|" if row.kind == "factor" else "|shift|"
    bound = (f", bound {row.bound:.3g} = {GROWTH}·u·(f_X + 1)" if row.bound is not None
             else " (any shift is right: logits are defined up to a constant per position)")
    out = f"; {row.rows_out} rows beyond it" if row.rows_out else ""
    return f"judged {what}: largest {size} {row.largest:.3g}{at}{bound}{out}"


def _check_systematic(res, n, finite, mean_error, rms, ref_rms, u, r_X, row_t=None) -> None:
    """Flag an error that is too *systematic* to be rounding, though each element is in tolerance.

    A correct port's error at X is a sum of roundings of either sign: its RMS over the tensor is
    about r_X·u (r_X: the RMS error of refgpt's own float32 pass in units of 2⁻²⁴, measured by
    ``refgpt golden``; to first order the same in any format's units) plus one rounding of each
    element, u·RMS(X). Its signed mean over n elements shrinks like 1/√n: n independent roundings
    of size σ have a mean of size σ/√n. A wrong constant or formula (GELU with π = 3.14, ε outside
    the square root) moves most elements the same way: its mean error is about as large as its
    RMS error. So, on tensors of n ≥ 16 elements,

        |mean(cand − ref)| ≤ B·u·(r_X + RMS(X_ref))·max(1, √(128/n))        B = BIAS_GROWTH = 4

    that is σ·B·√128/√n for small tensors and σ·B for large ones: B·√128 ≈ 45 standard errors at
    most, and far fewer where n is large, because rounding errors are correlated (a LayerNorm's
    error in μ shifts a whole row the same way): measured over thousands of random and trained
    models, a correct simulated port needs about a third of B at its 99th percentile
    (docs/oracle.md). Tensors that hold only rounding noise (RMS(X_ref) below float32's noise
    there, and ∂loss/∂b_K, 0 in exact arithmetic) are not judged. A bug
    whose bias is within this bound and whose elements are within the elementwise tolerance is
    indistinguishable from rounding.

    And the rows must agree. Rounding can be shared by a whole row (one ∂z[q] error moves every
    ∂pattern[q, k] of a row whose values v[k] are alike), and then the tensor's mean error is one
    draw per row, not per element: over few rows it can exceed the bound by chance (a C port at
    d_model = 2, 14 rows: 1.3× it, the rows' means of either sign). A wrong constant moves every
    row the same way. So a tensor over the bound is flagged only when its rows' mean errors m
    agree: |mean(m)| ≥ ROW_T = 5 standard errors, sd(m)/√R, over its R rows (``row_consistency``;
    with fewer than 4 rows, as before, on the bound alone). A constant error gives t = ∞.

    ``n`` compared elements, ``finite``: the candidate is finite there; ``mean_error`` = mean(cand − ref),
    ``rms`` = RMS(|cand − ref|), ``ref_rms`` = RMS(X_ref), accumulated by ``_compare_tensor``.
    """
    res.rms = rms if finite else float("inf")
    res.mean_error = mean_error if finite else float("nan")
    res.bias_tolerance = (_bias_bound(u, r_X, n, ref_rms) if finite and not is_zero_in_exact_arithmetic(res.name)
                          else 0.0)
    res.row_t = row_t
    if res.bias_tolerance and abs(res.mean_error) > res.bias_tolerance and res.ok:
        agreeing = row_t is None or abs(row_t) >= ROW_T
        rows = "" if row_t is None else f"; the rows' mean errors lie {abs(row_t):.3g} standard errors from 0"
        if not agreeing:
            res.notes.append(f"the mean signed error {res.mean_error:.3g} is "
                             f"{abs(res.mean_error) / res.bias_tolerance:.3g}× the bias bound ({res.bias_tolerance:.3g}), but the rows do not agree about it{rows} "
                             f"(< {ROW_T:g}): rounding shared within rows, not a systematic error")
            return
        res.status = "systematic error"
        res.notes.append(f"every element is within tolerance, but the mean signed error {res.mean_error:.3g} is "
                         f"{abs(res.mean_error) / res.bias_tolerance:.3g}× what rounding gives "
                         f"({res.bias_tolerance:.3g}){rows}; RMS error {res.rms:.3g}")


def _where(name, index, offset=0):
    """axis label → index of an element; ``pos`` as an absolute position (a decode step's ``offset`` added)."""
    where = dict(zip(axes(name, len(index)), (int(i) for i in index)))
    if "pos" in where:
        where["pos"] += offset
    return where


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


def _logits_summary(ref, cand) -> LogitsSummary:
    """Top-1 agreement, top-5 overlap, max KL(ref ‖ cand) and the largest shift of the logits' mean
    over positions, block of rows by block of rows. Whole-tensor, with lr, lc = log-softmax of each:

        top1 = mean(argmax lr == argmax lc),  top5 = mean |top5(lr) ∩ top5(lc)|/5,
        KL = max Σ_v e^lr·(lr − lc),  shift = max |mean_v(logits_c − logits_r)|"""
    def rows(t):
        return _as_rows(np.asarray(t["logits"] if "logits" in t else t["log_probs"]))  # [batch·pos, d_vocab]

    r2, c2 = rows(ref), rows(cand)
    if np.shape(ref["logits"] if "logits" in ref else ref["log_probs"]) != \
            np.shape(cand["logits"] if "logits" in cand else cand["log_probs"]):
        return None

    def logp(t, x):
        x = x.astype(np.float64)
        return log_softmax(x) if "logits" in t else x

    n_rows, d_vocab = r2.shape
    k = min(5, d_vocab)

    def summary(a, b):  # one block's top-1 count, top-5 overlap, largest KL and shift (a thread's work)
        lr, lc = logp(ref, r2[a:b]), logp(cand, c2[a:b])  # [block, d_vocab]
        top_r, top_c = _top_k(lr, k), _top_k(lc, k)  # [block, k]
        with np.errstate(invalid="ignore"):
            kl = np.nan_to_num(np.sum(np.exp(lr) * (lr - lc), axis=-1), nan=np.inf).max()
        shift = 0.0
        if "logits" in ref and "logits" in cand:
            d = c2[a:b].astype(np.float64) - r2[a:b].astype(np.float64)  # [block, d_vocab]
            shift = np.max(np.abs(d.mean(-1)))  # NaN propagates, as whole
        return (int((top_r[:, 0] == top_c[:, 0]).sum()),
                float((top_r[:, :, None] == top_c[:, None, :]).any(-1).mean(-1).sum()), kl, shift)

    same_top, overlap, kl, shift = 0, [], -np.inf, 0.0
    for top1, top5, block_kl, block_shift in threads.map_blocks(summary, _row_blocks(n_rows, d_vocab),
                                                                n_rows * d_vocab * 8):  # folded in block order
        same_top += top1
        overlap.append(top5)
        kl = float(np.max([kl, block_kl]))
        shift = float(np.max([shift, block_shift]))
    return LogitsSummary(same_top / n_rows, _sum(overlap) / n_rows, kl, shift)


# ---- the report as text ---------------------------------------------------------------------------


def format_report(report: Report, after_first: int | None = None, names=None, failing: bool = False) -> str:
    """The readable table: one row per tensor in forward order, then the verdict.

    ``after_first``: show only this many rows after the first divergence (None: every row).
    ``names`` (glob patterns) and ``failing`` (only tensors out of tolerance) filter the rows shown;
    the verdict below is always the whole report's.
    """
    import fnmatch

    first = report.first_divergence
    certified = any(t.golden_error is not None for t in report.tensors)
    rows = [("tensor", "shape", "max abs", "max rel", *(("golden err",) if certified else ()), "max/tol", "bias/tol",
             "out", "")]
    shown = report.tensors
    if after_first is not None and first is not None:
        shown = shown[: report.tensors.index(first) + 1 + after_first]
    filtered = bool(names) or failing
    if names:
        shown = [t for t in shown if any(fnmatch.fnmatchcase(t.name, p) for p in names)]
    if failing:
        shown = [t for t in shown if not t.ok]
    for t in shown:
        mark = "FIRST DIVERGENCE" if t is first else ("" if t.ok else t.status)
        if t.status in ("shape mismatch",):
            rows.append((t.name, _shape(t.shape), *("-",) * (len(rows[0]) - 3), f"{mark}: candidate {_shape(t.candidate_shape)}"))
            continue
        golden_err = (f"{t.golden_error:.1e}" if t.golden_error is not None else "-",) if certified else ()
        rms = _ratio(abs(t.mean_error) / t.bias_tolerance) if t.bias_tolerance else "-"
        over = _ratio(t.max_over_tol) if t.first_bad is None or t.status != "values differ" else "-"
        rows.append((t.name, _shape(t.shape), f"{t.max_abs:.2e}", f"{t.max_rel:.2e}", *golden_err, over, rms,
                     f"{100 * t.frac_out:.1f}%", mark))
    k = len(rows[0]) - 1
    widths = [max(len(r[i]) for r in rows) for i in range(k)]
    lines = ["  ".join(c.ljust(w) if i == 0 or i == 1 else c.rjust(w) for i, (c, w) in enumerate(zip(r[:k], widths)))
             + ("  " + r[k] if r[k] else "") for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    if filtered:
        what = " and ".join(x for x in ((f"--names {' '.join(names)}" if names else ""), ("--failing" if failing else ""))
                            if x)
        lines.append(f"({len(shown)} of {len(report.tensors)} tensors shown: {what})")
    elif len(shown) < len(report.tensors):
        lines.append(f"… {len(report.tensors) - len(shown)} more tensors")
    lines.append("")
    tol = report.tolerance
    if tol["profile"]:
        lines.append(f"tolerance: profile {tol['profile']}: |cand − ref| ≤ atol_X + rtol·|ref|, rtol = {GROWTH}·u = "
                     f"{tol['rtol']:.2e}, atol_X = {GROWTH}·u·(c_X + S_X)  (u = {tol['unit_roundoff']:.3g}); "
                     f"bias: |mean(cand − ref)| ≤ {BIAS_GROWTH}·u·(r_X + RMS(ref))·max(1, √({BIAS_FULL_ELEMENTS}/n)) "
                     f"on n ≥ {BIAS_MIN_ELEMENTS} elements, where the rows agree (t ≥ {ROW_T:g}); softmax rows "
                     f"judged up to one factor per row, log_probs up to one shift (|factor − 1|, |shift| ≤ {GROWTH}·u·(f_X + 1)), logits up to any shift per "
                     f"position. max abs/max rel: after that factor or shift; max/tol and bias/tol: 1 is the limit")
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
    if report.too_little:
        lines.append(f"FAIL: compared too little: {'; '.join(report.too_little)}")
        if first is not None:
            lines.append(describe_divergence(first))
    elif first is None:
        lines.append(f"OK: all {len(report.tensors)} tensors within tolerance")
    else:
        lines.append(f"FAIL: {len(report.tensors) - n_ok} of {len(report.tensors)} tensors out of tolerance")
        lines.append(describe_divergence(first))
    return "\n".join(lines)


def describe_divergence(t: TensorResult) -> str:
    """One paragraph: which tensor, where, and by how much. Every value it prints is a file's own
    value at the index it prints (the reference's ``probs`` are exp of the golden's log_probs)."""
    where = f"layer {t.layer}" if t.layer is not None else "outside the blocks"
    named = f"step {t.step}, {inner_name(t.name)}" if t.step is not None else t.name
    if t.status == "shape mismatch":
        return (f"first divergence: {named} ({where}): shape {_shape(t.candidate_shape)}, "
                f"expected {_shape(t.shape)}{_shape_hint(t)}")
    kind = "gradient" if is_gradient(t.name) else "tensor"
    tail = f" Every {kind} after it inherits the error: look here first." + _backward_hint(t) + _certified(t)
    if t.status == "systematic error":
        return (f"first divergence: {named} ({where}): a systematic error: every element is within its "
                f"tolerance, but the mean signed error {t.mean_error:.3g} is {abs(t.mean_error) / t.bias_tolerance:.3g}× "
                f"the most rounding gives ({t.bias_tolerance:.3g}; RMS error {t.rms:.3g}): a wrong constant or "
                f"formula in the op that computes this {kind}, not noise." + tail)
    e = t.first_bad
    if t.status == "near tie":
        return f"first divergence: {named}: {t.notes[-1]}: not a bug; the steps after it ran on other tokens."
    if t.status == "values differ":
        return (f"first divergence: {named} ({where}), first at {_at(e, t)} (index {list(e.index)}): candidate "
                f"{e.candidate:.9g}, reference {e.reference:.9g}; everything after it ran on different input")
    parts = []
    row = t.row
    if row is not None and row.rows_out:
        parts.append(_row_failure(t, row))
    if e is not None:
        text = (f"first at {_at(e, t)} (index {list(e.index)}): candidate {e.candidate:.9g}, reference "
                f"{e.reference:.9g}{_reference_is(t.name)}, {_judged(e)} {e.judged_difference:.3g} > tolerance "
                f"{e.tolerance:.3g}; {_fraction(t)} are out{_beyond(row)}")
        w = t.worst
        if w is not None and w.index != e.index:
            text += (f"; furthest beyond its tolerance at index {list(w.index)}: candidate {w.candidate:.9g}, "
                     f"reference {w.reference:.9g}, {_judged(w)} {w.judged_difference:.3g}, "
                     f"{w.judged_difference / w.tolerance if w.tolerance else math.inf:.3g}× its tolerance "
                     f"{w.tolerance:.3g}")
        parts.append(text)
    joiner = ": " if row is not None and row.rows_out else ", "
    return f"first divergence: {named} ({where}){joiner}" + "; ".join(parts) + "." + tail


def _at(e: Element, t: TensorResult) -> str:
    """Where an element is: "batch 0, pos 3, d_model 17"; in a decode or padded golden "row 0, position 7, …"
    (the absolute position in the row: a decode step's new rows continue after the earlier ones)."""
    words = {"batch": "row", "pos": "position", "key_pos": "key position"} if t.sequences else {}
    return ", ".join(f"{words.get(k, k)} {v}" for k, v in e.where.items() if k != "1")


def _shape_hint(t: TensorResult) -> str:
    """What a decode step's wrong shape usually means."""
    if t.step is None or len(t.shape) < 2 or len(t.candidate_shape) != len(t.shape):
        return ""
    inner = inner_name(t.name)
    keys = 1 if inner.endswith(("attn.cache_k", "attn.cache_v")) else (
        len(t.shape) - 1 if inner.endswith(("hook_attn_scores", "hook_pattern")) else None)
    if keys is None:
        return ""
    got, want = t.candidate_shape[keys], t.shape[keys]
    what = "keys" if inner.endswith(("hook_attn_scores", "hook_pattern")) else "cached positions"
    if got == want:
        return ""
    more = "more" if got > want else "fewer"
    return (f": {abs(got - want)} {more} {what} than the {want} the reference has after step {t.step} (a cache "
            f"{'appended twice' if got > want else 'not appended, or the newest key missing'}?)")


def _reference_is(name) -> str:
    return " (exp of the golden's log_probs)" if inner_name(name) == "probs" else ""


def _judged(e: Element) -> str:
    """How the element's difference is judged: plain, after its row's shift, or after its row's factor."""
    if e.row_shift is not None:
        return f"judged after the row's shift {e.row_shift:.6g}: |candidate − shift − reference|"
    if e.row_factor is not None:
        return f"judged after the row's factor {e.row_factor:.9g}: |candidate/factor − reference|"
    return "|diff|"


def _fraction(t: TensorResult) -> str:
    """How many elements are out, counted and as a share, never rounded to 0 % (or 100 %) unless it is."""
    k, n = t.n_out, t.n_compared
    share = 100 * k / n if n else 0.0
    return f"{k} of {n} elements ({share:.2g}%)" if (0 < share < 0.1 or 99.9 < share < 100) else \
        f"{k} of {n} elements ({share:.1f}%)"


def _beyond(row: RowFreedom | None) -> str:
    if row is None:
        return ""
    return " beyond their row's shift" if row.kind == "shift" else " beyond their row's factor"


def _row_failure(t: TensorResult, row: RowFreedom) -> str:
    """The first row whose factor or shift is beyond its bound, with the files' sums for a factor."""
    name = t.name
    labels = axes(name, len(t.shape))[:-1]
    where = _where(name, tuple(row.first_out) + (0,), t.offset)
    words = {"batch": "row", "pos": "position"} if t.sequences else {}
    at = f"{row.first_out} ({', '.join(f'{words.get(k, k)} {where[k]}' for k in labels if k != '1')})"
    if row.kind == "factor":
        c, r = row.first_out_sums
        return (f"the row at {at} sums to {c:.9g} in the candidate and {r:.9g} in the reference"
                f"{_reference_is(name)}: a factor {row.first_out_value:.9g}, |factor − 1| "
                f"{abs(row.first_out_value - 1):.3g} > {row.bound:.3g}, more than rounding of the row's one sum "
                f"gives ({row.rows_out} rows are beyond it)")
    return (f"the row at {at} is shifted by {row.first_out_value:.6g} (the median over the row of "
            f"candidate − reference), |shift| > {row.bound:.3g}, more than rounding of the row's one log-sum gives "
            f"({row.rows_out} rows are beyond it)")


def _certified(t: TensorResult) -> str:
    if t.golden_error is None:
        return ""
    return (f" The golden's own error at {t.name} is ≤ {t.golden_error:.1e} relative to its scale "
            f"(measured, --certify); yours is {t.max_rel:.1e}.")


def _backward_hint(t: TensorResult) -> str:
    if not is_gradient(t.name):
        return ""
    op = backward_op(t.name, t.n_layers)
    return (f" Gradients are walked in backward order (logits → embeddings), after the forward tensors: "
            f"the backward of {op or 'the op that computes it'} is wrong.")


def _ratio(x):
    return f"{x:.2f}" if x < 1000 else f"{x:.1e}"


def _shape(s):
    return "[" + ", ".join(str(i) for i in s) + "]"


def _few(names, k=6):
    return ", ".join(names[:k]) + (", …" if len(names) > k else "")


__all__ = ["GROWTH", "UNIT_ROUNDOFF", "Element", "LogitsSummary", "Report", "TensorResult", "compare",
           "describe_divergence", "format_report", "forward_key"]
