"""What an SAE does on text: L0, explained variance, dead features — and the two ways a loaded SAE
is silently wrong.

On the activations x [n, d] at the SAE's hook (every position of every text, the BOS position
left out when ``prepend_bos``) and their reconstructions x̂:

    L0                  mean over positions of the number of features > 0
    explained variance  1 − Σ‖x − x̂‖² / Σ‖x − x̄‖²,   x̄ the mean of x over all positions

the fraction of the activations' variance about their mean that the SAE reconstructs (SAELens's
formula since PR #710: the total squared error over the total variance, not a mean of per-row
ratios — SAELens's PR #443 and #710 fixed a formula that gave ~0.98 where this gives ~0.78). A
feature is dead when it is 0 at every position.

``diagnose`` adds the checks a folder cannot make about itself:

- the activation function (SAELens #553: OpenAI's TopK GPT-2 SAEs loaded as ReLU SAEs): a
  ``standard`` SAE whose L0 is a large share of d_sae and whose explained variance rises when only
  its k largest features are kept, for some k, was most likely trained as TopK; a ``topk`` SAE is
  compared with itself read as ReLU;
- the weight processing (SAELens #405): the model's weights against the cfg's
  ``model_from_pretrained_kwargs`` (refgpt/sae/in_model.py), and the explained variance with the
  stream centred the other way, so the number shows which processing the SAE was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import RefGPTError
from .in_model import processing_mismatches
from ..train.tuned_lens import text_windows
from .sae import SAE, topk


@dataclass
class Measures:
    """An SAE's measures on ``n`` activations."""

    n: int
    l0: float
    explained_variance: float
    dead: int
    d_sae: int
    mse: float

    def as_dict(self) -> dict:
        return {"positions": self.n, "l0": self.l0, "explained_variance": self.explained_variance,
                "dead_features": self.dead, "d_sae": self.d_sae, "mse": self.mse}


def explained_variance(x, x_hat) -> float:
    """1 − Σ‖x − x̂‖² / Σ‖x − x̄‖² over every row of x [n, d] (see the module docstring)."""
    x, x_hat = np.asarray(x), np.asarray(x_hat)
    total = float(((x - x.mean(0)) ** 2).sum())
    if total == 0:
        raise RefGPTError("explained variance: the activations do not vary (one position, or all equal)")
    return 1.0 - float(((x - x_hat) ** 2).sum()) / total


def measure(sae: SAE, x, out=None, features=None) -> Measures:
    """L0, explained variance and dead features of ``sae`` on inputs x [n, d_in] (outputs ``out``
    [n, d_out] for a transcoder, where the target is not the input)."""
    x = sae._reshaped(x).reshape(-1, sae.d_in)  # [n, d_in]
    f, state = sae._encode(x) if features is None else (features, sae.norm_in(x)[1])  # [n, d_sae]
    x_hat = sae.decode(f, state, x=x)  # [n, d_out]
    target = x if out is None else np.asarray(out).reshape(len(x), -1)
    return Measures(n=len(x), l0=float((f > 0).sum(-1).mean()), explained_variance=explained_variance(target, x_hat),
                    dead=int((~(f > 0).any(0)).sum()), d_sae=sae.d_sae, mse=float(((target - x_hat) ** 2).mean()))


def token_rows(model, sae: SAE, texts=(), documents=()) -> list[np.ndarray]:
    """The token rows to measure on: each TEXT whole (cut to the context), and each document cut
    into windows of n_ctx tokens (``text_windows``); <|endoftext|> first in every row when the SAE's
    ``prepend_bos`` (default true), whose position ``activations`` then leaves out."""
    bos = sae.metadata.get("prepend_bos", True)
    rows = [model.to_tokens(text, prepend_bos=bos, truncate=False)[0][: model.cfg.n_ctx] for text in texts]
    if documents:
        if model.tokenizer is None:
            raise RefGPTError(f"{model.source}: the model has no tokenizer to read text with")
        windows, _ = text_windows(model.tokenizer, list(documents), model.cfg.n_ctx - int(bos))  # [n, window]
        if bos:
            windows = np.concatenate([np.full((len(windows), 1), model.tokenizer.eot_token), windows], 1)
        rows += list(windows)
    return rows


