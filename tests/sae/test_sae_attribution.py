"""Exact feature attribution: on random GPT-2s and random SAEs of every architecture at every hook
kind, the features, b_dec, the error row and the uncovered components sum to the model's logit to
≤ 1e-12 relative in float64 (rounding of a few hundred float64 terms; measured ≤ 1e-14)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from random_models import random_model
from refgpt import Config
from refgpt.errors import RefGPTError
from refgpt.sae import SAE
from refgpt.sae.attribution import attribute_features, covers, hooks_needed

REL = 1e-12
KINDS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out", "attn.hook_z")


def random_sae(architecture, d_in, d_sae, hook, seed, d_out=None, **cfg):
    rng = np.random.default_rng(seed)
    d_out = d_out or d_in
    shapes = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_out), "b_dec": (d_out,)}
    from refgpt.sae.sae import EXTRA_WEIGHTS
    for name in EXTRA_WEIGHTS[architecture]:
        shapes[name] = (d_out, d_in) if name == "W_skip" else (d_sae,)
    params = {name: 0.5 * rng.standard_normal(shape) for name, shape in shapes.items()}
    if "threshold" in params:
        params["threshold"] = np.abs(params["threshold"]) * 0.3
    full = {"d_in": d_in, "d_sae": d_sae, "architecture": architecture, "apply_b_dec_to_input": "transcoder" not in architecture,
            "normalize_activations": "none", "reshape_activations": "hook_z" if hook.endswith("hook_z") else "none",
            "metadata": {"hook_name": hook}, **cfg}
    if "transcoder" in architecture:
        full["d_out"] = d_out
    return SAE(full, params)


@st.composite
def cases(draw):
    n_heads, d_head = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    cfg = Config(d_model=n_heads * d_head, n_layers=draw(st.integers(1, 3)), n_heads=n_heads, d_mlp=draw(st.integers(1, 12)),
                 d_vocab=draw(st.integers(5, 30)), n_ctx=8)
    model = random_model(cfg, seed=draw(st.integers(0, 2**16)), scale=draw(st.sampled_from([0.3, 1.0, 3.0])))
    L = draw(st.integers(0, cfg.n_layers - 1))
    hook = f"blocks.{L}.{draw(st.sampled_from(KINDS))}"
    arch = draw(st.sampled_from(["standard", "topk", "jumprelu", "gated"]))
    d_in = cfg.n_heads * cfg.d_head if hook.endswith("hook_z") else cfg.d_model
    d_sae = draw(st.integers(1, 24))
    extra = {}
    if arch == "topk":
        extra = {"k": draw(st.integers(1, d_sae)), "rescale_acts_by_decoder_norm": draw(st.booleans())}
    if not hook.endswith("hook_z"):  # (layer_norm needs d_in ≥ 2: load_sae refuses d_in = 1)
        extra["normalize_activations"] = draw(st.sampled_from(["none", "constant_norm_rescale"]
                                                              + (["layer_norm"] if d_in > 1 else [])))
    sae = random_sae(arch, d_in, d_sae, hook, draw(st.integers(0, 2**16)), **extra)
    tokens = np.random.default_rng(draw(st.integers(0, 99))).integers(0, cfg.d_vocab, (2, draw(st.integers(1, 8))))
    return model, sae, tokens, draw(st.sampled_from(["layer", "head", "neuron"]))


@settings(max_examples=60, deadline=None)
@given(cases(), st.data())
def test_feature_attribution_sums_to_the_logit(case, data):
    model, sae, tokens, granularity = case
    logits, cache = model.run_with_cache(tokens, names=hooks_needed(model, sae))
    target = data.draw(st.integers(0, model.cfg.d_vocab - 1))
    against = data.draw(st.none() | st.integers(0, model.cfg.d_vocab - 1))
    result = attribute_features(cache, sae, target, against, granularity, logits=logits)
    assert result.check(relative=True) <= REL
    assert not any(covers(sae.hook_name, label) for label in result.labels)
    assert {"b_dec", "sae_error", "F0"} <= set(result.labels) and "ln_final.b" in result.labels
    # a feature that is off contributes exactly nothing
    off = result.features[0, -1] == 0
    assert not np.any(result.values[[result.labels.index(f"F{i}") for i in np.flatnonzero(off)], 0, -1])


def test_per_position_targets_and_a_transcoder_sum_too():
    cfg = Config(d_model=6, n_layers=2, n_heads=2, d_mlp=10, d_vocab=20, n_ctx=8)
    model = random_model(cfg, seed=3, scale=1.0)
    tc = random_sae("skip_transcoder", 6, 9, "blocks.1.hook_resid_mid", seed=4)
    tc.cfg["metadata"]["hook_name_out"] = "blocks.1.hook_mlp_out"
    tokens = np.random.default_rng(5).integers(0, 20, (2, 6))
    logits, cache = model.run_with_cache(tokens, names=hooks_needed(model, tc))
    result = attribute_features(cache, tc, tokens, granularity="neuron", logits=logits)
    assert result.check(relative=True) <= REL
    assert "W_skip" in result.labels and not any(label.startswith("L1N") for label in result.labels)
    assert "L0N3" in result.labels


def test_a_hook_that_is_no_write_is_refused():
    cfg = Config(d_model=4, n_layers=1, n_heads=1, d_mlp=4, d_vocab=9, n_ctx=4)
    model = random_model(cfg)
    sae = random_sae("standard", 4, 5, "blocks.0.ln2.hook_normalized", seed=1)
    logits, cache = model.run_with_cache(np.arange(3)[None])
    with pytest.raises(RefGPTError, match="not a write to the residual stream"):
        attribute_features(cache, sae, 1)


def test_a_spliced_pass_is_refused_and_an_error_term_pass_attributes_the_same():
    from refgpt.sae import in_model

    cfg = Config(d_model=6, n_layers=2, n_heads=2, d_mlp=10, d_vocab=20, n_ctx=8)
    model = random_model(cfg, seed=8, scale=1.0)
    sae = random_sae("jumprelu", 6, 9, "blocks.1.hook_resid_pre", seed=9)
    tokens = np.random.default_rng(10).integers(0, 20, (1, 5))
    logits, cache = in_model.run_with_cache_with_saes(model, tokens, saes=[sae], check=False)
    with pytest.raises(RefGPTError, match="spliced in"):
        attribute_features(cache, sae, 3, logits=logits)
    logits, cache = in_model.run_with_cache_with_saes(model, tokens, saes=[sae], use_error_term=True, check=False)
    plain_logits, plain = model.run_with_cache(tokens, names=hooks_needed(model, sae))
    ours = attribute_features(cache, sae, 3, logits=logits)
    assert np.array_equal(ours.values, attribute_features(plain, sae, 3, logits=plain_logits).values)


def test_a_transcoder_is_measured_against_its_output_hook():
    from refgpt.sae.evaluation import diagnose, explained_variance

    cfg = Config(d_model=6, n_layers=2, n_heads=2, d_mlp=10, d_vocab=20, n_ctx=8)
    model = random_model(cfg, seed=11, scale=1.0)
    tc = random_sae("transcoder", 6, 9, "blocks.1.hook_resid_mid", seed=12)
    tc.cfg["metadata"]["hook_name_out"] = "blocks.1.hook_mlp_out"
    rows = [np.arange(1, 8), np.arange(8, 15)]
    result = diagnose(model, tc, rows)
    _, cache = model.run_with_cache(np.stack(rows), names=["blocks.1.hook_resid_mid", "blocks.1.hook_mlp_out"])
    x = cache["blocks.1.hook_resid_mid"][:, 1:].reshape(-1, 6)  # position 0 (prepend_bos) left out
    out = cache["blocks.1.hook_mlp_out"][:, 1:].reshape(-1, 6)
    assert result.measures.n == 12 and result.measures.explained_variance == explained_variance(out, tc.forward(x))
