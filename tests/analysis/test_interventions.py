"""Interventions (steering, injection, patching) do exactly what they say, as hooks or as a context
manager; the measurements of a run (stream norms, injection ratio, KL) are what their formulas say."""

from __future__ import annotations

import numpy as np
import pytest

from random_models import random_model
from refgpt import Config, RefGPTError, Tokenizer
from refgpt.analysis.interventions import add_vector, injection_limit, patch, space_token, steering_vector
from refgpt.analysis.measurements import injection_ratio, kl_divergence, resid_norms, streams
from refgpt.tl.hooks import HookPoint
from refgpt.gpt2.tokenizer import BYTE_TO_CHAR, ENDOFTEXT

CFG = Config(d_model=12, n_layers=3, n_heads=3, d_mlp=20, d_vocab=257, n_ctx=16)
TOKENS = np.array([[256, 72, 105, 33, 32, 121, 111], [256, 66, 121, 101, 46, 46, 46]])


def byte_tokenizer():
    """A byte-level vocabulary like the embedded model's: 256 byte tokens, then <|endoftext|>."""
    encoder = {BYTE_TO_CHAR[b]: b for b in range(256)}
    encoder[ENDOFTEXT] = 256
    return Tokenizer(encoder, [])


@pytest.fixture(scope="module")
def model():
    m = random_model(CFG, seed=11)
    m.tokenizer = byte_tokenizer()
    return m


def resid_pre(model, tokens, layer):
    name = f"blocks.{layer}.hook_resid_pre"
    return model.run_with_cache(tokens, names=[name])[1][name]


def test_steering_vector_is_coeff_times_resid_difference_padded_with_space(model):
    sv = steering_vector(model, "Love", "Hate it", layer=1, coeff=3.0)
    assert space_token(model) == 32
    assert sv.plus_tokens.tolist() == [256, 76, 111, 118, 101, 32, 32, 32]  # "Love" + 3 spaces
    assert sv.minus_tokens.tolist() == [256, 72, 97, 116, 101, 32, 105, 116]
    plus, minus = resid_pre(model, sv.plus_tokens, 1)[0], resid_pre(model, sv.minus_tokens, 1)[0]
    assert np.array_equal(sv.vector, 3.0 * (plus - minus))
    assert sv.vector.shape == (8, CFG.d_model) and sv.layer == 1


def test_steering_vector_adds_at_the_front_as_hooks_and_as_context_manager(model):
    sv = steering_vector(model, "ab", "cd", layer=2, coeff=-2.5)
    tokens = TOKENS
    manual = model.run_with_hooks(tokens, fwd_hooks=[(
        "blocks.2.hook_resid_pre", lambda r, n: np.concatenate([r[:, :3] + sv.vector, r[:, 3:]], axis=1))])
    assert np.array_equal(model.run_with_hooks(tokens, fwd_hooks=sv), manual)
    with sv:
        inside = model(tokens)
    assert np.array_equal(inside, manual)
    assert np.array_equal(model(tokens), model.run_with_hooks(tokens))  # removed on exit
    assert not any(hp.fwd_hooks for hp in model.hook_dict.values())


