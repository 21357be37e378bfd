"""Golden files: every number of one forward pass, in a file any language can read.

A golden file is a safetensors file (an 8-byte length, a JSON header, raw little-endian arrays)
holding, under refgpt's names (refgpt/oracle/name_maps.py):

    tokens [batch, pos] int64, targets [batch, pos − 1] int64
    every hook point's activation (or those selected), each LayerNorm's output (``….out``)
    logits, log_probs [batch, pos, d_vocab], loss [batch, pos − 1]

— targets and loss are [batch, pos] when the tokens come with their own targets (llm.c's y) —
and with ``backward`` the mean loss ``loss_mean`` and every gradient ``grad.*``
(refgpt/oracle/gradients.py); in the header's ``__metadata__`` (strings; JSON where structured):
the refgpt version, the model's config, the sha256 of each weight file (for a GGUF file, each
tensor's quantization type too: ``quantization``), the dtype, the NumPy and
BLAS versions, the command line, whether the targets were given, the **conditioning** c_X and the
RMS error r_X of every tensor, and with ``--certify`` the golden's own error
(refgpt/oracle/certify.py).

Conditioning. How far a correct float32 implementation may land from the float64 truth depends
on the tensor, not only on float32: an attention pattern computed from scores of size 100 inherits
an error of about 100·u, where u = 2⁻²⁴ is float32's unit roundoff, though the pattern itself is
at most 1. So the golden writer runs the forward pass a second time in float32 and records, per
tensor X,

    c_X = max |X_float32 − X_float64| / 2⁻²⁴        (in units of float32's roundoff)
    r_X = RMS(X_float32 − X_float64) / 2⁻²⁴         (the same error's root mean square)

a measured condition number of X for this model and these tokens. The oracle (refgpt/oracle/comparison.py)
scales its tolerances by it, for every format: to first order a forward error is proportional to
the unit roundoff, so c_X·u_bf16 is the error a bfloat16 pass makes where c_X·u_f32 is a float32
pass's (docs/oracle.md measures how well this holds). c_X bounds each element's error, r_X the
bias of a whole tensor (comparison.py, the bias bound).

Three float32 passes: two accumulation orders and a perturbation. The error of a correct port
depends on how it adds: refgpt's own float32 pass sums pairwise (NumPy) and in BLAS's blocks, a
port written as loops one term at a time, with errors that grow with the length of the sum and
are shared by a whole row (one softmax denominator, one LayerNorm σ). So c_X and r_X are the
largest of three passes':
refgpt's, refgpt/oracle/sequential.py's, which sums in index order as loops do, and
refgpt/oracle/perturbed.py's, refgpt's with one more random rounding at every hook point, which
measures a cancellation that both orders happen to round to exactly 0.

Normalised rows. A softmax row is divided by one sum, so a port's rounding of that sum scales
the whole row by one factor; a log-softmax row is shifted by one log-sum; logits are defined only
up to a constant per position (a centred unembedding adds one). The oracle judges these tensors
up to that per-row factor or shift (``ROW_FREEDOM``), and the golden measures the same way: c_X of
``probs`` and ``hook_pattern`` after each pass's own row factor (the r-weighted median of pass/reference
over the row's largest entries) is divided out, of ``logits`` and ``log_probs`` after each row's own
shift (the median over the row of pass − reference) is taken away, and f_X (``row_freedom``) = the largest |factor − 1| or |shift| over the rows, in units of
2⁻²⁴, which bounds how far a port's row factor or shift may stray (none for ``logits``: any
shift is right). ``probs`` (what llm.c keeps of the softmax) is not in the file but measured,
relative to p, for llm.c candidates.

Streaming. ``write_streamed`` (what ``refgpt golden`` runs for a forward golden) never holds the
file: the header goes first (every shape follows from the config, ``layout``), then each tensor as
the forward pass, driven a stage at a time by ``stream``, makes it; the float32 pass for c_X and r_X
runs beside it and fills the room left for them in the header. ``write(make(…))`` writes the same
bytes from memory (tests/oracle/test_streaming.py).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..gpt2.activations import log_softmax
from ..tl.cache import ActivationCache
from ..files.checkpoint import load as load_checkpoint, weight_files
from ..gpt2.config import Config
from ..dtypes import widen_bfloat16
from .. import memory, strict_json, threads
from ..errors import RefGPTError, RefGPTTypeError
from ..tl.hooks import HookRun
from ..gpt2.ln_views import cached_output
from ..gpt2.padding import position_ids
from ..model import Model
from .gradients import compute_gradients
from . import perturbed
from ..files.safetensors_file import SafetensorsFile, SafetensorsWriter, header_bytes
from ..version import __version__
from .name_maps import forward_order, inner_name
from ..reference.compare import F32_TINY, row_adjusted, row_freedom_of  # the row rule: one home

FORMAT = "refgpt-golden"
FORMAT_VERSION = "2"  # 2: c_X of the logits shift-invariant, row_freedom (issue 25)
F32_ROUNDOFF = 2.0**-24

@dataclass
class Golden:
    """A golden file's contents: ``tensors`` (name → array, in forward order) and ``metadata``."""

    tensors: dict[str, np.ndarray]
    metadata: dict[str, str] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)  # stored safetensors dtype codes, when read
    file: SafetensorsFile | None = field(default=None, repr=False, compare=False)  # the mapped file, when read

    def release(self, name: str) -> None:
        """Drop the pages of a read tensor from memory (they are read again if touched): a walk
        over a file larger than memory then holds about one tensor at a time."""
        if self.file is not None and name in self.tensors and name in self.dtypes:
            self.file.release(name)

    @property
    def config(self) -> Config | None:
        text = self.metadata.get("config")
        if not text:
            return None
        return Config.from_hf(strict_json.loads(text, "golden metadata 'config'"), source="golden config")

    @property
    def conditioning(self) -> dict[str, float]:
        """c_X per tensor (see the module docstring), each a finite number ≥ 0; empty if the file
        has none."""
        return checked_conditioning(strict_json.loads(self.metadata.get("conditioning", "{}"),
                                                      "golden metadata 'conditioning'"))

    @property
    def golden_error(self) -> dict[str, float]:
        """This file's own measured error per tensor, relative to its scale (``--certify``,
        refgpt/oracle/certify.py); empty if the file has none."""
        return checked_conditioning(strict_json.loads(self.metadata.get("golden_error", "{}"),
                                                      "golden metadata 'golden_error'"), "golden metadata 'golden_error'")

    @property
    def error_rms(self) -> dict[str, float]:
        """r_X per tensor: the RMS error of the float32 passes, in units of 2⁻²⁴; empty if none."""
        return checked_conditioning(strict_json.loads(self.metadata.get("error_rms", "{}"),
                                                      "golden metadata 'error_rms'"), "golden metadata 'error_rms'")

    @property
    def row_freedom(self) -> dict[str, float]:
        """f_X per normalised-row tensor (module docstring): the largest per-row factor − 1 or
        shift of the float32 passes, in units of 2⁻²⁴; empty in a file older than format 2."""
        return checked_conditioning(strict_json.loads(self.metadata.get("row_freedom", "{}"),
                                                      "golden metadata 'row_freedom'"), "golden metadata 'row_freedom'")

    @property
    def format_version(self) -> int:
        text = self.metadata.get("format_version", "1")
        return int(text) if text.isdigit() else 1


