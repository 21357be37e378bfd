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


def checked_conditioning(values, where="golden metadata 'conditioning'") -> dict[str, float]:
    """``values`` as {tensor name: c_X}, refusing anything but finite numbers ≥ 0: a NaN or infinite
    c_X would pass every tensor, a negative one fail identical files."""
    if not isinstance(values, dict):
        raise RefGPTError(f"{where}: expected an object of tensor name → number, found {type(values).__name__}")
    for name, c in values.items():
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c < math.inf:
            raise RefGPTError(f"{where}: c_X of {name!r} must be a finite number ≥ 0, found {c!r:.40}")
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


def compute(model: Model, tokens, names=None, fwd_hooks=()) -> dict[str, np.ndarray]:
    """The golden tensors (``names`` from :func:`golden_names`; None: all) of one forward pass.

    ``fwd_hooks`` run as in ``model.run_with_hooks``: the golden values are what flowed, which is
    how tests build a candidate with an error injected at a known place.
    """
    tokens, _ = model.check_tokens(tokens)  # [batch, pos]
    if names is not None and (isinstance(names, str) or not isinstance(names, (list, tuple))
                              or not all(isinstance(n, str) for n in names)):
        raise RefGPTTypeError(f"names: expected a list of golden tensor names, found {names!r:.60}")
    wanted = golden_names(model) if names is None else list(names)
    hooks = set(model.hook_names)
    need = {n for n in wanted if n in hooks}
    need |= {n[: -len("out")] + "hook_normalized" for n in wanted if n.endswith(".out")}
    logits, cache = model.run_with_cache(tokens, names=sorted(need), fwd_hooks=fwd_hooks)  # [batch, pos, d_vocab]
    log_probs = log_softmax(logits)  # [batch, pos, d_vocab]
    b_idx, t_idx = np.indices((tokens.shape[0], tokens.shape[1] - 1))  # [batch, pos − 1] each
    out = {}
    for name in forward_order(wanted):
        if name == "tokens":
            out[name] = tokens
        elif name == "targets":
            out[name] = tokens[:, 1:]  # [batch, pos − 1]
        elif name == "logits":
            out[name] = logits
        elif name == "log_probs":
            out[name] = log_probs
        elif name == "loss":
            out[name] = -log_probs[b_idx, t_idx, tokens[:, 1:]]  # [batch, pos − 1]
        elif name.endswith(".out"):
            out[name] = cached_output(cache, name[: -len("out")])  # "blocks.3.ln1." or "ln_final."
        elif name in hooks:
            out[name] = np.asarray(cache[name])
        else:
            raise RefGPTError(f"golden: {name!r} is not a tensor of this model's golden file")
    return out


def conditioning(model: Model, tokens, names=None) -> dict[str, float]:
    """c_X = max|X_float32 − X_float64| / 2⁻²⁴ for every float golden tensor X."""
    params = dict(model.params)
    exact = Model(model.cfg, params, dtype="float64")
    rounded = Model(model.cfg, params, dtype="float32")  # the same weights, rounded as a float32 port rounds them
    ref, f32 = compute(exact, tokens, names), compute(rounded, tokens, names)
    c = {}
    for name, r in ref.items():
        if r.dtype.kind != "f":
            continue
        x = f32[name].astype(np.float64)  # [...]
        finite = np.isfinite(r)  # attention scores: compare the causal part only
        err = np.abs(x[finite] - r[finite])  # [n_compared]
        c[name] = float(err.max() / F32_ROUNDOFF) if err.size else 0.0
    return c


def make(model: Model, tokens, names=None, command=None) -> Golden:
    """The golden file's contents for ``model`` on ``tokens``, with its metadata."""
    tensors = compute(model, tokens, names)
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
        "conditioning": json.dumps(conditioning(model, tokens, names)),
    }
    return Golden(tensors, metadata)


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
    """Write ``golden`` as a safetensors file (tensors C-contiguous, metadata as strings)."""
    from safetensors.numpy import save_file

    tensors = {name: np.ascontiguousarray(a) for name, a in golden.tensors.items()}
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
        golden.config, golden.conditioning
    except RefGPTError as error:
        raise RefGPTError(f"{path}: {error}") from None
    return golden
