"""Lenses read what each stream would predict: the logit lens is the truncated model's prediction,
the cached-final-scale variant differs from it only by a temperature when ln_final has no bias, the
tuned lens applies h + A·h + b before ln_final, and the least-squares translators are optimal."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from random_models import model_and_tokens, random_model, random_params
from refgpt import Config, Model, RefGPTError
from refgpt.gpt2.layernorm import layer_norm
from refgpt.analysis.lens import (fit_least_squares_translators, load_translators, logit_lens, logit_lens_final_scale,
                         save_translators, tuned_lens)
from refgpt.analysis.measurements import streams

U = np.finfo(np.float64).eps / 2
CFG = Config(d_model=12, n_layers=3, n_heads=3, d_mlp=20, d_vocab=23, n_ctx=10)
TOKENS = np.array([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]])


def gamma(m):
    return m * U / (1 - m * U)


def unembed_allowance(model, y):
    """Two computations of y·W_U (+ b_U) differing only in summation order: elementwise
    ≤ 2γ_n·Σ|y_i||W_U[i, v]| ≤ 2γ_n·‖y‖·max_v ‖W_U[:, v]‖, plus b_U's addition."""
    W = model.params["unembed.W_U"]
    return 2 * gamma(model.cfg.d_model) * np.linalg.norm(y, axis=-1).max() * np.linalg.norm(W, axis=0).max() * (1 + 2 * U)


@pytest.fixture(scope="module")
def model():
    params = random_params(CFG, seed=5)
    params["unembed.b_U"] = 0.3 * np.random.default_rng(5).standard_normal(CFG.d_vocab)
    return Model(CFG, params)


def truncated(model, n_layers):
    """The model made of the first n_layers blocks and the same ln_final and unembedding."""
    cfg = Config(**{**model.cfg.__dict__, "n_layers": n_layers})
    keep = {k: v for k, v in model.params.items() if not k.startswith("blocks.") or int(k.split(".")[1]) < n_layers}
    return Model(cfg, keep)


@settings(max_examples=40, deadline=None)
@given(model_and_tokens())
def test_logit_lens_row_is_the_prediction_of_the_truncated_model(model_tokens):
    """Row M of the logit lens (LayerNorm recomputed) = logits of blocks 0..M−1 alone; the last row
    is the model's own logits."""
    model, tokens = model_tokens
    logits, cache = model.run_with_cache(tokens)
    lens = logit_lens(cache)
    assert lens.logits.shape == (model.cfg.n_layers + 1, *logits.shape)
    assert lens.labels[-1] == "final_post" and lens.labels[0] == "0_pre"
    y = layer_norm(streams(cache), model.params["ln_final.w"], model.params["ln_final.b"], model.cfg.eps)
    allowance = unembed_allowance(model, y)
    assert np.max(np.abs(lens.logits[-1] - logits)) <= allowance
    for M in range(1, model.cfg.n_layers):
        assert np.max(np.abs(lens.logits[M] - truncated(model, M)(tokens))) <= allowance


def test_final_scale_lens_is_the_logit_lens_at_another_temperature_when_ln_final_has_no_bias():
    """With b_f = 0 and no b_U: final-scale logits · σ_final = logit-lens logits · σ_M, so the two
    lenses rank tokens alike; with b_f ≠ 0 they disagree."""
    params = random_params(CFG, seed=8)
    params["ln_final.b"] = np.zeros(CFG.d_model)
    model = Model(CFG, params)
    _, cache = model.run_with_cache(TOKENS)
    lens, final = logit_lens(cache), logit_lens_final_scale(cache)
    x = streams(cache)  # [stream, batch, pos, d_model]
    sigma = np.sqrt(x.var(-1, keepdims=True) + CFG.eps)  # [stream, batch, pos, 1]
    lhs, rhs = final.logits * cache["ln_final.hook_scale"], lens.logits * sigma
    # Each side is w ⊙ P·x·W_U up to a product with a few roundings: ≤ 2γ_{n+5} of Σ|w⊙Px||W_U|.
    size = np.linalg.norm(params["ln_final.w"] * (x - x.mean(-1, keepdims=True)), axis=-1).max()
    assert np.max(np.abs(lhs - rhs)) <= 2 * gamma(CFG.d_model + 5) * size * np.linalg.norm(params["unembed.W_U"], axis=0).max()
    assert np.array_equal(final.top(1)[0], lens.top(1)[0])
    _, cache_b = random_model(CFG, seed=8).run_with_cache(TOKENS)
    assert not np.allclose(logit_lens(cache_b).logits[0], logit_lens_final_scale(cache_b).logits[0])


