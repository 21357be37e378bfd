"""``--task lens``: how well each layer's stream predicts, per lens, over a corpus.

For every stream M (the stream entering each block, then the final one: refgpt.analysis.measurements)
and every lens, at each position of the prompt:

    KL(p_model ‖ p_lens)      how far the lens's next-token distribution is from the model's (nats)
    cross-entropy             −log p_lens(the next token), at the positions that have one
    entropy                   H(p_lens)

A lens is an object with ``name`` and ``logits(layer, resid) -> [batch, pos, d_vocab]`` for the
stream ``resid`` [batch, pos, d_model] entering block ``layer`` (``layer = n_layers``: the final
stream). Built in:

- ``logit`` — the logit lens (always computed): ln_final recomputed from the stream, then W_U
  (refgpt.analysis.lens.read_out);
- ``{"translators": PATH}`` — affine translators (refgpt.analysis.lens.load_translators): a lens
  directory as the tuned-lens package writes it (config.json + params.pt, e.g. the hub's or
  ``refgpt train-lens``'s), or a .safetensors/.pt file in either key spelling (``{M}.weight`` or
  ``layer_translators.{M}.weight``), a trained tuned lens or the least-squares baseline
  (fit_least_squares_translators);
  h + h·Aᵀ + b, then the logit lens's read-out; the final stream is not translated;
- ``{"factory": "MODULE:FUNCTION", "path": PATH}`` — a plug-in: the worker imports MODULE, calls
  FUNCTION(PATH, model) and uses the lens it returns. That is how a lens refgpt does not know yet
  (another trained lens, a lens with its own file format) joins a sweep; the spec is plain JSON,
  so it is recorded in OUT/sweep.json and reaches every worker, which must be able to import it.

Lens logits are made one stream at a time ([pos, d_vocab] held, never [stream, pos, d_vocab]).
Per prompt and lens: per stream the sums over positions (fsum) and means. Summary: per lens and
stream, the corpus means (Σ sums / Σ positions, or Σ targets for the cross-entropy).
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import numpy as np

from ..analysis.lens import load_translators, read_out
from ..analysis.measurements import stream_labels
from ..errors import RefGPTError
from ..gpt2.activations import log_softmax
from .tasks import Task, known_options, ratios

METRICS = ("kl", "cross_entropy", "entropy")


class LogitLens:
    name = "logit lens"

    def __init__(self, model):
        self.model = model

    def logits(self, layer, resid):
        return read_out(self.model, resid)  # [batch, pos, d_vocab]


class TranslatorLens:
    """Translators {layer: (A, b)} then the logit lens's read-out; the final stream untranslated."""

    def __init__(self, model, translators, name):
        self.model, self.translators, self.name = model, translators, name

    def logits(self, layer, resid):
        if layer < self.model.cfg.n_layers:
            A, b = self.translators[layer]
            resid = resid + resid @ A.T + b  # [batch, pos, d_model]
        return read_out(self.model, resid)  # [batch, pos, d_vocab]


def check_lens_spec(spec):
    """One lens spec, canonical: "logit", {"translators": absolute path} or {"factory", "path"}."""
    if spec == "logit":
        return spec
    if isinstance(spec, (str, Path)):
        spec = {"translators": str(spec)}
    if not isinstance(spec, dict):
        raise RefGPTError(f"a lens is 'logit', {{'translators': PATH}} or {{'factory': 'MODULE:FUNCTION', "
                          f"'path': PATH}}, found {spec!r:.80}")
    if set(spec) == {"translators"}:
        path = Path(spec["translators"]).absolute()
        if not path.exists():  # a translator file, or a lens directory (config.json + params.pt)
            raise RefGPTError(f"--translators {path}: file not found")
        return {"translators": str(path)}
    if set(spec) <= {"factory", "path"} and "factory" in spec:
        factory = spec["factory"]
        if not isinstance(factory, str) or factory.count(":") != 1 or not all(factory.split(":")):
            raise RefGPTError(f"--lens: the factory must be MODULE:FUNCTION, found {factory!r}")
        path = spec.get("path")
        return {"factory": factory, "path": str(Path(path).absolute()) if path is not None else None}
    raise RefGPTError(f"a lens spec has keys 'translators', or 'factory' and 'path'; found {sorted(spec)}")


