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
a learned affine translator, as the ``tuned-lens`` package (0.2.0) does: translator M reads the
stream entering block M (HF ``hidden_states[M]`` = ``blocks.M.hook_resid_pre``) and adds a
``Linear(d, d)`` of it, before ln_final:

    h' = h + h·Wᵀ + b              lens_M = LN_final(h')·W_U + b_U

``TunedLens`` holds the translators of one model. ``TunedLens.load(model, path)`` reads a lens
directory the package wrote (config.json + params.pt, as on the hub, refgpt/files/lens_directory.py
— no torch needed), a params.safetensors in such a directory, or a bare .safetensors/.pt file in
either key spelling (``{M}.weight`` or ``layer_translators.{M}.weight``); with no path it is the lens
trained for the embedded model (weights/default_lens/, made by weights/train_default_lens.py).
config.json's ``unembed_hash`` is checked against the model's unembedding (the package's hash):
a lens trained for another model is refused unless ``check_unembed_hash=False``. A lens trained at
``resid_mid`` (config ``"stream": "resid_mid"``) reads ``blocks.M.hook_resid_mid`` instead.

    lens = TunedLens.load(model)                 # the shipped lens (embedded model only)
    result = lens.run("To be, or not to")        # LensResult: logits [stream, batch, pos, d_vocab]
    logits = lens.forward(h, M)                  # the package's TunedLens.forward(h, idx)
    result = tuned_lens(cache, lens)             # from a cache that holds the streams

``evaluate_lenses`` reports, per layer, KL(final ‖ lens), the cross-entropy of the next token and
the entropy of the logit and tuned lenses over windows of a text, in nats and bits per byte, as the
package's evaluation loop does. Training is refgpt.train.tuned_lens (refgpt train-lens).
``fit_least_squares_translators`` computes translators in closed form: the affine map that best
predicts the final stream from stream M in the least-squares sense — a linear-regression baseline,
not a trained tuned lens (which minimises a KL divergence to the model's own predictions).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import RefGPTError, need, whole_numbers
from ..files.default_model import default_lens_path, is_default_model
from ..files.lens_directory import STREAMS, lens_config, read_lens, unembed_hash, write_lens
from ..files.safetensors_file import SafetensorsWriter
from ..gpt2 import ln_views
from ..gpt2.activations import log_softmax
from .measurements import stream_labels


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


def lens_hook_names(n_layers: int, stream: str = "resid_pre") -> list[str]:
    """The hook points a lens reads: ``blocks.M.hook_{stream}`` for every block, then the final
    stream (the last ``hook_resid_post``)."""
    if stream not in STREAMS:
        raise RefGPTError(f"a lens reads one of {', '.join(STREAMS)}, found {stream!r}")
    return [f"blocks.{M}.hook_{stream}" for M in range(n_layers)] + [f"blocks.{n_layers - 1}.hook_resid_post"]


def lens_streams(cache, stream: str = "resid_pre") -> np.ndarray:
    """The streams a lens reads, stacked: [n_layers + 1, batch, pos, d_model] (the last: final)."""
    return np.stack([need(cache, name, "lens") for name in lens_hook_names(cache.model.cfg.n_layers, stream)])


def lens_labels(n_layers: int, stream: str = "resid_pre") -> list[str]:
    """Row names: "0_pre", …, "final_post" (TransformerLens's), or "0_mid", … at resid_mid."""
    labels = stream_labels(n_layers)
    return labels if stream == "resid_pre" else [f"{M}_mid" for M in range(n_layers)] + labels[-1:]


def logit_lens(cache, stream: str = "resid_pre") -> LensResult:
    """The logit lens with ln_final recomputed from each stream (the correct lens); ``stream``
    "resid_mid" reads each block's stream between attention and MLP."""
    model = cache.model
    x = lens_streams(cache, stream)  # [stream, batch, pos, d_model]
    return LensResult(_unembed(model, _ln_final(model, x)), lens_labels(model.cfg.n_layers, stream), "logit lens")


def logit_lens_final_scale(cache) -> LensResult:
    """The lens with every stream divided by the *final* stream's cached scale (see module doc)."""
    model, p = cache.model, cache.model.params
    need(cache, "ln_final.hook_scale", "logit_lens_final_scale")
    x = lens_streams(cache)  # [stream, batch, pos, d_model]
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


class TunedLens:
    """The tuned lens of one model: a translator (W [d, d], b [d]) per block, h ↦ h + h·Wᵀ + b,
    reading ``stream`` ("resid_pre", the package's, or "resid_mid"). Build it from translators
    {M: (W, b)} (every block, float, finite; kept in the model's dtype) or ``TunedLens.load``.

    ``config`` is the lens directory's config.json (or {}), ``notes`` what refgpt noticed reading
    it (a misspelled hash key, ignored keys), ``source`` where it came from."""

    def __init__(self, model, translators, stream: str = "resid_pre", config=None, source=None, notes=()):
        if stream not in STREAMS:
            raise RefGPTError(f"TunedLens: stream must be one of {', '.join(STREAMS)}, found {stream!r}")
        self.model, self.stream = model, stream
        self.translators = _checked_translators(translators, model, str(source) if source else "translators")
        self.config, self.source, self.notes = dict(config or {}), source, list(notes)

    @classmethod
    def load(cls, model, path=None, check_unembed_hash: bool = True) -> "TunedLens":
        """The lens at ``path`` (a lens directory or a translator file, see the module docstring) for
        ``model``; ``path=None``: the lens shipped for the embedded model. A config.json whose
        d_model, num_hidden_layers or unembed_hash do not fit ``model`` is refused by name."""
        if path is None:
            if not is_default_model(model.source):
                raise RefGPTError("TunedLens.load: the shipped tuned lens is for the embedded model only; pass the "
                                  f"lens directory trained for {model.source} (refgpt train-lens makes one)")
            path = default_lens_path()
        files = read_lens(path)
        where = str(files.source)
        d, n_layers = model.cfg.d_model, model.cfg.n_layers
        config = files.config
        if config:
            if config["d_model"] != d or config["num_hidden_layers"] != n_layers:
                raise RefGPTError(f"{where}: a lens for d_model {config['d_model']}, {config['num_hidden_layers']} layers "
                                  f"({config['base_model_name_or_path']}); the model has d_model {d}, {n_layers} layers")
            expected = config.get("unembed_hash")
            if check_unembed_hash and expected is not None and expected != unembed_hash(model.params["unembed.W_U"]):
                raise RefGPTError(f"{where}: config.json's unembed_hash {expected[:12]}… is not this model's "
                                  f"({unembed_hash(model.params['unembed.W_U'])[:12]}…): the lens was trained for "
                                  f"another unembedding ({config['base_model_name_or_path']}); "
                                  "check_unembed_hash=False (--ignore-unembed-hash) uses it anyway")
        return cls(model, files.translators, files.stream, config, files.source, files.notes)

    def __len__(self) -> int:
        return len(self.translators)

    @property
    def hook_names(self) -> list[str]:
        """The hook points this lens reads, block by block, then the final stream."""
        return lens_hook_names(self.model.cfg.n_layers, self.stream)

    @property
    def labels(self) -> list[str]:
        return lens_labels(self.model.cfg.n_layers, self.stream)

    def translate(self, h, layer: int) -> np.ndarray:
        """h + h·Wᵀ + b for stream(s) h [..., d_model] of block ``layer`` (the package's transform_hidden)."""
        W, b = self.translators[self._layer(layer)]
        h = np.asarray(h, dtype=self.model.dtype)
        return h + h @ W.T + b  # [..., d_model]

    def forward(self, h, layer: int) -> np.ndarray:
        """Lens logits [..., d_vocab] of stream(s) h [..., d_model] of block ``layer``: the
        package's ``TunedLens.forward(h, idx)``, LN_final(h + h·Wᵀ + b)·W_U + b_U."""
        return _unembed(self.model, _ln_final(self.model, self.translate(h, layer)))  # [..., d_vocab]

    def __call__(self, cache) -> LensResult:
        """Lens logits for every stream of ``cache``: [n_layers + 1, batch, pos, d_vocab]; the final
        stream is read untranslated (its row is the model's logits)."""
        x = lens_streams(cache, self.stream)  # [stream, batch, pos, d_model]
        n = self.model.cfg.n_layers
        translated = np.stack([self.translate(x[M], M) for M in range(n)] + [x[-1]])  # [stream, batch, pos, d_model]
        return LensResult(_unembed(self.model, _ln_final(self.model, translated)), self.labels, "tuned lens")

    def run(self, input, **forward) -> LensResult:
        """Run the model on ``input`` (text or tokens; keywords as for the forward pass, e.g.
        prepend_bos) caching only the streams the lens reads, and apply the lens."""
        _, cache = self.model.run_with_cache(input, names=self.hook_names, **forward)
        return self(cache)

    def save(self, directory, base_model: str | None = None, revision: str | None = None):
        """Write config.json + params.pt, which the tuned-lens package loads as it is."""
        config = lens_config(self.model.cfg.d_model, self.model.cfg.n_layers,
                             base_model or self.config.get("base_model_name_or_path") or str(self.model.source),
                             unembed_hash(self.model.params["unembed.W_U"]), revision, self.stream)
        return write_lens(directory, self.translators, config)

    def _layer(self, layer) -> int:
        n = self.model.cfg.n_layers
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < n:
            raise RefGPTError(f"tuned lens: layer must be a block, 0..{n - 1}, found {layer!r}")
        return int(layer)

    def __repr__(self) -> str:
        return f"TunedLens({len(self)} translators at {self.stream}, from {self.source or 'arrays'})"


def load_translators(path, model) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """{layer: (W [d_model, d_model], b [d_model])} from any lens directory or translator file
    (``TunedLens.load``), in the model's dtype. Bare translators say nothing of the stream they
    read, so a lens trained at resid_mid is refused here (``TunedLens.load`` keeps its stream)."""
    lens = TunedLens.load(model, path)
    if lens.stream != "resid_pre":
        raise RefGPTError(f"{lens.source}: a lens read at {lens.stream}; load_translators gives translators of the "
                          "streams entering each block (resid_pre): use TunedLens.load, which keeps its stream")
    return lens.translators


def save_translators(path, translators) -> Path:
    """Write {layer: (W, b)} to one safetensors file, keys ``layer_translators.{L}.weight``/``.bias``
    (float32 or float64 as given); ``TunedLens.save`` writes the package's directory instead."""
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
    extra = sorted(set(translators) - set(range(n_layers)), key=str)
    if extra:
        raise RefGPTError(f"{where}: translator {extra[0]!r} is not a block of the model (0..{n_layers - 1})")
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
    """The tuned lens: LN_final(h + h·Wᵀ + b)·W_U + b_U per stream; the final stream is untranslated.

    ``translators`` is a TunedLens, a lens directory or translator file, or {layer: (W, b)} for
    every block (read at resid_pre)."""
    model = cache.model
    if isinstance(translators, TunedLens):
        lens = translators
    elif isinstance(translators, (str, Path)):
        lens = TunedLens.load(model, translators)
    else:
        lens = TunedLens(model, translators)
    return lens(cache)


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
    x = np.concatenate([lens_streams(c).reshape(model.cfg.n_layers + 1, -1, d) for c in caches], axis=1)  # [stream, sample, d_model]
    final = x[-1]  # [sample, d_model]
    ones = np.ones((x.shape[1], 1), dtype=x.dtype)  # [sample, 1]
    translators = {}
    for L in range(model.cfg.n_layers):
        design = np.concatenate([x[L], ones], axis=1)  # [sample, d_model + 1]
        solution, *_ = np.linalg.lstsq(design, final - x[L], rcond=None)  # [d_model + 1, d_model]
        translators[L] = (np.ascontiguousarray(solution[:d].T), solution[d].copy())  # A [d, d], b [d]
    return translators


# ---- how good a lens is: the package's evaluation -----------------------------------------------

#: Logits per micro-batch of ``evaluate_lenses`` (2²³ float64 = 64 MiB per [tokens, d_vocab] array).
EVAL_BATCH_LOGITS = 2**23


class LensEvaluation:
    """Per-layer means over every token of some windows, as the tuned-lens package's eval loop
    reports them: for each lens ("logit", and "tuned" if given) ``kl`` = KL(final ‖ lens) at every
    position, ``ce`` = the cross-entropy of the next token (positions 0 … T−2), ``entropy`` of the
    lens's distribution; ``final`` holds the model's own ``ce`` and ``entropy``. All in nats per
    token; ``bits_per_byte()`` multiplies by ``nats_to_bpb`` (tokens/bytes/ln 2 of the text)."""

    def __init__(self, labels, metrics, final, tokens: int, nats_to_bpb: float | None, stream: str):
        self.labels, self.metrics, self.final = list(labels), metrics, final
        self.tokens, self.nats_to_bpb, self.stream = tokens, nats_to_bpb, stream

    def bits_per_byte(self) -> dict:
        if self.nats_to_bpb is None:
            raise RefGPTError("bits per byte need nats_to_bpb (the text's tokens per byte): see text_windows")
        scale = self.nats_to_bpb
        return {"lenses": {lens: {k: [x * scale for x in v] for k, v in m.items()} for lens, m in self.metrics.items()},
                "final": {k: v * scale for k, v in self.final.items()}}

    def as_dict(self) -> dict:
        out = {"layers": self.labels, "stream": self.stream, "tokens": self.tokens, "nats_to_bpb": self.nats_to_bpb,
               "nats": {"lenses": self.metrics, "final": self.final}}
        if self.nats_to_bpb is not None:
            out["bits_per_byte"] = self.bits_per_byte()
        return out

    def __repr__(self) -> str:
        return f"LensEvaluation({', '.join(self.metrics)} over {self.tokens} tokens)"


def _log_softmax_and_softmax(x):
    """(log softmax, softmax) over the last axis, with one exp: x − max − log Σ e, and e / Σ e."""
    shifted = x - x.max(axis=-1, keepdims=True)  # [..., n] ≤ 0
    e = np.exp(shifted)  # [..., n]
    total = e.sum(axis=-1, keepdims=True)  # [..., 1]
    shifted -= np.log(total)
    e /= total
    return shifted, e


def evaluate_lenses(model, windows, tuned: TunedLens | None = None, stream: str | None = None,
                    nats_to_bpb: float | None = None) -> LensEvaluation:
    """KL, next-token cross-entropy and entropy per layer of the logit lens (and ``tuned``) over
    token ``windows`` [n, T] (refgpt.train.tuned_lens.text_windows cuts a text into them). The
    logit lens reads ``tuned.stream`` (or ``stream``, default resid_pre)."""
    windows = np.asarray(windows)
    if windows.ndim != 2 or windows.shape[1] < 2 or windows.dtype.kind not in "iu" or windows.shape[0] == 0:
        raise RefGPTError(f"evaluate_lenses: windows must be token ids [n, T ≥ 2], found {windows.dtype} "
                          f"{list(windows.shape)}")
    stream = tuned.stream if tuned is not None else (stream or "resid_pre")
    if tuned is not None and tuned.model is not model:
        raise RefGPTError("evaluate_lenses: the tuned lens was loaded for another Model object")
    n, T = windows.shape
    L = model.cfg.n_layers
    names = lens_hook_names(L, stream)[:-1]
    lenses = {"logit": None, **({"tuned": tuned} if tuned is not None else {})}
    sums = {k: {m: np.zeros(L) for m in ("kl", "ce", "entropy")} for k in lenses}
    final = {"ce": 0.0, "entropy": 0.0}
    per_batch = max(1, EVAL_BATCH_LOGITS // (T * model.cfg.d_vocab))
    for start in range(0, n, per_batch):
        batch = windows[start:start + per_batch]  # [b, T]
        logits, cache = model.run_with_cache(batch, names=names)
        log_p = log_softmax(logits)  # [b, T, d_vocab]
        p = np.exp(log_p)  # [b, T, d_vocab]
        nxt = batch[:, 1:, None]  # [b, T − 1, 1]
        final["ce"] += float(-np.take_along_axis(log_p[:, :-1], nxt, -1).sum())
        neg_entropy = float(np.vdot(p, log_p))
        final["entropy"] -= neg_entropy
        for M in range(L):
            h = cache[names[M]]  # [b, T, d_model]
            for kind, lens in lenses.items():
                lens_logits = _unembed(model, _ln_final(model, h)) if lens is None else lens.forward(h, M)  # [b, T, d_vocab]
                log_q, q = _log_softmax_and_softmax(lens_logits)  # [b, T, d_vocab] each
                s = sums[kind]
                s["kl"][M] += neg_entropy - float(np.vdot(p, log_q))
                s["ce"][M] += float(-np.take_along_axis(log_q[:, :-1], nxt, -1).sum())
                s["entropy"][M] += float(-np.vdot(q, log_q))
    tokens, predicted = n * T, n * (T - 1)
    divide = {"kl": tokens, "ce": predicted, "entropy": tokens}
    metrics = {kind: {m: [float(x) / divide[m] for x in v] for m, v in s.items()} for kind, s in sums.items()}
    final = {"ce": final["ce"] / predicted, "entropy": final["entropy"] / tokens}
    return LensEvaluation(lens_labels(L, stream)[:-1], metrics, final, tokens, nats_to_bpb, stream)