def test_top_tokens_and_target_probabilities_agree_with_the_probabilities(model):
    _, cache = model.run_with_cache(TOKENS)
    lens = logit_lens(cache)
    probs = lens.probs()
    assert np.all(np.abs(probs.sum(-1) - 1) <= gamma(CFG.d_vocab + 2))
    ids, top_p = lens.top(3)
    assert ids.shape == top_p.shape == (CFG.n_layers + 1, 2, 8, 3)
    assert np.all(top_p[..., 0] >= top_p[..., 1]) and np.all(top_p[..., 1] >= top_p[..., 2])
    assert np.array_equal(top_p[..., 0], probs.max(-1))
    nxt = np.concatenate([TOKENS[:, 1:], TOKENS[:, :1]], axis=1)  # [batch, pos] a target per position
    target_p = lens.prob(nxt)
    expected = np.take_along_axis(probs, np.broadcast_to(nxt[None, ..., None], (CFG.n_layers + 1, 2, 8, 1)), -1)[..., 0]
    assert np.all(np.abs(target_p - expected) <= gamma(4) * expected)  # exp(log p) vs p: a few roundings
    assert lens.prob(7).shape == (CFG.n_layers + 1, 2, 8)
    with pytest.raises(RefGPTError, match="target"):
        lens.prob(CFG.d_vocab)
    with pytest.raises(RefGPTError, match="k must be"):
        lens.top(0)


def test_tuned_lens_applies_h_plus_A_h_plus_b_before_ln_final(model, tmp_path):
    _, cache = model.run_with_cache(TOKENS)
    zero = {L: (np.zeros((12, 12)), np.zeros(12)) for L in range(CFG.n_layers)}
    assert np.array_equal(tuned_lens(cache, zero).logits, logit_lens(cache).logits)  # h + 0 = h exactly
    rng = np.random.default_rng(1)
    translators = {L: (0.1 * rng.standard_normal((12, 12)), rng.standard_normal(12)) for L in range(CFG.n_layers)}
    tuned = tuned_lens(cache, translators)
    p = model.params
    for L in range(CFG.n_layers):
        A, b = translators[L]
        h = cache["resid_pre", L]  # [batch, pos, d_model]
        y = layer_norm(h + h @ A.T + b, p["ln_final.w"], p["ln_final.b"], CFG.eps)  # A·h: A acts on column vectors
        expected = y @ p["unembed.W_U"] + p["unembed.b_U"]
        assert np.max(np.abs(tuned.logits[L] - expected)) <= unembed_allowance(model, y)
    assert np.array_equal(tuned.logits[-1], logit_lens(cache).logits[-1])  # the final stream is untranslated
    path = save_translators(tmp_path / "lens.safetensors", translators)
    assert np.array_equal(tuned_lens(cache, path).logits, tuned.logits)
    assert np.array_equal(tuned_lens(cache, str(path)).logits, tuned.logits)


def test_translator_files_with_missing_or_misshaped_tensors_are_refused(model, tmp_path):
    good = {L: (np.zeros((12, 12)), np.zeros(12)) for L in range(CFG.n_layers)}
    save_translators(tmp_path / "short.safetensors", {L: good[L] for L in range(2)})
    with pytest.raises(RefGPTError, match=r"short.safetensors: no translator for layer 2"):
        load_translators(tmp_path / "short.safetensors", model)
    save_translators(tmp_path / "shape.safetensors", {**good, 1: (np.zeros((12, 11)), np.zeros(12))})
    with pytest.raises(RefGPTError, match=r"layer_translators\.1\.weight is float64 \[12, 11\]"):
        load_translators(tmp_path / "shape.safetensors", model)
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    with pytest.raises(RefGPTError, match="junk.safetensors"):
        load_translators(tmp_path / "junk.safetensors", model)
    with pytest.raises(RefGPTError, match="not found"):
        load_translators(tmp_path / "none.safetensors", model)
    _, cache = model.run_with_cache(TOKENS)
    with pytest.raises(RefGPTError, match="no translator for layer 0"):
        tuned_lens(cache, {})


def test_least_squares_translators_minimise_the_squared_error_to_the_final_stream(model):
    rng = np.random.default_rng(4)
    caches = [model.run_with_cache(rng.integers(0, CFG.d_vocab, (3, 10)))[1] for _ in range(2)]  # 60 samples
    translators = fit_least_squares_translators(caches)
    x = np.concatenate([streams(c).reshape(CFG.n_layers + 1, -1, 12) for c in caches], axis=1)

    def sq_error(L, A, b):
        return float(np.sum((x[L] + x[L] @ A.T + b - x[-1]) ** 2))

    for L, (A, b) in translators.items():
        assert A.shape == (12, 12) and b.shape == (12,)
        best = sq_error(L, A, b)
        assert best <= sq_error(L, np.zeros((12, 12)), np.zeros(12))  # no worse than the identity
        for _ in range(5):  # every perturbation makes it worse: the normal equations hold
            dA, db = 1e-3 * rng.standard_normal((12, 12)), 1e-3 * rng.standard_normal(12)
            assert sq_error(L, A + dA, b + db) > best
    few = fit_least_squares_translators(caches[0])  # 30 samples > 13 unknowns per column: still a fit
    assert set(few) == set(range(CFG.n_layers))
    with pytest.raises(RefGPTError, match="no caches"):
        fit_least_squares_translators([])