def test_intervention_cannot_be_entered_twice_and_combines_with_another(model):
    a = add_vector(model, TOKENS, np.ones(CFG.d_model), 0, [1], coeff=2.0)
    b = add_vector(model, TOKENS, np.ones(CFG.d_model), 0, [1], coeff=3.0)
    with a, pytest.raises(RefGPTError, match="already active"):
        with a:
            pass

    def manual(resid, name):  # (r + 2·1) + 3·1, in that order, as the two hooks compute it
        out = resid.copy()
        out[:, 1] = (out[:, 1] + 2.0) + 3.0
        return out

    combined = model.run_with_hooks(TOKENS, fwd_hooks=a + b)
    assert np.array_equal(combined, model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.hook_resid_pre", manual)]))
    assert len(a + b) == 2


def test_add_vector_positions_front_list_and_negative(model):
    rng = np.random.default_rng(0)
    v = rng.standard_normal((2, CFG.d_model))
    front = add_vector(model, TOKENS, v, 1, "front", coeff=4.0)
    listed = add_vector(model, TOKENS, v, 1, [0, -6], coeff=4.0)  # -6 is position 1 of 7
    _, cache = model.run_with_cache(TOKENS, fwd_hooks=front)
    clean = resid_pre(model, TOKENS, 1)
    expected = clean.copy()
    expected[:, :2] += 4.0 * v
    assert np.array_equal(cache["blocks.1.hook_resid_pre"], expected)
    assert np.array_equal(model.run_with_hooks(TOKENS, fwd_hooks=listed), model.run_with_hooks(TOKENS, fwd_hooks=front))
    one = add_vector(model, TOKENS, v[0], 1, [2, 4], coeff=1.0)  # one vector at two positions
    _, cache = model.run_with_cache(TOKENS, fwd_hooks=one)
    diff = cache["blocks.1.hook_resid_pre"] - clean
    assert np.array_equal(np.flatnonzero(np.abs(diff).sum((0, 2))), [2, 4])


@pytest.mark.parametrize("kwargs, match", [
    (dict(vector=np.ones(5)), "vector"),
    (dict(positions=[7]), "outside"),
    (dict(positions=[1, -6]), "twice"),
    (dict(positions="back"), "front"),
    (dict(layer=3), "layer"),
    (dict(vector=np.ones((3, 12)), positions=[1, 2]), "rows"),
])
def test_add_vector_rejects_bad_input(model, kwargs, match):
    args = dict(vector=np.ones(12), layer=0, positions=[1])
    args.update(kwargs)
    with pytest.raises(RefGPTError, match=match):
        add_vector(model, TOKENS, **args)


def test_interventions_refuse_prompts_they_do_not_fit(model):
    sv = steering_vector(model, "a long prompt", "x", layer=0)
    with pytest.raises(RefGPTError, match="at least 14 positions"):
        model.run_with_hooks(TOKENS, fwd_hooks=sv)
    v = add_vector(model, TOKENS, np.ones(12), 0, [1])
    with pytest.raises(RefGPTError, match="7 positions"):
        model.run_with_hooks(TOKENS[:, :5], fwd_hooks=v)


def test_steering_needs_a_single_space_token_for_padding(model):
    m = random_model(CFG, seed=1)
    with pytest.raises(RefGPTError, match="no tokenizer"):
        steering_vector(m, [1, 2], [3], layer=0)
    assert steering_vector(m, [1, 2], [3], layer=0, pad_token=0).minus_tokens.tolist() == [3, 0]


def test_patching_every_position_of_resid_pre_reproduces_the_source_run(model):
    source_tokens = TOKENS[::-1].copy()
    source_logits, source = model.run_with_cache(source_tokens)
    patched = patch(model, TOKENS, source, "blocks.1.hook_resid_pre")
    assert np.array_equal(model.run_with_hooks(TOKENS, fwd_hooks=patched), source_logits)


def test_patching_one_position_changes_only_that_position_and_later(model):
    _, source = model.run_with_cache(TOKENS[::-1].copy())
    clean = model(TOKENS)
    for name in ("blocks.1.hook_resid_mid", "blocks.2.attn.hook_pattern", "blocks.0.ln2.hook_scale"):
        patched, cache = model.run_with_cache(TOKENS, fwd_hooks=patch(model, TOKENS, source, [name], [3]))
        axis = 2 if name.endswith("pattern") else 1
        assert np.array_equal(np.take(cache[name], [3], axis), np.take(source[name], [3], axis))
        assert np.array_equal(patched[:, :3], clean[:, :3])
        assert not np.array_equal(patched[:, 3], clean[:, 3])


def test_patch_broadcasts_a_single_source_row_and_rejects_mismatches(model):
    _, source = model.run_with_cache(TOKENS[:1])
    _, cache = model.run_with_cache(TOKENS, fwd_hooks=patch(model, TOKENS, source, "hook_embed", [2]))
    assert np.array_equal(cache["hook_embed"][:, 2], np.repeat(source["hook_embed"][:, 2], 2, 0))
    _, short = model.run_with_cache(TOKENS[:, :4], names=["hook_embed"])
    with pytest.raises(RefGPTError, match="positions"):
        model.run_with_hooks(TOKENS, fwd_hooks=patch(model, TOKENS, short, "hook_embed"))
    with pytest.raises(RefGPTError, match="not in the source cache"):
        patch(model, TOKENS, short, "hook_pos_embed")
    with pytest.raises(RefGPTError, match="not a hook point"):
        patch(model, TOKENS, short, "blocks.9.hook_resid_pre")


def test_injection_limit_rejects_a_constant_direction(model):
    with pytest.raises(RefGPTError, match="P·d = 0"):
        injection_limit(model, np.full(CFG.d_model, 2.0), 0, 1)
    with pytest.raises(RefGPTError, match="direction"):
        injection_limit(model, np.ones(3), 0, 1)


# ---- measurements ------------------------------------------------------------------------------


def test_resid_norms_are_the_norms_of_the_cached_streams(model):
    _, cache = model.run_with_cache(TOKENS)
    norms = resid_norms(cache, batch=1)
    assert set(norms) == {"resid_pre", "resid_mid", "resid_post"}
    for kind, array in norms.items():
        assert array.shape == (CFG.n_layers, TOKENS.shape[1])
        assert np.array_equal(array[2], np.linalg.norm(cache[f"blocks.2.hook_{kind}"][1], axis=-1))
    assert streams(cache).shape == (CFG.n_layers + 1, 2, 7, CFG.d_model)
    _, partial = model.run_with_cache(TOKENS, names=["hook_embed"])
    with pytest.raises(RefGPTError, match="resid_pre"):
        resid_norms(partial)


def test_injection_ratio_tends_to_one_after_the_injection_layer(model):
    d = np.random.default_rng(2).standard_normal(CFG.d_model)
    for k, close in ((1e3, 1e-2), (1e9, 1e-8)):
        _, cache = model.run_with_cache(TOKENS, fwd_hooks=add_vector(model, TOKENS, d, 1, [4], coeff=k))
        ratio = injection_ratio(cache, k * d, [4])  # [stream, 1]
        assert ratio.shape == (CFG.n_layers + 1, 1)
        assert ratio[0, 0] > 1 / close  # layer 0 does not hold the vector: a huge ratio
        # ‖kd‖/‖kd + s‖ ∈ [1/(1 + ‖s‖/‖kd‖), 1/(1 − ‖s‖/‖kd‖)]: `close` bounds ‖s‖/‖kd‖ here.
        assert np.all(np.abs(ratio[1:, 0] - 1) <= close)


def test_kl_divergence_is_zero_for_equal_logits_and_matches_its_formula():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((2, 5, 9)), rng.standard_normal((2, 5, 9))
    assert np.array_equal(kl_divergence(a, a), np.zeros((2, 5)))  # log p − log p = 0 exactly
    p, q = np.exp(a) / np.exp(a).sum(-1, keepdims=True), np.exp(b) / np.exp(b).sum(-1, keepdims=True)
    # Both sides: 9-term sums of products of logs, each log off by a few ulps of log's argument
    # sum: rounding ≤ γ_m·Σ p·(|log p| + |log q| + 1), m = 3·9 + 10 (sum, log, exp, subtraction).
    u = np.finfo(np.float64).eps / 2
    m = 3 * 9 + 10
    allowance = m * u / (1 - m * u) * np.sum(p * (np.abs(np.log(p)) + np.abs(np.log(q)) + 1), -1)
    assert np.all(np.abs(kl_divergence(a, b) - np.sum(p * np.log(p / q), -1)) <= allowance)
    assert np.all(kl_divergence(a, b) > 0)
    with pytest.raises(RefGPTError, match="shapes"):
        kl_divergence(a, b[:, :3])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_coefficient_the_stream_cannot_hold_is_an_error(dtype):
    """coeff·vector is formed in float64 and rounded once to the model's dtype; if it is not
    finite there, add_vector and steering_vector say so instead of adding inf (or 0·inf = NaN)."""
    m = random_model(CFG, seed=2, dtype=dtype)
    big = float(np.finfo(dtype).max)
    ok = add_vector(m, TOKENS, np.full(12, 0.5), 0, [1], coeff=big)  # 0.5·max is representable
    assert np.all(np.isfinite(ok.hooks[0][1](np.zeros((2, 7, 12), m.dtype), HookPoint("x"))[:, 1]))
    for coeff in (4 * big, np.inf, np.nan, "1"):
        with pytest.raises(RefGPTError, match="overflows|finite number"):
            add_vector(m, TOKENS, np.full(12, 0.5), 0, [1], coeff=coeff)
        with pytest.raises(RefGPTError, match="overflows|finite number"):
            steering_vector(m, [1, 2], [3, 4], 0, coeff=coeff)


def test_norms_of_a_float32_stream_holding_a_huge_vector_are_finite():
    """measurements.norm works in float64: a float32 stream with entries ~1e30 is finite, its
    squared norm in float32 is not (it overflows past 1.8e19)."""
    m = random_model(CFG, seed=3, dtype="float32")
    v = add_vector(m, TOKENS, np.linspace(-1, 1, 12), 1, [2], coeff=1e30)
    _, cache = m.run_with_cache(TOKENS, fwd_hooks=v)
    with np.errstate(over="raise", invalid="raise"):
        ratio = injection_ratio(cache, 1e30 * np.linspace(-1, 1, 12), [2])
        norms = resid_norms(cache)
    assert np.all(np.isfinite(ratio)) and abs(ratio[-1, 0] - 1) < 1e-3
    assert all(np.all(np.isfinite(n)) for n in norms.values())