def checked_conditioning(values, where="golden metadata 'conditioning'") -> dict[str, float]:
    """``values`` as {tensor name: number} (c_X, r_X or a golden error), refusing anything but
    finite numbers ≥ 0: a NaN or infinite c_X would pass every tensor, a negative one fail identical
    files."""
    if not isinstance(values, dict):
        raise RefGPTError(f"{where}: expected an object of tensor name → number, found {type(values).__name__}")
    for name, c in values.items():
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c < math.inf:
            raise RefGPTError(f"{where}: the value of {name!r} must be a finite number ≥ 0, found {c!r:.40}")
    return {name: float(c) for name, c in values.items()}


# ---- computing ----------------------------------------------------------------------------------


def golden_names(model: Model) -> list[str]:
    """Every tensor name a full golden file of this model holds, in forward order."""
    names = ["tokens", "targets", *model.hook_names, "logits", "log_probs", "loss"]
    names += [n[: -len("hook_normalized")] + "out" for n in model.hook_names if n.endswith("hook_normalized")]
    return forward_order(names)


def select(model: Model, patterns) -> list[str]:
    """The golden names matching any of the glob ``patterns`` (None: all); tokens, logits,
    log_probs and loss are always kept."""
    names = golden_names(model)
    if patterns is None:
        return names
    if not isinstance(patterns, (str, list, tuple)) or not all(isinstance(p, str) for p in ([patterns] if isinstance(patterns, str) else patterns)):
        raise RefGPTTypeError(f"names: expected glob patterns (str or a list of str), found {patterns!r:.60}")
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    keep = {"tokens", "targets", "logits", "log_probs", "loss"}
    chosen = [n for n in names if n in keep or any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if unmatched:
        raise RefGPTError(f"--names: {unmatched[0]!r} matches no tensor (e.g. 'blocks.*.hook_resid_post', "
                          f"'blocks.0.*', '*ln1*')")
    return chosen


def compute(model: Model, tokens, names=None, fwd_hooks=(), targets=None, backward=False,
            attention_mask=None, progress=None) -> dict[str, np.ndarray]:
    """The golden tensors (``names`` from :func:`golden_names`; None: all) of one forward pass,
    and with ``backward`` the loss and every gradient (refgpt/oracle/gradients.py).

    ``fwd_hooks`` run as in ``model.run_with_hooks``: the golden values are what flowed, which is
    how tests build a candidate with an error injected at a known place (the backward pass ignores
    them). ``targets`` [batch, pos]: one target per input position, as llm.c's y (default: the
    next token inside ``tokens``, [batch, pos − 1]). ``attention_mask`` [batch, pos] (1 real, 0
    pad): a padded batch (refgpt/gpt2/padding.py), adding ``attention_mask`` and ``position_ids``;
    its loss is 0 where a target is not a real token after a real one (forward only).
    ``progress()`` is called once per block of the forward pass and of the backward pass.
    """
    if attention_mask is not None and backward:
        raise RefGPTError("golden: the backward pass of a padded batch is not implemented; give rows of one "
                          "length for --backward")
    tokens, _ = model.check_tokens(tokens)  # [batch, pos]
    if names is not None and (isinstance(names, str) or not isinstance(names, (list, tuple))
                              or not all(isinstance(n, str) for n in names)):
        raise RefGPTTypeError(f"names: expected a list of golden tensor names, found {names!r:.60}")
    targets = check_golden_targets(model, tokens, targets)  # [batch, pos − 1] or [batch, pos]
    wanted = golden_names(model) if names is None else list(names)
    hooks = set(model.hook_names)
    need = {n for n in wanted if n in hooks}
    need |= {n[: -len("out")] + "hook_normalized" for n in wanted if n.endswith(".out")}
    ticks = block_ticks(model, progress)
    logits, cache = model.run_with_cache(tokens, names=sorted(need), fwd_hooks=[*fwd_hooks, *ticks[0]],
                                         attention_mask=attention_mask)  # [batch, pos, d_vocab]
    log_probs = log_softmax(logits)  # [batch, pos, d_vocab]
    b_idx, t_idx = np.indices(targets.shape)  # [batch, pos − 1] (or [batch, pos]) each
    out = {}
    if attention_mask is not None:
        mask = np.asarray(attention_mask, np.int64)  # [batch, pos]
        out["attention_mask"], out["position_ids"] = mask, np.where(mask == 1, position_ids(mask), 0)  # pads: 0
    for name in forward_order(wanted):
        if name == "tokens":
            out[name] = tokens
        elif name == "targets":
            out[name] = targets  # [batch, pos − 1] (or [batch, pos])
        elif name == "logits":
            out[name] = logits
        elif name == "log_probs":
            out[name] = log_probs
        elif name == "loss":
            out[name] = -log_probs[b_idx, t_idx, targets]  # [batch, pos − 1] (or [batch, pos])
            if attention_mask is not None:  # a real target after a real position only
                counted = mask[:, :-1] * mask[:, 1:] if targets.shape[1] < tokens.shape[1] else mask
                out[name] = np.where(counted == 1, out[name], 0.0).astype(logits.dtype)
        elif name.endswith(".out"):
            out[name] = cached_output(cache, name[: -len("out")])  # "blocks.3.ln1." or "ln_final."
        elif name in hooks:
            out[name] = np.asarray(cache[name])
        else:
            raise RefGPTError(f"golden: {name!r} is not a tensor of this model's golden file")
    if backward:
        with model.hooks(bwd_hooks=ticks[1]):
            out.update(compute_gradients(model, tokens, targets))
    return out


def block_ticks(model: Model, progress):
    """(forward hooks, backward hooks) that call ``progress()`` once per block, changing nothing."""
    if progress is None:
        return [], []

    def tick(activation, hook):
        progress()

    names = [f"blocks.{L}.hook_resid_post" for L in range(model.cfg.n_layers)]
    return [(n, tick) for n in names], [(n, tick) for n in names]


def stream(model: Model, tokens, names=None, fwd_hooks=(), targets=None):
    """Yield (name, tensor) for the golden tensors of one forward pass as it makes them, one stage
    at a time (the embedding, each block, the unembedding): only one stage's activations are ever
    held, which is what lets ``write_streamed`` write GPT-2 XL's 32 GB golden on a 24 GB machine.
    The same forward pass as ``compute`` (without ``backward``): the same numbers.
    """
    tokens, _ = model.check_tokens(tokens)  # [batch, pos]
    targets = check_golden_targets(model, tokens, targets)  # [batch, pos − 1] or [batch, pos]
    wanted = set(_checked_names(model, names))
    hooks = set(model.hook_names)
    need = {n for n in wanted if n in hooks}
    need |= {n[: -len("out")] + "hook_normalized" for n in wanted if n.endswith(".out")}
    with model.hooks(fwd_hooks):  # the run keeps the model's hooks and these, as run_with_hooks would
        run = HookRun(model.hook_dict, sorted(need))
    if "tokens" in wanted:
        yield "tokens", tokens
    resid = model.embed(tokens, run)  # [batch, pos, d_model]
    yield from _stage_tensors(model, run, wanted)
    for L in range(model.cfg.n_layers):
        resid = model.block(L, resid, run)  # [batch, pos, d_model]
        yield from _stage_tensors(model, run, wanted)
    memory.release()  # the blocks' recycled arrays (refgpt/memory.py), read and let go, unmapped before the logits
    logits = model.logits_from_resid(resid, run)  # [batch, pos, d_vocab]
    yield from _stage_tensors(model, run, wanted)
    del resid
    if wanted & {"logits", "log_probs", "loss"}:
        if "logits" in wanted:
            yield "logits", logits  # log_probs made after: not held while a reader measures the logits
        log_probs = log_softmax(logits)  # [batch, pos, d_vocab]
        del logits
        memory.release()  # the logits' recycled mapping unmapped, not kept for a next pass beside every log_probs
        if "log_probs" in wanted:
            yield "log_probs", log_probs
        if "loss" in wanted:
            b_idx, t_idx = np.indices(targets.shape)  # [batch, pos − 1] (or [batch, pos]) each
            yield "loss", -log_probs[b_idx, t_idx, targets]  # [batch, pos − 1] (or [batch, pos])
    if "targets" in wanted:
        yield "targets", targets  # [batch, pos − 1] (or [batch, pos])


def _stage_tensors(model, run, wanted):
    """The golden tensors among the activations ``run`` cached in the stage just run (each
    LayerNorm's output made from its cached x̂: w ⊙ x̂ + b), in forward order; then forget them."""
    made = {name: np.asarray(a) for name, a in run.cache.items() if name in wanted}
    cache = ActivationCache(run.cache, model)
    for name in run.cache:
        ln = name[: -len("hook_normalized")]  # "blocks.3.ln1." or "ln_final."
        if name.endswith("hook_normalized") and ln + "out" in wanted:
            made[ln + "out"] = cached_output(cache, ln)  # [batch, pos, d_model]
    run.cache.clear()
    for name in forward_order(made):
        yield name, made.pop(name)


def _checked_names(model, names):
    known = golden_names(model)
    if names is None:
        return known
    unknown = set(names) - set(known)
    if unknown:
        raise RefGPTError(f"golden: {sorted(unknown)[0]!r} is not a tensor of this model's golden file")
    return list(names)


def layout(model: Model, tokens_shape, names=None, targets_given=False) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """name → (dtype, shape) of every golden tensor, in file (forward) order, from the config and
    the tokens' shape [batch, pos] alone: what lets the header be written before the pass."""
    cfg, dtype = model.cfg, model.dtype
    batch, pos = tokens_shape
    heads = (batch, pos, cfg.n_heads, cfg.d_head)
    by_suffix = {"hook_mean": (batch, pos, 1), "hook_scale": (batch, pos, 1),
                 "hook_q": heads, "hook_k": heads, "hook_v": heads, "hook_z": heads,
                 "hook_attn_scores": (batch, cfg.n_heads, pos, pos), "hook_pattern": (batch, cfg.n_heads, pos, pos),
                 "hook_pre": (batch, pos, cfg.d_mlp), "hook_post": (batch, pos, cfg.d_mlp)}
    n_targets = pos if targets_given else pos - 1  # one per input (llm.c's y), or the next tokens
    whole = {"tokens": (np.dtype(np.int64), (batch, pos)), "targets": (np.dtype(np.int64), (batch, n_targets)),
             "logits": (dtype, (batch, pos, cfg.d_vocab)), "log_probs": (dtype, (batch, pos, cfg.d_vocab)),
             "loss": (dtype, (batch, n_targets))}
    out = {}
    for name in forward_order(_checked_names(model, names)):
        suffix = name.rsplit(".", 1)[-1]
        out[name] = whole.get(name) or (dtype, by_suffix.get(suffix, (batch, pos, cfg.d_model)))
    return out


def _passes(model: Model, tokens, names, targets=None):
    """Yield (name, the golden tensor, its float64 value, its float32 values): the model's pass, a
    float64 pass, a float32 pass of the same weights, the sequential port's float32 pass
    (refgpt/oracle/sequential.py, None for a tensor it does not make) and the perturbed float32
    pass (refgpt/oracle/perturbed.py), run a stage at a time side
    by side (``stream``), so only a stage's activations of each are held. A pass that would repeat
    another (the model's own pass is the float64 one when it is float64 and unhooked) is run once.
    Last, ``probs``, which no file holds: (name, None, p, (refgpt's, the sequential port's, the perturbed one's)),
    each pass's p but the sequential port's made a block of rows at a time as it is read (``_Probs``)."""
    from . import sequential

    hooked = bool(HookRun(model.hook_dict).hooks)  # hooks on the model's hook points
    exact = model if model.dtype == np.float64 and not hooked else Model(model.cfg, dict(model.params), dtype="float64")
    rounded = model if model.dtype == np.float32 and not hooked else float32_twin(model)  # weights rounded as a float32 port rounds them
    passes = list(dict.fromkeys([model, exact, rounded]))  # the distinct models
    checked, _ = model.check_tokens(tokens)
    twin = sequential.stages(model.cfg, rounded.params, checked,
                             None if targets is None else check_golden_targets(model, checked, targets))
    twin_names, stage, probs = set(sequential.golden_names(model.cfg)), {}, None
    mc = stream(rounded, tokens, names, fwd_hooks=perturbed.hooks(), targets=targets)  # the perturbed pass
    streams = [*(stream(m, tokens, names, targets=targets) for m in passes), mc]
    while True:  # not zip (nor enumerate in the reader), which would hold the last tensors while making the next
        tensors = [next(s, None) for s in streams]  # [(name, tensor)] of each pass, the perturbed one's last
        if tensors[0] is None:
            assert all(t is None for t in tensors), tensors  # every pass makes the same tensors in the same order
            break
        name = tensors[0][0]
        assert all(t is not None and t[0] == name for t in tensors), tensors
        made, (_, y) = dict(zip(passes, tensors)), tensors[-1]
        while name in twin_names and name not in stage:
            stage = next(twin)  # the sequential port's next stage, the last one let go
        r, x = made[exact][1], made[rounded][1]
        yield name, made[model][1], r, (x, stage.pop(name, None), y)  # the twin's tensor let go once read
        if name == "log_probs":
            probs = (_Probs(r), (_Probs(x), stage.get("probs"), _Probs(y)))
        del tensors, made, r, x, y  # let go before the passes make their next tensors (the reader has too)
    if probs is not None:
        stage = None
        twin.close()  # let go of the sequential port's logits and log_probs: only its probs are read now
        yield "probs", None, *probs


class _Probs:
    """exp(log_probs) in float64, made a block of rows at a time as the error model reads it
    (``_row_reader``): at GPT-2 medium's shape and T = 1024 a whole one is 400 MB."""

    dtype = np.dtype(np.float64)

    def __init__(self, log_probs):
        self.log_probs = log_probs
        self.shape = np.shape(log_probs)


def _row_reader(a):
    """``a`` [..., n] (an array, or ``_Probs``) as ([rows, n], read(i, j): its rows i … j − 1 in float64)."""
    if isinstance(a, _Probs):
        log_probs = threads.rows(np.asarray(a.log_probs))  # [rows, n]
        return log_probs.shape, lambda i, j: np.exp(log_probs[i:j].astype(np.float64, copy=False))  # [j − i, n]
    rows = threads.rows(np.asarray(a))  # [rows, n] (a view when C-contiguous)
    return rows.shape, lambda i, j: rows[i:j].astype(np.float64, copy=False)  # [j − i, n]


def float32_twin(model: Model) -> Model:
    """``model`` with its weights rounded to float32.

    When the weights are those of a float32 checkpoint, unchanged (checked tensor by tensor), the
    file's memory-mapped tensors *are* the rounded weights, and the twin is loaded from it without
    a copy: for GPT-2 XL that is 6 GB of memory not taken. Otherwise the weights are rounded
    into a copy."""
    params = dict(model.params)
    if model.source is not None:
        try:
            stored = load_checkpoint(model.source, dtype="float32", tokenizer=False)
        except RefGPTError:
            stored = None
        if (stored is not None and stored.cfg == model.cfg and set(stored.params) == set(params)
                and all(np.array_equal(stored.params[n], params[n]) for n in params)):
            return stored
    return Model(model.cfg, params, dtype="float32")


def check_golden_targets(model: Model, tokens, targets) -> np.ndarray:
    """``targets`` as int64 [batch, pos] (one per input, llm.c's y), or the next tokens
    [batch, pos − 1] when None."""
    if targets is None:
        return tokens[:, 1:]  # [batch, pos − 1]
    t = np.asarray(targets)
    if t.ndim == 1 and tokens.shape[0] == 1:
        t = t[None]  # [1, pos]
    if t.dtype == bool or t.dtype.kind not in "iu":
        raise RefGPTError(f"targets: must be integer token ids, found dtype {t.dtype}")
    if t.shape != tokens.shape:
        raise RefGPTError(f"targets: shape {list(t.shape)}, expected {list(tokens.shape)} (one per input token, "
                          f"as llm.c's y), or none for next-token targets inside the tokens")
    if t.size and (t.min() < 0 or t.max() >= model.cfg.d_vocab):
        raise RefGPTError(f"targets: ids must be in [0, {model.cfg.d_vocab}), found {int(t.min())}..{int(t.max())}")
    return t.astype(np.int64)


def conditioning(model: Model, tokens, names=None, targets=None, backward=False) -> dict[str, float]:
    """c_X = max|X_float32 − X_float64| / 2⁻²⁴ for every float golden tensor X."""
    return float32_errors(model, tokens, names, targets, backward)[0]


#: Tensors judged up to a per-row freedom (module docstring): name → "factor" or "shift", and
#: whether that freedom is bounded (by f_X) or free.
def float32_errors(model: Model, tokens, names=None, targets=None, backward=False, reference=None,
                   attention_mask=None, progress=None):
    """(c_X, r_X, f_X) per float golden tensor X: the largest and the root-mean-square error of
    the float32 passes against float64 — refgpt's own, the sequential port's
    (refgpt/oracle/sequential.py) and the perturbed one's (refgpt/oracle/perturbed.py), the
    largest of the three — and for normalised-row tensors the
    largest row factor − 1 or shift (module docstring), all in units of 2⁻²⁴
    (refgpt/oracle/comparison.py bounds a candidate's error elementwise by c_X, its bias by r_X,
    its row factors by f_X). ``reference``: the float64 tensors, when already computed."""
    from . import sequential

    params = dict(model.params)
    rounded = float32_twin(model)  # the same weights, rounded as a float32 port rounds them
    if reference is None or model.dtype != np.float64:
        exact = Model(model.cfg, params, dtype="float64")
        reference = compute(exact, tokens, names, targets=targets, backward=backward, attention_mask=attention_mask,
                            progress=progress)
    ref = reference
    f32 = compute(rounded, tokens, names, targets=targets, backward=backward, attention_mask=attention_mask,
                  progress=progress)
    tokens_checked, _ = model.check_tokens(tokens)
    seq = sequential.compute(model.cfg, rounded.params, tokens_checked, check_golden_targets(model, tokens_checked, targets)
                             if targets is not None else None, backward, attention_mask)
    mc = compute(rounded, tokens, names, fwd_hooks=perturbed.hooks(), targets=targets, attention_mask=attention_mask)
    if backward:
        mc.update(perturbed.gradients(rounded, tokens_checked, check_golden_targets(model, tokens_checked, targets)))
    if progress is not None:
        for _ in range(model.cfg.n_layers * (2 if backward else 1)):
            progress()
    errors = ErrorModel()
    for name, r in ref.items():
        if r.dtype.kind == "f":
            errors.add(name, r, f32[name], seq.get(name), mc.get(name))
    if "log_probs" in ref and "log_probs" in f32:
        errors.add("probs", _Probs(ref["log_probs"]), _Probs(f32["log_probs"]), seq.get("probs"), _Probs(mc["log_probs"]))
    return tuple({n: d[n] for n in forward_order(d)} for d in (errors.c, errors.rms, errors.freedom))


class ErrorModel:
    """c_X, r_X and f_X (``float32_errors``) gathered tensor by tensor: the largest over the passes."""

    def __init__(self):
        self.c, self.rms, self.freedom = {}, {}, {}

    def add(self, name, r, *passes):
        """Add tensor ``name`` with float64 value ``r`` and its value in each float32 pass (None, a
        wrong shape or a non-finite value where the reference is finite: that pass is not counted;
        the first pass, refgpt's own, always is)."""
        for i, x in enumerate(passes):
            if x is None or np.shape(x) != np.shape(r):
                continue
            if i and not _finite_where_finite(r, x):
                continue
            c, rms, f = float32_error(name, r, x)
            self.c[name], self.rms[name] = max(self.c.get(name, 0.0), c), max(self.rms.get(name, 0.0), rms)
            if f is not None:
                self.freedom[name] = max(self.freedom.get(name, 0.0), f)

    def metadata(self) -> dict[str, str]:
        """The three as a golden file's metadata strings, each in forward order."""
        return {key: json.dumps({n: values[n] for n in forward_order(values)})
                for key, values in (("conditioning", self.c), ("error_rms", self.rms), ("row_freedom", self.freedom))}


def float32_error(name, r, x) -> tuple[float, float, float | None]:
    """(c_X, r_X, f_X) of one tensor: the largest and the RMS |x − r| over the finite entries of the
    float64 ``r`` (attention scores: the causal part), in units of 2⁻²⁴, after a normalised row's
    factor or shift is taken out (``row_adjusted``; f_X: its largest size, None for other tensors and
    for the logits, whose shift is free); ``probs`` relative to p, where p ≥ float32's smallest normal.

    A block of rows at a time (``ERROR_BLOCK_BYTES`` of float64, on the threads: refgpt/threads.py),
    into one array of the compared entries' errors, in the order r[compared] reads them: the same
    numbers as the whole tensor at once (a row's factor or shift is its own; the largest error and
    the RMS's sum read that one array), without a dozen whole-tensor temporaries beside it (at GPT-2
    medium's shape and T = 1024, the logits' are 400 MB each). A shift read by ``nanmedian`` (a
    row with a non-finite reference entry) takes the tensor as one block, as before."""
    (rows, n), read_r = _row_reader(r)
    _, read_x = _row_reader(x)
    probs = inner_name(name) == "probs"  # a decode step's too
    freedom = row_freedom_of(name)

    def compared(rb):  # [block, n] the entries judged: r finite (attention scores: the causal part)
        used = np.isfinite(rb)
        return used & (rb >= F32_TINY) if probs else used

    blocks, work = _error_blocks(rows, n)
    if freedom is not None and freedom[0] == "shift" and not all(
            threads.map_blocks(lambda a, b: bool(np.isfinite(read_r(a, b)).all()), blocks, work)):
        blocks = [(0, rows)]
    counts = threads.map_blocks(lambda a, b: int(np.count_nonzero(compared(read_r(a, b)))), blocks, work)
    starts = np.cumsum([0, *counts])  # where each block's entries go in ``err``
    err = np.empty(starts[-1])  # [n_compared] |x − r| (relative to p for probs), in r[compared]'s order

    def block(k, a, b):  # fills the block's errors; its rows' largest |factor − 1| or |shift| (None: no freedom)
        rb = read_r(a, b)  # [block, n]
        xb, free = row_adjusted(name, rb, read_x(a, b))  # [block, n], [block] or None
        used = compared(rb)
        e = err[starts[k]:starts[k + 1]]  # [n_compared in block], a view
        np.subtract(xb[used], rb[used], out=e)
        np.abs(e, out=e)
        if probs:
            e /= rb[used]
        return None if free is None else np.max(np.abs(free), initial=0.0)

    largest = threads.map_blocks(block, [(k, a, b) for k, (a, b) in enumerate(blocks)], work)
    f = None
    if freedom is not None and freedom[1]:
        f = float(np.max(np.array(largest, np.float64), initial=0.0) / F32_ROUNDOFF)  # a NaN row: NaN, as before
    if not err.size:
        return 0.0, 0.0, f
    top = float(err.max() / F32_ROUNDOFF)
    return top, float(np.sqrt(np.mean(np.square(err, out=err))) / F32_ROUNDOFF), f


def _finite_where_finite(r, x) -> bool:
    """Is ``x`` finite wherever ``r`` is (arrays or ``_Probs``)? A block of rows at a time."""
    (rows, n), read_r = _row_reader(r)
    _, read_x = _row_reader(x)
    return all(threads.map_blocks(lambda a, b: bool(np.isfinite(read_x(a, b)[np.isfinite(read_r(a, b))]).all()),
                                  *_error_blocks(rows, n)))


def _error_blocks(rows, n):
    """The error model's blocks of ``rows`` rows of ``n`` float64 entries (``ERROR_BLOCK_BYTES``
    each) and the bytes of work they cover, for threads.map_blocks."""
    return threads.row_blocks(rows, n * 8, ERROR_BLOCK_BYTES), rows * n * 8


#: Rows of float64 per block of the error model (``float32_error``): small beside a tensor, large
#: beside a row (a row of GPT-2's logits is 400 kB).
ERROR_BLOCK_BYTES = 4 * 2**20


def make(model: Model, tokens, names=None, command=None, targets=None, backward=False, attention_mask=None,
         padding_side=None, pad_token_id=None, progress=None) -> Golden:
    """The golden file's contents for ``model`` on ``tokens``, with its metadata; with ``backward``
    also the mean loss and every gradient (refgpt/oracle/gradients.py). ``attention_mask`` [batch,
    pos]: a padded batch, padded on ``padding_side`` with ``pad_token_id`` (the metadata's ``padding``
    says which convention its mask and position ids follow). ``progress(done, total)``: called as
    the passes run, in blocks (``make_steps`` gives the total)."""
    tick = _counter(progress, make_steps(model, backward))
    tensors = compute(model, tokens, names, targets=targets, backward=backward, attention_mask=attention_mask,
                      progress=tick)
    cond, rms, freedom = float32_errors(model, tokens, names, targets, backward, reference=tensors,
                                        attention_mask=attention_mask, progress=tick)
    metadata = {**provenance(model, command), "conditioning": json.dumps(cond), "error_rms": json.dumps(rms),
                "row_freedom": json.dumps(freedom), "error_model": ERROR_MODEL,
                "targets": "given" if targets is not None else "next token"}
    if attention_mask is not None:
        metadata["padding"] = json.dumps(padding_metadata(padding_side, pad_token_id))
    return Golden(tensors, metadata)


def make_steps(model: Model, backward=False) -> int:
    """How many blocks ``make`` runs: three passes (float64, float32, the sequential port's), forward
    and with ``backward`` backward, one block at a time."""
    return 3 * model.cfg.n_layers * (2 if backward else 1)


def _counter(progress, total):
    """A no-argument tick calling ``progress(done, total)``, or None."""
    if progress is None:
        return None
    done = [0]

    def tick():
        done[0] += 1
        progress(min(done[0], total), total)

    return tick


def padding_metadata(side, pad_token_id) -> dict:
    """What a padded golden's ``attention_mask`` and ``position_ids`` mean (refgpt/gpt2/padding.py)."""
    return {"side": side, "pad_token_id": pad_token_id,
            "attention_mask": "1 for a real token, 0 for a pad; a pad is never attended to",
            "position_ids": "each real token's position is the number of real tokens before it in its row "
                            "(cumsum(attention_mask) - 1); a pad has position 0 and a zero position embedding "
                            "(TransformerLens's convention; HF fills pad positions with 1)",
            "judged": "real positions only: what a pad position computes is not compared (compare --judge-pads "
                      "compares it too)",
            "loss": "a target counts where it and its position are real tokens; 0 elsewhere"}


#: What the metadata's c_X, r_X and f_X were measured from (module docstring).
ERROR_MODEL = ("float32 passes against float64: refgpt's own (pairwise sums, BLAS), a sequential port's "
               "(refgpt/oracle/sequential.py: every sum in index order) and refgpt's with one more random rounding "
               "at every hook point (refgpt/oracle/perturbed.py); the largest of the three")


def provenance(model: Model, command=None) -> dict[str, str]:
    """Who made a golden file, from what, with what: the metadata before the measured errors."""
    quantization = getattr(model, "quantization", None)  # a model read from a GGUF file: its tensors' types
    return {
        **({"quantization": json.dumps(quantization, sort_keys=True)} if quantization else {}),
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "refgpt_version": __version__,
        "config": json.dumps(model.cfg.to_hf(), sort_keys=True),
        "weights_sha256": json.dumps(weight_hashes(model.source), sort_keys=True),
        "dtype": model.dtype.name,
        "numpy_version": np.__version__,
        "blas": json.dumps(_blas()),
        "python_version": platform.python_version(),
        "command": json.dumps(list(sys.argv) if command is None else list(command)),
    }


def weight_hashes(source) -> dict[str, str]:
    """{file name: sha256} of the weight files a model was loaded from, given its ``source`` (an
    llm.c .bin, or a directory with HF's model.safetensors or shards); {} for None (a model made
    in memory).

    Each file is hashed once per process and remembered by its device, inode, size and
    modification time: a sweep writes a golden file per prompt, and GPT-2 XL's 6 GB would
    otherwise be read again for each. A file replaced (refgpt writes by rename: a new inode) or
    rewritten (a new mtime) is hashed again."""
    if source is None:
        return {}
    source = Path(source)
    paths = [source] if source.is_file() else weight_files(source)
    return {path.name: _file_sha256(path) for path in paths}


_HASHED: dict[tuple, str] = {}


def _file_sha256(path: Path) -> str:
    info = path.stat()
    key = (str(path.resolve()), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    if key not in _HASHED:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _HASHED[key] = h.hexdigest()
    return _HASHED[key]


def _blas() -> dict:
    try:
        deps = np.show_config(mode="dicts").get("Build Dependencies", {})
        return {k: {"name": v.get("name"), "version": v.get("version")} for k, v in deps.items()}
    except Exception:  # numpy's build info is informational; never fail a golden file over it
        return {}


# ---- the file ---------------------------------------------------------------------------------


def write(path, golden: Golden) -> Path:
    """Write ``golden`` as a safetensors file: tensors in forward order, C-contiguous, metadata as
    strings. The same bytes as ``write_streamed`` writes for the same pass."""
    shapes = {name: (np.asarray(a).dtype, np.shape(a)) for name, a in golden.tensors.items()}
    with SafetensorsWriter(path, shapes, golden.metadata, _header_length(shapes, golden.metadata)) as out:
        for name, a in golden.tensors.items():
            out.write(name, a)
    return out.path


def write_streamed(path, model: Model, tokens, names=None, command=None, targets=None, progress=None) -> Path:
    """Make and write a golden file without ever holding it, in one pass.

    The header (every tensor's name, dtype and shape, known from the config) goes first, with room
    left for the conditioning; each tensor is written as the forward pass makes it, while a float32
    pass beside it measures the conditioning, which fills the header at the end. Memory: the
    weights (a float32 checkpoint's are mapped, not copied, for the float32 pass) and one stage's
    activations of each pass."""
    tokens, _ = model.check_tokens(tokens)  # [batch, pos]
    names = _checked_names(model, names)
    shapes = layout(model, tokens.shape, names, targets_given=targets is not None)
    meta = {**provenance(model, command), "conditioning": "{}", "error_rms": "{}", "row_freedom": "{}",
            "error_model": ERROR_MODEL, "targets": "given" if targets is not None else "next token"}

    errors = ErrorModel()
    with SafetensorsWriter(path, shapes, meta, _header_length(shapes, meta)) as out:
        done = 0
        for name, tensor, r, x in _passes(model, tokens, names, targets):
            if tensor is not None:
                out.write(name, tensor)
            done += 1
            if progress is not None:
                progress(min(done, len(shapes)), len(shapes))
            if r.dtype.kind == "f":
                errors.add(name, r, *x)
            del tensor, r, x  # let go before the passes make their next tensors (``_passes``)
        out.metadata = {**meta, **errors.metadata()}
    return out.path


def _header_length(shapes, meta) -> int:
    """The header's length in a golden file: as long as the longest conditioning could make it
    (every c_X and r_X written in 24 characters, the longest a float's repr takes), so that the streamed
    writer can leave room for the conditioning before it is measured, and both writers agree."""
    measured = [key for key in ("conditioning", "error_rms", "row_freedom") if key in meta]
    if not measured:
        return 0
    floats = [name for name, (dtype, _) in shapes.items() if np.dtype(dtype).kind == "f"]
    floats += ["probs"] if "log_probs" in shapes else []
    rows = [name for name in floats if (row_freedom_of(name) or (None, False))[1]]

    def longest(names):
        return "{" + ", ".join(f"{json.dumps(name)}: {'9' * 24}" for name in names) + "}"

    return len(header_bytes(shapes, {**meta, **{key: longest(rows if key == "row_freedom" else floats)
                                                for key in measured}}))


def read(path) -> Golden:
    """Read a golden file, or any safetensors file (its metadata may then be empty).

    Arrays are the stored bytes (memory-mapped, read-only); BF16, which NumPy has no dtype for,
    is widened to float32 exactly. ``Golden.dtypes`` keeps the stored dtype codes.
    """
    st = SafetensorsFile(path)
    tensors, dtypes = {}, {}
    for name in forward_order(st.names):
        a = st.raw(name)
        dtypes[name] = st.stored_dtype(name)
        if dtypes[name] == "BF16":
            a = widen_bfloat16(a)
        tensors[name] = a
    golden = Golden(tensors, dict(st.metadata), dtypes, st)
    try:  # the metadata is checked now, not when compare first needs it
        golden.config, golden.conditioning, golden.error_rms, golden.golden_error
    except RefGPTError as error:
        raise RefGPTError(f"{path}: {error}") from None
    return golden
