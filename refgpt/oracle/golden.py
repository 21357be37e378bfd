"""Golden files: every number of one forward pass, in a file any language can read.

A golden file is a safetensors file (an 8-byte length, a JSON header, raw little-endian arrays)
holding, under refgpt's names (refgpt/oracle/name_maps.py):

    tokens [batch, pos] int64, targets [batch, pos − 1] int64
    every hook point's activation (or those selected), each LayerNorm's output (``….out``)
    logits, log_probs [batch, pos, d_vocab], loss [batch, pos − 1]

and, in the header's ``__metadata__`` (strings; JSON where structured): the refgpt version, the
model's config, the sha256 of each weight file, the dtype, the NumPy and BLAS versions, the
command line, and the **conditioning** of every tensor.

Conditioning. How far a correct float32 implementation may land from the float64 truth depends
on the tensor, not only on float32: an attention pattern computed from scores of size 100 inherits
an error of about 100·u, where u = 2⁻²⁴ is float32's unit roundoff, though the pattern itself is
at most 1. So the golden writer runs the forward pass a second time in float32 and records, per
tensor X,

    c_X = max |X_float32 − X_float64| / 2⁻²⁴        (in units of float32's roundoff)

a measured condition number of X for this model and these tokens. The oracle (refgpt/oracle/comparison.py)
scales its tolerances by it, for every format: to first order a forward error is proportional to
the unit roundoff, so c_X·u_bf16 is the error a bfloat16 pass makes where c_X·u_f32 is a float32
pass's (docs/oracle.md measures how well this holds).

Streaming. ``write_streamed`` (what ``refgpt golden`` runs) never holds the file: the header goes
first (every shape follows from the config, ``layout``), then each tensor as the forward pass,
driven a stage at a time by ``stream``, makes it; the float32 pass for the conditioning runs
beside it and fills the room left for it in the header. ``write(make(…))`` writes the same bytes
from memory (tests/oracle/test_streaming.py).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..activations import log_softmax
from ..cache import ActivationCache
from ..checkpoint import load as load_checkpoint, weight_files
from ..config import Config
from ..dtypes import widen_bfloat16
from ..errors import RefGPTError
from ..hooks import HookRun
from ..ln_views import cached_output
from ..model import Model
from ..safetensors_file import SafetensorsFile, SafetensorsWriter, header_bytes
from ..version import __version__
from .name_maps import forward_order

FORMAT = "refgpt-golden"
FORMAT_VERSION = "1"
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
        return Config.from_hf(json.loads(text), source="golden config") if text else None

    @property
    def conditioning(self) -> dict[str, float]:
        """c_X per tensor (see the module docstring); empty if the file has none."""
        return json.loads(self.metadata.get("conditioning", "{}"))


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
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    keep = {"tokens", "targets", "logits", "log_probs", "loss"}
    chosen = [n for n in names if n in keep or any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if unmatched:
        raise RefGPTError(f"--names: {unmatched[0]!r} matches no tensor (e.g. 'blocks.*.hook_resid_post', "
                          f"'blocks.0.*', '*ln1*')")
    return chosen


def compute(model: Model, tokens, names=None, fwd_hooks=()) -> dict[str, np.ndarray]:
    """The golden tensors (``names`` from :func:`golden_names`; None: all) of one forward pass,
    in forward order.

    ``fwd_hooks`` run as in ``model.run_with_hooks``: the golden values are what flowed, which is
    how tests build a candidate with an error injected at a known place.
    """
    out = dict(stream(model, tokens, names, fwd_hooks))
    return {name: out[name] for name in forward_order(out)}


def stream(model: Model, tokens, names=None, fwd_hooks=()):
    """Yield (name, tensor) for the golden tensors of one forward pass as it makes them, one stage
    at a time (the embedding, each block, the unembedding): only one stage's activations are ever
    held, which is what lets ``write_streamed`` write GPT-2 XL's 32 GB golden on a 24 GB machine.
    ``compute`` is ``dict(stream(…))``, so streamed and in-memory goldens are the same numbers.
    """
    tokens, _ = model.check_tokens(tokens)  # [batch, pos]
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
    logits = model.unembed(resid, run)  # [batch, pos, d_vocab]
    yield from _stage_tensors(model, run, wanted)
    del resid
    if wanted & {"logits", "log_probs", "loss"}:
        log_probs = log_softmax(logits)  # [batch, pos, d_vocab]
        if "logits" in wanted:
            yield "logits", logits
        del logits
        if "log_probs" in wanted:
            yield "log_probs", log_probs
        if "loss" in wanted:
            b_idx, t_idx = np.indices((tokens.shape[0], tokens.shape[1] - 1))  # [batch, pos − 1] each
            yield "loss", -log_probs[b_idx, t_idx, tokens[:, 1:]]  # [batch, pos − 1]
    if "targets" in wanted:
        yield "targets", tokens[:, 1:]  # [batch, pos − 1]


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


def layout(model: Model, tokens_shape, names=None) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """name → (dtype, shape) of every golden tensor, in file (forward) order, from the config and
    the tokens' shape [batch, pos] alone: what lets the header be written before the pass."""
    cfg, dtype = model.cfg, model.dtype
    batch, pos = tokens_shape
    heads = (batch, pos, cfg.n_heads, cfg.d_head)
    by_suffix = {"hook_mean": (batch, pos, 1), "hook_scale": (batch, pos, 1),
                 "hook_q": heads, "hook_k": heads, "hook_v": heads, "hook_z": heads,
                 "hook_attn_scores": (batch, cfg.n_heads, pos, pos), "hook_pattern": (batch, cfg.n_heads, pos, pos),
                 "hook_pre": (batch, pos, cfg.d_mlp), "hook_post": (batch, pos, cfg.d_mlp)}
    whole = {"tokens": (np.dtype(np.int64), (batch, pos)), "targets": (np.dtype(np.int64), (batch, pos - 1)),
             "logits": (dtype, (batch, pos, cfg.d_vocab)), "log_probs": (dtype, (batch, pos, cfg.d_vocab)),
             "loss": (dtype, (batch, pos - 1))}
    out = {}
    for name in forward_order(_checked_names(model, names)):
        suffix = name.rsplit(".", 1)[-1]
        out[name] = whole.get(name) or (dtype, by_suffix.get(suffix, (batch, pos, cfg.d_model)))
    return out


