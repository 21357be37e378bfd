"""Weight processing: rewrite a GPT-2's weights so they read more simply, computing the same thing.

Each step is a pure function ``params → params`` (TransformerLens state-dict names in, new arrays
out, the input untouched) and each leaves something provably unchanged (docs/decomposition.md §3,
tests/core/test_processing.py):

    fold_ln                   LayerNorm's gain w and bias b move into the weights that read its
                              output:  (w ⊙ x̂ + b)·W + c = x̂·(diag(w)·W) + (b·W + c).  LayerNorm
                              is left with w = 1, b = 0, i.e. it only normalises (refgpt keeps the
                              two parameters; x̂·1 + 0 is x̂ bit for bit, TransformerLens's
                              LayerNormPre). Because x̂ has zero mean, a constant along d_model in a
                              reading weight does nothing, so those weights are centred too (as
                              TransformerLens does). Logits unchanged.
    center_writing_weights    every weight that writes to the residual stream (W_E, W_pos, W_O,
                              b_O, W_out, b_out) loses its mean along d_model. The stream moves by a
                              multiple of the ones vector at each position, which every LayerNorm
                              removes (LN(x + t·1) = LN(x)). Logits and LayerNorm outputs unchanged.
    center_unembed            W_U and b_U lose their mean over the vocabulary: every logit at a
                              position moves by the same amount, so log-probabilities are unchanged.
    fold_value_biases         b_V reaches the output as a constant, because each row of an
                              attention pattern sums to 1:  A·(x·W_V + 1·b_V) = A·x·W_V + 1·b_V.
                              So b_O += Σ_h b_V[h]·W_O[h], b_V = 0. Logits unchanged.
    refactor_factored_attn_matrices
                              only the products W_Q·W_Kᵀ (with the biases appended as an extra input
                              row) and W_V·W_O matter; re-factor them by SVD so that W_O has
                              orthonormal rows and W_Q, W_K share the singular values evenly, by
                              TransformerLens's own steps (FactoredMatrix.make_even, .svd).

``process(model, steps)`` applies the chosen steps in TransformerLens's order and returns a new
Model; ``steps=True`` means TransformerLens's ``from_pretrained`` defaults (fold_ln,
center_writing_weights, center_unembed, fold_value_biases). ``refgpt.load(dir, process=…)`` does
the same at load time; by default nothing is processed.

Arithmetic stays in the model's dtype (float64 by default). TransformerLens 3.9 casts float64
weights to float32 while processing them; refgpt does not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from ..gpt2.config import Config
from ..errors import RefGPTError

#: Every step, in the order ``process`` applies them (TransformerLens's order).
STEPS = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases",
         "refactor_factored_attn_matrices")
#: What TransformerLens's ``HookedTransformer.from_pretrained`` does by default.
TL_DEFAULTS = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")


def _blocks(cfg: Config):
    return [f"blocks.{L}." for L in range(cfg.n_layers)]


def _centred(a, axis):
    """a minus its mean along ``axis``."""
    return a - a.mean(axis, keepdims=True)


def fold_ln(params: Mapping[str, np.ndarray], cfg: Config) -> dict[str, np.ndarray]:
    """Fold every LayerNorm's w and b into the weights that read it; centre those weights.

    ln1 → W_Q, W_K, W_V [head, d_model, d_head] and b_Q, b_K, b_V; ln2 → W_in, b_in; ln_final →
    W_U and b_U (created if the model had none). Each LayerNorm is left with w = 1 and b = 0.
    """
    return fold_layer_norm(params, cfg)


def fold_layer_norm(params: Mapping[str, np.ndarray], cfg: Config, fold_biases: bool = True,
                    center_weights: bool = True) -> dict[str, np.ndarray]:
    """TransformerLens's ``fold_layer_norm``: ``fold_ln`` with its two switches. ``fold_biases=False``
    leaves each b where it is (only w is folded, and w becomes 1) — as in TransformerLens, meant
    for RMSNorm, which has no b: with GPT-2's biases it computes a different function (w·x̂ + b
    becomes x̂ + b). ``center_weights=False`` leaves the reading weights uncentred."""
    centred = _centred if center_weights else (lambda a, axis: a)
    p = dict(params)
    for b in _blocks(cfg):
        w1, b1 = p[b + "ln1.w"], p[b + "ln1.b"]  # [d_model]
        for x in "QKV":
            W = p[b + f"attn.W_{x}"]  # [head, d_model, d_head]
            if fold_biases:
                p[b + f"attn.b_{x}"] = p[b + f"attn.b_{x}"] + np.einsum("hde,d->he", W, b1)  # [head, d_head]
            p[b + f"attn.W_{x}"] = centred(W * w1[None, :, None], axis=1)  # [head, d_model, d_head]
        w2, b2 = p[b + "ln2.w"], p[b + "ln2.b"]  # [d_model]
        W_in = p[b + "mlp.W_in"]  # [d_model, d_mlp]
        if fold_biases:
            p[b + "mlp.b_in"] = p[b + "mlp.b_in"] + b2 @ W_in  # [d_mlp]
        p[b + "mlp.W_in"] = centred(W_in * w2[:, None], axis=0)  # [d_model, d_mlp]
        for ln, bias in (("ln1", b1), ("ln2", b2)):
            p[b + ln + ".w"] = np.ones_like(w1)
            p[b + ln + ".b"] = np.zeros_like(bias) if fold_biases else bias
    w_f, b_f = p["ln_final.w"], p["ln_final.b"]  # [d_model]
    W_U = p["unembed.W_U"]  # [d_model, d_vocab]
    if fold_biases:
        b_U = p.get("unembed.b_U", np.zeros(W_U.shape[1], W_U.dtype))  # [d_vocab]
        p["unembed.b_U"] = b_U + b_f @ W_U  # [d_vocab]
    p["unembed.W_U"] = centred(W_U * w_f[:, None], axis=0)  # [d_model, d_vocab]
    p["ln_final.w"] = np.ones_like(w_f)
    p["ln_final.b"] = np.zeros_like(b_f) if fold_biases else b_f
    return p


def center_writing_weights(params: Mapping[str, np.ndarray], cfg: Config) -> dict[str, np.ndarray]:
    """Subtract the mean along d_model from W_E, W_pos, W_O, b_O, W_out and b_out."""
    p = dict(params)
    p["embed.W_E"] = _centred(p["embed.W_E"], -1)  # [d_vocab, d_model]
    p["pos_embed.W_pos"] = _centred(p["pos_embed.W_pos"], -1)  # [n_ctx, d_model]
    for b in _blocks(cfg):
        p[b + "attn.W_O"] = _centred(p[b + "attn.W_O"], -1)  # [head, d_head, d_model]
        p[b + "attn.b_O"] = _centred(p[b + "attn.b_O"], -1)  # [d_model]
        p[b + "mlp.W_out"] = _centred(p[b + "mlp.W_out"], -1)  # [d_mlp, d_model]
        p[b + "mlp.b_out"] = _centred(p[b + "mlp.b_out"], -1)  # [d_model]
    return p


def center_unembed(params: Mapping[str, np.ndarray], cfg: Config | None = None) -> dict[str, np.ndarray]:
    """Subtract the mean over the vocabulary from W_U (and b_U, if the model has one)."""
    p = dict(params)
    p["unembed.W_U"] = _centred(p["unembed.W_U"], -1)  # [d_model, d_vocab]
    if "unembed.b_U" in p:
        p["unembed.b_U"] = _centred(p["unembed.b_U"], -1)  # [d_vocab]
    return p


def fold_value_biases(params: Mapping[str, np.ndarray], cfg: Config) -> dict[str, np.ndarray]:
    """b_O += Σ_h b_V[h]·W_O[h]; b_V = 0. (Attention pattern rows sum to 1.)"""
    p = dict(params)
    for b in _blocks(cfg):
        b_V, W_O = p[b + "attn.b_V"], p[b + "attn.W_O"]  # [head, d_head], [head, d_head, d_model]
        p[b + "attn.b_O"] = p[b + "attn.b_O"] + np.einsum("he,hed->d", b_V, W_O)  # [d_model]
        p[b + "attn.b_V"] = np.zeros_like(b_V)  # [head, d_head]
    return p


def refactor_factored_attn_matrices(params: Mapping[str, np.ndarray], cfg: Config,
                                    factored=None) -> dict[str, np.ndarray]:
    """Re-factor each head's QK and OV circuits by SVD; fold b_V into b_O. TransformerLens's method,
    step for step, so the new weights are TransformerLens's (not only their products):

    QK: with the biases appended as row d_model (an input coordinate that is always 1), the
    bilinear form is M = [W_Q; b_Q]·[W_K; b_K]ᵀ, a FactoredMatrix; its ``make_even()`` (U·√S,
    √S·Vᵀ from the SVD computed from the factors) gives the new [W_Q; b_Q] and [W_K; b_K]ᵀ.
    OV: b_O += Σ_h b_V[h]·W_O[h], b_V = 0; W_V·W_O = U·S·Vᵀ gives W_V = U·S, W_O = Vᵀ.

    A singular vector's sign is whatever the LAPACK behind the SVD returns. ``factored`` is the
    FactoredMatrix class whose SVD is used (default: refgpt.tl.circuits.FactoredMatrix, NumPy's
    LAPACK); the torch-facing model passes one that calls torch's, so its weights equal
    TransformerLens's to rounding, sign included (NumPy's LAPACK and torch's MKL pick opposite
    signs for a few percent of singular vectors; the products agree either way).
    """
    from .circuits import FactoredMatrix

    factored = factored or FactoredMatrix
    p = dict(params)
    for b in _blocks(cfg):
        W_Q = np.concatenate([p[b + "attn.W_Q"], p[b + "attn.b_Q"][:, None, :]], axis=1)  # [head, d_model+1, d_head]
        W_K = np.concatenate([p[b + "attn.W_K"], p[b + "attn.b_K"][:, None, :]], axis=1)  # [head, d_model+1, d_head]
        W_Q, W_K_T = factored(W_Q, W_K.transpose(0, 2, 1)).make_even().pair  # [head, d_model+1, d_head], [head, d_head, d_model+1]
        W_K = W_K_T.transpose(0, 2, 1)  # [head, d_model+1, d_head]
        p[b + "attn.W_Q"], p[b + "attn.b_Q"] = W_Q[:, :-1], W_Q[:, -1]
        p[b + "attn.W_K"], p[b + "attn.b_K"] = W_K[:, :-1], W_K[:, -1]
        b_V, W_O = p[b + "attn.b_V"], p[b + "attn.W_O"]  # [head, d_head], [head, d_head, d_model]
        p[b + "attn.b_O"] = p[b + "attn.b_O"] + (b_V[:, :, None] * W_O).sum(1).sum(0)  # [d_model], TL's order
        p[b + "attn.b_V"] = np.zeros_like(b_V)  # [head, d_head]
        U, S, V = factored(p[b + "attn.W_V"], W_O).svd()  # [head, d_model, d_head], [head, d_head], [head, d_model, d_head]
        p[b + "attn.W_V"] = U * S[:, None, :]  # [head, d_model, d_head]
        p[b + "attn.W_O"] = V.transpose(0, 2, 1)  # [head, d_head, d_model]
    return {name: np.ascontiguousarray(a) for name, a in p.items()}


_FUNCTIONS = {
    "fold_ln": fold_ln,
    "center_writing_weights": center_writing_weights,
    "center_unembed": center_unembed,
    "fold_value_biases": fold_value_biases,
    "refactor_factored_attn_matrices": refactor_factored_attn_matrices,
}


def resolve_steps(steps) -> tuple[str, ...]:
    """None/False → no steps; True → TL_DEFAULTS; a name or an iterable of names → those, in order."""
    if steps is None or steps is False:
        return ()
    if steps is True:
        return TL_DEFAULTS
    try:
        names = [steps] if isinstance(steps, str) else list(steps)
    except TypeError:
        raise RefGPTError(f"process: expected True, None, a step name or a list of step names, "
                          f"found {steps!r}") from None
    for name in names:
        if name not in _FUNCTIONS:
            raise RefGPTError(f"process: unknown processing step {name!r}; the steps are {list(STEPS)} "
                              "(or True for TransformerLens's defaults)")
    return tuple(s for s in STEPS if s in names)


def process_params(params: Mapping[str, np.ndarray], cfg: Config, steps=True, factored=None) -> dict[str, np.ndarray]:
    """Apply the chosen steps to a parameter dict, in TransformerLens's order (``factored``: see
    refactor_factored_attn_matrices)."""
    chosen = resolve_steps(steps)
    p = dict(params)
    for name in chosen:
        if name == "refactor_factored_attn_matrices":
            p = refactor_factored_attn_matrices(p, cfg, factored)
            continue
        p = _FUNCTIONS[name](p, cfg)
        if name == "fold_value_biases" and "center_writing_weights" in chosen:
            # b_V·W_O is already centred once W_O is (up to rounding); centre b_O exactly, as TL does.
            for b in _blocks(cfg):
                p[b + "attn.b_O"] = _centred(p[b + "attn.b_O"], -1)  # [d_model]
    return p


def process_weights(model, fold_ln: bool = True, center_writing_weights: bool = True, center_unembed: bool = True,
                    fold_value_biases: bool = True, refactor_factored_attn_matrices: bool = False):
    """TransformerLens's ``process_weights_`` keywords (and defaults), as a function returning a new
    Model: refgpt's weights are read-only, so nothing is processed in place."""
    flags = dict(fold_ln=fold_ln, center_writing_weights=center_writing_weights, center_unembed=center_unembed,
                 fold_value_biases=fold_value_biases, refactor_factored_attn_matrices=refactor_factored_attn_matrices)
    return process(model, [name for name, on in flags.items() if on])


def process(model, steps=True, factored=None):
    """A new Model with ``steps`` applied to ``model``'s weights (the model itself is untouched)."""
    chosen = resolve_steps(steps)
    params = process_params(model.params, model.cfg, chosen, factored)
    cfg = model.cfg
    if cfg.tie_word_embeddings and not np.array_equal(params["unembed.W_U"], params["embed.W_E"].T):
        cfg = dataclasses.replace(cfg, tie_word_embeddings=False)  # W_U is no longer W_Eᵀ
    processed = type(model)(cfg, params, dtype=model.dtype, source=model.source)  # a Model (processing sits below it)
    processed.tokenizer = model.tokenizer
    return processed
