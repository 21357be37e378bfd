"""Lenses: read a prediction out of the residual stream halfway through the model.

The model predicts by ``logits = ln_final(resid_final)·W_U + b_U``. A *lens* applies that read-out
to an earlier stream: after block M instead of after the last. Watching the top token settle, layer
by layer, is how one sees a prediction being built (nostalgebraist's "logit lens", 2020).

**The logit lens** (``logit_lens``) treats the stream entering block M as if it were final:

    lens_M = LN_final(resid_pre_M)·W_U + b_U        LayerNorm *recomputed* from resid_pre_M

This is the correct lens: it is what the model would predict if blocks M… did nothing, and its
last row (the final stream) is exactly the model's logits.

**The cached-final-scale lens** (``logit_lens_final_scale``) divides every earlier stream by the
*final* stream's scale σ_final instead of its own: (w ⊙ P·resid_pre_M / σ_final + b)·W_U + b_U.
That is the right thing for *decomposing* the final logits into additive pieces (docs/layernorm.md
§2), but not for reading a prediction from an early layer: σ_final has nothing to do with the
early stream's size. Its rows have the wrong temperature; argmax is the same as the logit lens
(both are w ⊙ P·resid scaled by a positive number, plus b) only when b = 0.

**The tuned lens** (Belrose et al., 2023) first moves each stream into the final layer's basis with
a learned affine translator, in the tuned-lens package's convention (a ``Linear(d, d)`` added to
the identity, before ln_final):

    h' = h + A·h + b        (row-vector form: h + h·Aᵀ + b)        lens_M = LN_final(h')·W_U + b_U

``tuned_lens`` applies translators read from a safetensors file (``layer_translators.{M}.weight``
[d_model, d_model] and ``.bias`` [d_model], one per block). ``fit_least_squares_translators``
computes translators in closed form: the affine map that best predicts the final stream from
stream M in the least-squares sense. That is *not* a trained tuned lens (which minimises a KL
divergence to the model's own predictions with SGD); it is the linear-regression baseline.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..gpt2.activations import log_softmax
from ..files.atomic_write import refuse_temporary
from ..files.safetensors_file import SafetensorsWriter
from ..errors import RefGPTError, need, whole_numbers
from ..gpt2 import ln_views
from .measurements import stream_labels, streams


class LensResult:
    """Lens logits for every stream: ``logits`` [stream, batch, pos, d_vocab], ``labels`` [stream]."""

    def __init__(self, logits, labels, kind: str):
        self.logits, self.labels, self.kind = logits, list(labels), kind

    def log_probs(self) -> np.ndarray:
        return log_softmax(self.logits)  # [stream, batch, pos, d_vocab]

    def probs(self) -> np.ndarray:
        return np.exp(self.log_probs())  # [stream, batch, pos, d_vocab]

    def top(self, k: int = 1):
        """(ids, probs): the k most likely tokens per stream and position, [stream, batch, pos, k]."""
        if not 1 <= k <= self.logits.shape[-1]:
            raise RefGPTError(f"top: k must be in 1..{self.logits.shape[-1]}, found {k}")
        probs = self.probs()  # [stream, batch, pos, d_vocab]
        ids = np.argsort(-probs, axis=-1, kind="stable")[..., :k]  # [stream, batch, pos, k]
        return ids, np.take_along_axis(probs, ids, axis=-1)  # [stream, batch, pos, k] each

    def prob(self, target) -> np.ndarray:
        """The probability of ``target`` per stream and position: [stream, batch, pos].

        ``target`` is one token id, or ids [batch, pos] (e.g. each position's next token).
        """
        n_stream, batch, pos, d_vocab = self.logits.shape
        target = np.broadcast_to(whole_numbers(target, "target"), (batch, pos))  # [batch, pos]
        if np.any((target < 0) | (target >= d_vocab)):
            raise RefGPTError(f"target: ids must be in [0, {d_vocab}), found {target.min()}..{target.max()}")
        log_p = np.take_along_axis(self.log_probs(), np.broadcast_to(target[None, ..., None], (n_stream, batch, pos, 1)), -1)
        return np.exp(log_p[..., 0])  # [stream, batch, pos]

    def __repr__(self) -> str:
        return f"LensResult({self.kind}, logits {list(self.logits.shape)})"


def _unembed(model, x):
    logits = x @ model.params["unembed.W_U"]  # [..., d_vocab]
    if "unembed.b_U" in model.params:
        logits = logits + model.params["unembed.b_U"]  # [..., d_vocab]
    return logits


def _ln_final(model, x):
    """ln_final recomputed from x itself: the recomputed view (refgpt/gpt2/ln_views.py)."""
    p = model.params
    return ln_views.recomputed(x, p["ln_final.w"], p["ln_final.b"], model.cfg.eps)  # [..., d_model]


def logit_lens(cache) -> LensResult:
    """The logit lens with ln_final recomputed from each stream (the correct lens)."""
    model = cache.model
    x = streams(cache)  # [stream, batch, pos, d_model]
    return LensResult(_unembed(model, _ln_final(model, x)), stream_labels(model.cfg.n_layers), "logit lens")


def logit_lens_final_scale(cache) -> LensResult:
    """The lens with every stream divided by the *final* stream's cached scale (see module doc)."""
    model, p = cache.model, cache.model.params
    need(cache, "ln_final.hook_scale", "logit_lens_final_scale")
    x = streams(cache)  # [stream, batch, pos, d_model]
    normed = ln_views.cached_scale(x, cache["ln_final.hook_scale"]) * p["ln_final.w"] + p["ln_final.b"]  # [stream, batch, pos, d_model]
    return LensResult(_unembed(model, normed), stream_labels(model.cfg.n_layers), "logit lens, final scale")


def read_out(model, resid) -> np.ndarray:
    """The logit lens's read-out of one stream: ln_final recomputed from ``resid`` [..., d_model]
    itself, then W_U (and b_U): [..., d_vocab]. ``logit_lens`` is this over every stream at once;
    a sweep's lens task (refgpt/sweep/task_lens.py) applies it one stream at a time, so that only
    one stream's [pos, d_vocab] logits are held (13 streams of GPT-2 small at T = 1024 would be
    5.4 GB in float64)."""
    return _unembed(model, _ln_final(model, resid))  # [..., d_vocab]


# ---- the tuned lens ----------------------------------------------------------------------------


def load_translators(path, model) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """{layer: (A [d_model, d_model], b [d_model])} from a safetensors file in tuned-lens keys."""
    from safetensors.numpy import load_file

    path = Path(path)
    if not path.is_file():
        raise RefGPTError(f"{path}: translator file not found")
    refuse_temporary(path)
    try:
        tensors = load_file(str(path))
    except Exception as error:  # safetensors raises its own types for a malformed file
        raise RefGPTError(f"{path}: not a readable safetensors file ({error})") from None
    translators = {}
    for L in range(model.cfg.n_layers):
        keys = (f"layer_translators.{L}.weight", f"layer_translators.{L}.bias")
        missing = [k for k in keys if k not in tensors]
        if missing:
            raise RefGPTError(f"{path}: {missing[0]!r} is missing (one translator per block, 0..{model.cfg.n_layers - 1})")
        translators[L] = tuple(tensors[k] for k in keys)
    return _checked_translators(translators, model, str(path))


def save_translators(path, translators) -> Path:
    """Write {layer: (A, b)} to a safetensors file in tuned-lens keys (float32 or float64 as given)."""
    tensors = {}
    for L, (A, b) in sorted(translators.items()):
        tensors[f"layer_translators.{L}.weight"] = np.asarray(A)
        tensors[f"layer_translators.{L}.bias"] = np.asarray(b)
    with SafetensorsWriter(path, {name: (a.dtype, a.shape) for name, a in tensors.items()}) as out:
        for name, a in tensors.items():
            out.write(name, a)
    return out.path


def _checked_translators(translators, model, where):
    d, n_layers = model.cfg.d_model, model.cfg.n_layers
    checked = {}
    for L in range(n_layers):
        if L not in translators:
            raise RefGPTError(f"{where}: no translator for layer {L} (one per block, 0..{n_layers - 1})")
        A, b = (np.asarray(a) for a in translators[L])
        for name, array, shape in (("weight", A, (d, d)), ("bias", b, (d,))):
            if array.dtype.kind != "f" or array.shape != shape:
                raise RefGPTError(f"{where}: layer_translators.{L}.{name} is {array.dtype} {list(array.shape)}, "
                                  f"expected a float array {list(shape)}")
            if not np.all(np.isfinite(array)):
                raise RefGPTError(f"{where}: layer_translators.{L}.{name} has non-finite values")
        checked[L] = (A.astype(model.dtype, copy=False), b.astype(model.dtype, copy=False))
    return checked


def tuned_lens(cache, translators) -> LensResult:
    """The tuned lens: LN_final(h + h·Aᵀ + b)·W_U + b_U per stream; the final stream is untranslated.

    ``translators`` is a safetensors path or {layer: (A, b)} for every block.
    """
    model = cache.model
    if isinstance(translators, (str, Path)):
        translators = load_translators(translators, model)
    else:
        translators = _checked_translators(translators, model, "translators")
    x = streams(cache)  # [stream, batch, pos, d_model]
    translated = np.stack([x[L] + x[L] @ translators[L][0].T + translators[L][1] for L in range(model.cfg.n_layers)]
                          + [x[-1]])  # [stream, batch, pos, d_model]
    return LensResult(_unembed(model, _ln_final(model, translated)), stream_labels(model.cfg.n_layers), "tuned lens")


def fit_least_squares_translators(caches) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Closed-form translators: for each block M, the (A, b) minimising Σ‖h + h·Aᵀ + b − h_final‖².

    ``caches`` is one cache or a list of them (from the same model); every position of every
    prompt is one sample. The problem is linear least squares in (Aᵀ, b) with target h_final − h;
    NumPy's ``lstsq`` gives the minimum-norm solution, so with fewer than d_model + 1 samples the
    translator stays as close to the identity (A = 0, b = 0) as the data allow. This is a regression
    baseline, not a trained tuned lens.
    """
    caches = [caches] if not isinstance(caches, (list, tuple)) else list(caches)
    if not caches:
        raise RefGPTError("fit_least_squares_translators: no caches given")
    model = caches[0].model
    d = model.cfg.d_model
    x = np.concatenate([streams(c).reshape(model.cfg.n_layers + 1, -1, d) for c in caches], axis=1)  # [stream, sample, d_model]
    final = x[-1]  # [sample, d_model]
    ones = np.ones((x.shape[1], 1), dtype=x.dtype)  # [sample, 1]
    translators = {}
    for L in range(model.cfg.n_layers):
        design = np.concatenate([x[L], ones], axis=1)  # [sample, d_model + 1]
        solution, *_ = np.linalg.lstsq(design, final - x[L], rcond=None)  # [d_model + 1, d_model]
        translators[L] = (np.ascontiguousarray(solution[:d].T), solution[d].copy())  # A [d, d], b [d]
    return translators