def activations(model, sae: SAE, rows, batch: int = 16) -> tuple[np.ndarray, np.ndarray | None]:
    """The SAE's input at its hook at every position of the token rows ([n, d_in]; position 0 left
    out when the SAE's ``prepend_bos``) and, for a transcoder, the activation at hook_name_out."""
    skip = int(sae.metadata.get("prepend_bos", True))
    names = sorted({sae.hook_name, sae.hook_name_out})
    xs, outs = [], []
    by_length = {}
    for row in rows:
        by_length.setdefault(len(row), []).append(row)
    for length, same in sorted(by_length.items()):
        for start in range(0, len(same), batch):
            tokens = np.stack(same[start:start + batch])  # [batch, pos]
            _, cache = model.run_with_cache(tokens, names=names)
            xs.append(cache[sae.hook_name][:, skip:].reshape(len(tokens) * (length - skip), -1))
            if sae.is_transcoder:
                outs.append(cache[sae.hook_name_out][:, skip:].reshape(len(tokens) * (length - skip), -1))
    x = np.concatenate(xs) if xs else np.zeros((0, sae.d_in))  # [n, d_in]
    if len(x) < 2:
        raise RefGPTError("eval-sae: the texts give fewer than 2 positions to measure on")
    return x, (np.concatenate(outs) if outs else None)


@dataclass
class Diagnosis:
    measures: Measures
    warnings: list = field(default_factory=list)
    alternatives: dict = field(default_factory=dict)  # name → Measures of a reading it was compared with


def diagnose(model, sae: SAE, rows) -> Diagnosis:
    """``measure`` on the token rows (``token_rows``), with the checks of the module docstring."""
    x, out = activations(model, sae, rows)
    result = Diagnosis(measure(sae, x, out))
    for mismatch in processing_mismatches(model, sae):
        result.warnings.append(mismatch)
    if sae.architecture in ("standard", "topk") and not sae.is_transcoder:
        _activation_check(sae, x, result)
    claimed = (sae.metadata.get("model_from_pretrained_kwargs") or {}).get("center_writing_weights", False)
    if "center_writing_weights" in " ".join(result.warnings) and claimed and "resid" in sae.hook_name:
        # the stream of the same model with centred writing weights is x minus its mean along d_model
        result.alternatives["the stream centred"] = measure(sae, x - x.mean(-1, keepdims=True))
    return result


def _activation_check(sae: SAE, x, result: Diagnosis):
    f, state = sae._encode(x)  # [n, d_sae]
    if sae.architecture == "topk":
        relu = np.maximum(sae.process_sae_in(x)[0] @ sae.W_enc + sae.b_enc, 0)  # [n, d_sae]
        result.alternatives["read as ReLU"] = measure(sae, x, features=relu)
        return
    here = result.measures
    if here.l0 < 0.25 * sae.d_sae:
        return
    best = None
    for k in sorted({max(1, round(sae.d_sae * share)) for share in (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4)}):
        kept = measure(sae, x, features=topk(f, k))
        if best is None or kept.explained_variance > best[1].explained_variance:
            best = (k, kept)
    k, kept = best
    result.alternatives[f"read as TopK k={k}"] = kept
    if kept.explained_variance > here.explained_variance:
        result.warnings.append(
            f"activation function: read as ReLU, {here.l0:.0f} of {sae.d_sae} features are active per position "
            f"(explained variance {here.explained_variance:.3f}); keeping only the {k} largest explains "
            f"{kept.explained_variance:.3f}: this looks like a TopK SAE loaded as ReLU (SAELens #553) — set "
            f"architecture \"topk\" and k in its cfg.json")
