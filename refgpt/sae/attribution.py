"""Exact feature attribution: which features wrote this logit, and do they sum to it?

refgpt's logit attribution (refgpt/analysis/attribution.py) splits a logit into every write to the
residual stream, through ln_final's cached scale σ, exactly. An SAE at a hook that is such a write
(or a sum of them) splits that write again. Its output at every position is

    x = Σ_i c_i·W_dec[i]·s  +  b_dec·s  +  m·1  (+ x_in·W_skipᵀ)  +  (x − x̂)
        "F17" (feature i)     "b_dec"     "sae_mean" "W_skip"        "sae_error"

with c the features' coefficients (f, or f/‖W_dec[i]‖ for a TopK SAE that rescales by the decoder
norm), s and m the input's scale and mean for an SAE that normalises its input (1 and 0 otherwise;
"sae_mean" appears only for layer_norm), W_skip a skip transcoder's. The last row, the error, is x
minus the reconstruction, so the rows sum to x as computed: nothing is approximated. Each row goes
to the logit as every write does, c·u/σ, u = P(w ⊙ W_U[:, t]) (through W_O first for an SAE on
attn.hook_z), and takes the place of the components the SAE's hook covers:

    blocks.L.hook_resid_pre     embed, pos_embed and every component of layers < L
    blocks.L.hook_resid_mid     … and layer L's attention (heads, b_V shares, b_O)
    blocks.L.hook_resid_post    every component of layers ≤ L
    blocks.L.hook_attn_out      layer L's attention;  blocks.L.attn.hook_z: the same but b_O
    blocks.L.hook_mlp_out       layer L's MLP (neurons, b_out)

(a transcoder covers its ``hook_name_out``). Everything else — what the blocks after the hook
wrote, ln_final.b, b_U — stays as analysis's attribution labels it, so the whole still sums to the
model's logit to rounding (≤ 1e-12 relative in float64: tests/sae/test_sae_attribution.py).
"""

from __future__ import annotations

import re

import numpy as np

from ..analysis.attribution import Attribution, attribute, readout, required_hooks
from ..errors import RefGPTError, need
from .sae import SAE

_HOOK = re.compile(r"blocks\.(\d+)\.(hook_resid_pre|hook_resid_mid|hook_resid_post|hook_attn_out|hook_mlp_out|attn\.hook_z)$")
_LABEL = re.compile(r"L(\d+)(?:H\d+(?:\.b_V)?|\.attn|\.b_V|(\.b_O)|N\d+|\.mlp|\.b_out)$")
_NEEDED_BY = "feature attribution"


def _part(label):
    """(layer, "attn" | "b_O" | "mlp") of an attribution label; (−1, "embed") for the embeddings;
    None for the constants after the last block (ln_final.b, b_U)."""
    if label in ("embed", "pos_embed"):
        return -1, "embed"
    match = _LABEL.match(label)
    if match is None:
        return None
    if match.group(2):
        return int(match.group(1)), "b_O"
    mlp = "N" in label or label.endswith((".mlp", ".b_out"))
    return int(match.group(1)), "mlp" if mlp else "attn"


def covers(hook: str, label: str) -> bool:
    """Is the component ``label`` part of the activation at ``hook`` (see the module docstring)?"""
    match, part = _HOOK.match(hook), _part(label)
    if match is None or part is None:
        return False
    L, kind = int(match.group(1)), match.group(2)
    layer, what = part
    if kind == "hook_resid_pre":
        return layer < L
    if kind == "hook_resid_mid":
        return layer < L or (layer == L and what in ("attn", "b_O"))
    if kind == "hook_resid_post":
        return layer <= L
    if kind == "hook_attn_out":
        return layer == L and what in ("attn", "b_O")
    if kind == "hook_mlp_out":
        return layer == L and what == "mlp"
    return layer == L and what == "attn"  # attn.hook_z


def hooks_needed(model, sae: SAE) -> list[str]:
    """The cache entries ``attribute_features`` reads (pass as ``run_with_cache(tokens, names=…)``)."""
    return sorted(set(required_hooks(model.cfg, logits=False)) | {sae.hook_name, sae.hook_name_out})