def conditioning(model: Model, tokens, names=None) -> dict[str, float]:
    """c_X = max|X_float32 − X_float64| / 2⁻²⁴ for every float golden tensor X."""
    c = {}
    for name, _, r, x in _side_by_side(model, tokens, names):
        if r.dtype.kind == "f":
            c[name] = _max_error_in_f32_roundoffs(r, x)
    return {name: c[name] for name in forward_order(c)}


def _side_by_side(model: Model, tokens, names):
    """Yield (name, the golden tensor, its float64 value, its float32 value): the model's pass, a
    float64 pass and a float32 pass of the same weights, run a stage at a time side by side
    (``stream``), so only a stage's activations of each are held. A pass that would repeat another
    (the model's own pass is the float64 one when it is float64 and unhooked) is run once."""
    hooked = bool(HookRun(model.hook_dict).hooks)  # hooks on the model's hook points
    exact = model if model.dtype == np.float64 and not hooked else Model(model.cfg, dict(model.params), dtype="float64")
    rounded = model if model.dtype == np.float32 and not hooked else float32_twin(model)  # weights rounded as a float32 port rounds them
    passes = list(dict.fromkeys([model, exact, rounded]))  # the distinct models
    for tensors in zip(*(stream(m, tokens, names) for m in passes), strict=True):
        made = dict(zip(passes, tensors))
        name = tensors[0][0]
        assert all(t[0] == name for t in tensors), tensors  # every pass makes the same tensors in the same order
        yield name, made[model][1], made[exact][1], made[rounded][1]


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


