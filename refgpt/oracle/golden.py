"""Golden files: every number of one forward pass, in a file any language can read.

A golden file is a safetensors file (an 8-byte length, a JSON header, raw little-endian arrays)
holding, under refgpt's names (refgpt/oracle/name_maps.py):

    tokens [batch, pos] int64, targets [batch, pos − 1] int64
    every hook point's activation (or those selected), each LayerNorm's output (``….out``)
    logits, log_probs [batch, pos, d_vocab], loss [batch, pos − 1]

— targets and loss are [batch, pos] when the tokens come with their own targets (llm.c's y) —
and with ``backward`` the mean loss ``loss_mean`` and every gradient ``grad.*``
(refgpt/oracle/gradients.py); in the header's ``__metadata__`` (strings; JSON where structured):
the refgpt version, the model's config, the sha256 of each weight file, the dtype, the NumPy and
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

from ..activations import log_softmax
from ..checkpoint import weight_files
from ..config import Config
from ..dtypes import widen_bfloat16
from .. import strict_json
from ..atomic_write import write_atomically
from ..errors import RefGPTError, RefGPTTypeError
from ..ln_views import cached_output
from ..model import Model
from .gradients import compute_gradients
from ..safetensors_file import SafetensorsFile
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
        """r_X per tensor: the RMS error of refgpt's float32 pass, in units of 2⁻²⁴; empty if none."""
        return checked_conditioning(strict_json.loads(self.metadata.get("error_rms", "{}"),
                                                      "golden metadata 'error_rms'"), "golden metadata 'error_rms'")


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


def compute(model: Model, tokens, names=None, fwd_hooks=(), targets=None, backward=False) -> dict[str, np.ndarray]:
    """The golden tensors (``names`` from :func:`golden_names`; None: all) of one forward pass,
    and with ``backward`` the loss and every gradient (refgpt/oracle/gradients.py).

    ``fwd_hooks`` run as in ``model.run_with_hooks``: the golden values are what flowed, which is
    how tests build a candidate with an error injected at a known place (the backward pass ignores
    them). ``targets`` [batch, pos]: one target per input position, as llm.c's y (default: the
    next token inside ``tokens``, [batch, pos − 1]).
    """
    tokens, _ = model.check_tokens(tokens)  # [batch, pos]
    if names is not None and (isinstance(names, str) or not isinstance(names, (list, tuple))
                              or not all(isinstance(n, str) for n in names)):
        raise RefGPTTypeError(f"names: expected a list of golden tensor names, found {names!r:.60}")
    targets = check_golden_targets(model, tokens, targets)  # [batch, pos − 1] or [batch, pos]
    wanted = golden_names(model) if names is None else list(names)
    hooks = set(model.hook_names)
    need = {n for n in wanted if n in hooks}
    need |= {n[: -len("out")] + "hook_normalized" for n in wanted if n.endswith(".out")}
    logits, cache = model.run_with_cache(tokens, names=sorted(need), fwd_hooks=fwd_hooks)  # [batch, pos, d_vocab]
    log_probs = log_softmax(logits)  # [batch, pos, d_vocab]
    b_idx, t_idx = np.indices(targets.shape)  # [batch, pos − 1] (or [batch, pos]) each
    out = {}
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
        elif name.endswith(".out"):
            out[name] = cached_output(cache, name[: -len("out")])  # "blocks.3.ln1." or "ln_final."
        elif name in hooks:
            out[name] = np.asarray(cache[name])
        else:
            raise RefGPTError(f"golden: {name!r} is not a tensor of this model's golden file")
    if backward:
        out.update(compute_gradients(model, tokens, targets))
    return out


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


def float32_errors(model: Model, tokens, names=None, targets=None, backward=False, reference=None):
    """(c_X, r_X) per float golden tensor X: the largest and the root-mean-square error of
    refgpt's own float32 pass against float64, both in units of 2⁻²⁴ (refgpt/oracle/comparison.py
    bounds a candidate's error elementwise by the first and its bias by the second).
    ``reference``: the float64 tensors, when already computed."""
    params = dict(model.params)
    rounded = Model(model.cfg, params, dtype="float32")  # the same weights, rounded as a float32 port rounds them
    if reference is None or model.dtype != np.float64:
        exact = Model(model.cfg, params, dtype="float64")
        reference = compute(exact, tokens, names, targets=targets, backward=backward)
    ref = reference
    f32 = compute(rounded, tokens, names, targets=targets, backward=backward)
    c, rms = {}, {}
    for name, r in ref.items():
        if r.dtype.kind != "f":
            continue
        x = f32[name].astype(np.float64)  # [...]
        finite = np.isfinite(r)  # attention scores: compare the causal part only
        err = np.abs(x[finite] - r[finite])  # [n_compared]
        c[name] = float(err.max() / F32_ROUNDOFF) if err.size else 0.0
        rms[name] = float(np.sqrt(np.mean(err**2)) / F32_ROUNDOFF) if err.size else 0.0
    return c, rms


def make(model: Model, tokens, names=None, command=None, targets=None, backward=False) -> Golden:
    """The golden file's contents for ``model`` on ``tokens``, with its metadata; with ``backward``
    also the mean loss and every gradient (refgpt/oracle/gradients.py)."""
    tensors = compute(model, tokens, names, targets=targets, backward=backward)
    cond, rms = float32_errors(model, tokens, names, targets, backward, reference=tensors)
    metadata = {
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
        "conditioning": json.dumps(cond),
        "error_rms": json.dumps(rms),
        "targets": "given" if targets is not None else "next token",
    }
    return Golden(tensors, metadata)


def _weight_hashes(model: Model) -> dict[str, str]:
    if model.source is None:
        return {}
    hashes = {}
    for path in [model.source] if model.source.is_file() else weight_files(model.source):  # an llm.c .bin, or HF's
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
    """Write ``golden`` as a safetensors file (tensors C-contiguous, metadata as strings)."""
    from safetensors.numpy import save_file

    tensors = {name: np.require(a, requirements=["C"]) for name, a in golden.tensors.items()}  # 0-d stays 0-d
    return write_atomically(path, lambda tmp: save_file(tensors, str(tmp), metadata=dict(golden.metadata)))


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
    golden = Golden(tensors, dict(st.metadata), dtypes)
    try:  # the metadata is checked now, not when compare first needs it
        golden.config, golden.conditioning, golden.error_rms, golden.golden_error
    except RefGPTError as error:
        raise RefGPTError(f"{path}: {error}") from None
    return golden