def translator_lens(path, model) -> TranslatorLens:
    """The lens of a translators file (tuned-lens keys): what ``{"translators": PATH}`` makes, and
    a lens factory's model (``FUNCTION(PATH, model)``)."""
    return TranslatorLens(model, load_translators(path, model), f"translators {Path(path).name}")


def make_lens(spec, model):
    if spec == "logit":
        return LogitLens(model)
    if "translators" in spec:
        return translator_lens(spec["translators"], model)
    module, function = spec["factory"].split(":")
    try:
        factory = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as error:
        raise RefGPTError(f"--lens {spec['factory']}: cannot import it ({error})") from None
    lens = factory(spec["path"], model)
    if not isinstance(getattr(lens, "name", None), str) or not callable(getattr(lens, "logits", None)):
        raise RefGPTError(f"--lens {spec['factory']}: returned {type(lens).__name__}, not a lens "
                          "(an object with a name and logits(layer, resid))")
    return lens


def lens_metrics(log_p, lens_logits, next_tokens):
    """(KL(p ‖ q) [pos], −log q(next) [pos − 1], H(q) [pos]) of the model's log-probabilities
    ``log_p`` [pos, d_vocab] and a lens's logits [pos, d_vocab]; ``next_tokens`` [pos − 1]."""
    log_q = log_softmax(lens_logits)  # [pos, d_vocab]
    kl = np.maximum(np.sum(np.exp(log_p) * (log_p - log_q), axis=-1), 0.0)  # [pos]: as measurements.kl_divergence
    cross_entropy = -log_q[np.arange(len(next_tokens)), next_tokens]  # [pos − 1]
    entropy = -np.sum(np.exp(log_q) * log_q, axis=-1)  # [pos]
    return kl, cross_entropy, entropy


class LensTask(Task):
    name = "lens"
    min_tokens = 1

    @classmethod
    def check_options(cls, options: dict) -> dict:
        options = known_options(cls.name, options, {"lenses": []})
        specs = [check_lens_spec(s) for s in options["lenses"]]
        return {"lenses": ["logit", *[s for s in specs if s != "logit"]]}

    def __init__(self, model, options, out):
        super().__init__(model, options, out)
        self.lenses = [make_lens(spec, model) for spec in options["lenses"]]
        names = [lens.name for lens in self.lenses]
        if len(set(names)) != len(names):
            raise RefGPTError(f"two lenses have the same name: {names}")

    def run(self, model, tokens, prompt) -> dict:
        n = model.cfg.n_layers
        names = [f"blocks.{L}.hook_resid_pre" for L in range(n)] + [f"blocks.{n - 1}.hook_resid_post"]
        logits, cache = model.run_with_cache(tokens[None], names=names)  # [1, pos, d_vocab]
        log_p = log_softmax(logits[0])  # [pos, d_vocab]
        del logits
        next_tokens = tokens[1:]  # [pos − 1]
        out = {}
        for lens in self.lenses:
            sums = {m: [] for m in METRICS}
            for layer, name in enumerate(names):
                q = np.asarray(lens.logits(layer, cache[name]))[0]  # [pos, d_vocab]
                for m, values in zip(METRICS, lens_metrics(log_p, q, next_tokens)):
                    sums[m].append(math.fsum(values.tolist()))
            out[lens.name] = {**{f"{m}_sum": sums[m] for m in METRICS},
                              **{f"{m}_mean": ratios(sums[m], len(next_tokens) if m == "cross_entropy" else len(tokens))
                                 for m in METRICS}}
        return {"streams": stream_labels(n), "n_positions": len(tokens), "n_targets": len(next_tokens), "lenses": out}

    @classmethod
    def summarize(cls, results) -> dict:
        sums, positions, targets, prompts, streams = {}, 0, 0, 0, None
        for _, r in results:
            prompts += 1
            positions += r["n_positions"]
            targets += r["n_targets"]
            streams = streams or r["streams"]
            for lens, values in r["lenses"].items():
                acc = sums.setdefault(lens, {m: np.zeros(len(r["streams"])) for m in METRICS})
                for m in METRICS:
                    acc[m] += np.asarray(values[f"{m}_sum"], dtype=np.float64)  # elementwise, in prompt order
        return {"prompts": prompts, "positions": positions, "targets": targets, "streams": streams,
                "lenses": {lens: {f"{m}_mean": ratios(acc[m], targets if m == "cross_entropy" else positions)
                                  for m in METRICS} for lens, acc in sums.items()}}