def _max_error_in_f32_roundoffs(r, x, rows=1 << 16):
    """max |x − r| / 2⁻²⁴ over the finite entries of r (attention scores: the causal part), a
    block of rows at a time so that no float64 copy of a whole tensor is made."""
    r2, x2 = as_rows(r), as_rows(x)  # [rows, last]
    step = max(1, rows // max(1, r2.shape[1]))
    worst = [0.0]
    for i in range(0, len(r2), step):
        ri, xi = r2[i:i + step], x2[i:i + step].astype(np.float64)  # [rows, last]
        finite = np.isfinite(ri)  # [rows, last]
        if finite.any():
            worst.append(np.abs(xi[finite] - ri[finite]).max())  # NaN, if any, propagates
    return float(np.max(worst)) / F32_ROUNDOFF


def as_rows(a: np.ndarray) -> np.ndarray:
    """``a`` as a 2-D [rows, last axis] array (a view when ``a`` is contiguous; a scalar is [1, 1])."""
    return a.reshape(int(np.prod(a.shape[:-1], dtype=np.int64)), a.shape[-1]) if a.ndim else a.reshape(1, 1)


def make(model: Model, tokens, names=None, command=None) -> Golden:
    """The golden file's contents for ``model`` on ``tokens``, with its metadata."""
    return Golden(compute(model, tokens, names), metadata(model, tokens, names, command))


def metadata(model: Model, tokens, names=None, command=None) -> dict[str, str]:
    """A golden file's ``__metadata__``: provenance, and the conditioning (a float32 pass beside a
    float64 one)."""
    return {**provenance(model, command), "conditioning": json.dumps(conditioning(model, tokens, names))}


def provenance(model: Model, command=None) -> dict[str, str]:
    """Who made a golden file, from what, with what: every metadata entry but the conditioning."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "refgpt_version": __version__,
        "config": json.dumps(model.cfg.to_hf(), sort_keys=True),
        "weights_sha256": json.dumps(_weight_hashes(model), sort_keys=True),
        "dtype": model.dtype.name,
        "numpy_version": np.__version__,
        "blas": json.dumps(_blas()),
        "python_version": platform.python_version(),
        "command": json.dumps(list(sys.argv) if command is None else list(command)),
    }


def _weight_hashes(model: Model) -> dict[str, str]:
    if model.source is None:
        return {}
    hashes = {}
    for path in weight_files(model.source):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        hashes[path.name] = h.hexdigest()
    return hashes


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
    return Path(path)


def write_streamed(path, model: Model, tokens, names=None, command=None) -> Path:
    """Make and write a golden file without ever holding it, in one pass.

    The header (every tensor's name, dtype and shape, known from the config) goes first, with room
    left for the conditioning; each tensor is written as the forward pass makes it, while a float32
    pass beside it measures the conditioning, which fills the header at the end. Memory: the
    weights (a float32 checkpoint's are mapped, not copied, for the float32 pass) and one stage's
    activations of each pass."""
    tokens, _ = model.check_tokens(tokens)  # [batch, pos]
    names = _checked_names(model, names)
    shapes = layout(model, tokens.shape, names)
    meta = {**provenance(model, command), "conditioning": "{}"}
    c = {}
    with SafetensorsWriter(path, shapes, meta, _header_length(shapes, meta)) as out:
        for name, tensor, r, x in _side_by_side(model, tokens, names):
            out.write(name, tensor)
            if r.dtype.kind == "f":
                c[name] = _max_error_in_f32_roundoffs(r, x)
        out.metadata = {**meta, "conditioning": json.dumps({name: c[name] for name in forward_order(c)})}
    return Path(path)


def _header_length(shapes, meta) -> int:
    """The header's length in a golden file: as long as the longest conditioning could make it
    (every c_X written in 24 characters, the longest a float's repr takes), so that the streamed
    writer can leave room for the conditioning before it is measured, and both writers agree."""
    if "conditioning" not in meta:
        return 0
    floats = [name for name, (dtype, _) in shapes.items() if np.dtype(dtype).kind == "f"]
    longest = "{" + ", ".join(f"{json.dumps(name)}: {'9' * 24}" for name in floats) + "}"
    return len(header_bytes(shapes, {**meta, "conditioning": longest}))


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
    return Golden(tensors, dict(st.metadata), dtypes, st)