def attribute_features(cache, sae: SAE, target, against=None, granularity="layer", logits=None) -> Attribution:
    """The logit for ``target`` (minus ``against``) split into the SAE's features (labelled "F{i}"),
    "b_dec", "sae_error" (and "sae_mean", "W_skip" where the SAE has them) and every component the
    SAE's hook does not cover. ``cache``: a pass without the SAE spliced in (or with the error term),
    holding ``hooks_needed(model, sae)``. ``values`` [component, batch, pos] sum to ``logit``."""
    hook = sae.hook_name_out
    if hook is None or _HOOK.match(hook) is None:
        raise RefGPTError(f"feature attribution: an SAE writing {hook!r} is not a write to the residual stream; "
                          "refgpt attributes SAEs at blocks.L.hook_resid_pre/mid/post, hook_attn_out, hook_mlp_out "
                          "and attn.hook_z")
    model = cache.model
    if f"{hook}.hook_sae_output" in cache and f"{hook}.hook_sae_error" not in cache:
        raise RefGPTError(f"feature attribution: the cache is of a pass with the SAE at {hook} spliced in (its "
                          "output replaced the activation); attribute a plain pass, or one with use_error_term=True")
    if sae.dtype != model.dtype:
        raise RefGPTError(f"feature attribution: the SAE is {sae.dtype}, the model {model.dtype}")
    base = attribute(cache, target, against, granularity, logits)
    scale, _, _, _, u = readout(cache, target, against)
    v = _into_sae_output(model, hook, u)  # [d_out] or [batch, pos, d_out]

    x_in = need(cache, sae.hook_name, _NEEDED_BY)  # [batch, pos, d_in] ([batch, pos, head, d_head] for hook_z)
    out = sae._reshaped(need(cache, hook, _NEEDED_BY)) if not sae.is_transcoder else need(cache, hook, _NEEDED_BY)
    f, (s, m) = sae._encode(x_in)  # [batch, pos, d_sae]
    p = sae.params
    c = sae.coefficients(f)  # [batch, pos, d_sae]
    if sae.is_transcoder:
        s = 1.0
    if v.ndim == 1:
        g = p["W_dec"] @ v  # W_dec[i]·v: [d_sae]
        onto = lambda y: y @ v  # noqa: E731  [batch, pos, d_out] → [batch, pos]
        b_dec = np.broadcast_to(p["b_dec"] @ v, scale.shape)  # [batch, pos]
    else:
        g = v @ p["W_dec"].T  # [batch, pos, d_sae]
        onto = lambda y: np.einsum("bpd,bpd->bp", y, v)  # noqa: E731
        b_dec = v @ p["b_dec"]  # [batch, pos]
    features = np.moveaxis(c * g * s, -1, 0)  # [d_sae, batch, pos]
    labels, rows = [f"F{i}" for i in range(sae.d_sae)], [features]
    labels.append("b_dec")
    rows.append((b_dec * np.broadcast_to(s, scale.shape + (1,))[..., 0])[None])  # [1, batch, pos]
    recons = sae.decode(f, (s, m), x=x_in)  # [batch, pos, d_out]
    if sae.cfg.get("normalize_activations") == "layer_norm":
        labels.append("sae_mean")
        rows.append((m[..., 0] * v.sum(-1))[None])  # m·1·v: [1, batch, pos]
    if "W_skip" in p:
        labels.append("W_skip")
        rows.append(onto(sae._reshaped(x_in) @ p["W_skip"].T)[None])
    labels.append("sae_error")
    rows.append(onto(out - recons)[None])
    sae_values = np.concatenate(rows) / scale  # [component, batch, pos]

    keep = [i for i, label in enumerate(base.labels) if not covers(hook, label)]
    labels = [base.labels[i] for i in keep] + labels
    values = np.concatenate([base.values[keep], sae_values])  # [component, batch, pos]
    result = Attribution(labels, values, base.logit, base.target, base.against, base.granularity)
    result.features = f  # [batch, pos, d_sae]
    return result


def _into_sae_output(model, hook, u):
    """The direction in the SAE's output space whose dot product is the write's dot product with u:
    u itself, or W_O·u flattened to [head·d_head] for attn.hook_z."""
    if not hook.endswith("attn.hook_z"):
        return u
    W_O = model.params[f"blocks.{int(_HOOK.match(hook).group(1))}.attn.W_O"]  # [head, d_head, d_model]
    flat = W_O.reshape(-1, W_O.shape[-1])  # [head·d_head, d_model]
    return u @ flat.T  # [head·d_head] or [batch, pos, head·d_head]


def feature_logits(model, sae: SAE, feature) -> np.ndarray:
    """What one unit of feature ``feature`` adds to every logit through the frozen final LayerNorm,
    times σ: W_dec[i] (through W_O for attn.hook_z) · P(w ⊙ W_U) [d_vocab]. Divided by a position's
    cached σ it is the feature's direct effect there per unit of activation; its largest and
    smallest entries are the tokens the feature promotes and suppresses. ``feature``: an index, or
    a list of them ([feature, d_vocab], P(w ⊙ W_U) formed once)."""
    features = np.asarray(feature)
    if features.dtype.kind not in "iu" or features.ndim > 1:
        raise RefGPTError(f"feature must be an index or a list of them, found {feature!r}")
    if features.size and not (0 <= features.min() and features.max() < sae.d_sae):
        raise RefGPTError(f"feature {feature} is outside the SAE's [0, {sae.d_sae})")
    hook = sae.hook_name_out
    if hook is None or _HOOK.match(hook) is None:
        raise RefGPTError(f"feature logits: an SAE writing {hook!r} is not a write to the residual stream")
    p = model.params
    row = sae.W_dec[features]  # [d_out] or [feature, d_out]
    if hook.endswith("attn.hook_z"):
        W_O = p[f"blocks.{int(_HOOK.match(hook).group(1))}.attn.W_O"]  # [head, d_head, d_model]
        row = row @ W_O.reshape(-1, W_O.shape[-1])  # [d_model] or [feature, d_model]
    u = p["ln_final.w"][:, None] * p["unembed.W_U"]  # [d_model, d_vocab]
    u = u - u.mean(0, keepdims=True)  # P(w ⊙ W_U)
    return row @ u  # [d_vocab] or [feature, d_vocab]
