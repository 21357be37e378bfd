"""refgpt/oracle/sequential.py: GPT-2 with every sum in index order, the golden's second float32 pass.

In float64 it is GPT-2: every tensor of a golden file, forward and backward, padded or not, within
the float64 profile of refgpt's own. In float32 it errs as a port written in loops does, a whole row
at a time, and the golden's c_X, r_X and f_X are the larger of its errors and refgpt's own."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from random_models import model_and_tokens
from refgpt import Config, Model, load_default
from refgpt.oracle import comparison as oracle
from refgpt.oracle import golden, sequential


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mt=model_and_tokens(), own_targets=st.booleans())
def test_in_float64_it_computes_every_golden_tensor(mt, own_targets):
    model, tokens = mt
    if tokens.shape[1] < 2:
        tokens = np.concatenate([tokens, tokens], axis=1)[:, : model.cfg.n_ctx]
    if tokens.shape[1] < 2:
        return
    targets = np.roll(tokens, 1, axis=1) if own_targets else None
    g = golden.make(model, tokens, targets=targets, backward=True)
    twin = sequential.compute(model.cfg, model.params, tokens, targets, backward=True, dtype="float64")
    missing = [n for n in g.tensors if n not in twin]
    assert not missing
    report = oracle.compare(g, {n: twin[n] for n in g.tensors}, profile="float64")
    assert report.ok, report.table()


def test_padded_forward_in_float64_is_the_models():
    cfg = Config(d_model=16, n_layers=2, n_heads=2, d_mlp=32, d_vocab=30, n_ctx=8)
    from random_models import random_model

    model = random_model(cfg, seed=2)
    tokens = np.random.default_rng(0).integers(0, 30, (3, 6))
    mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]])
    logits, cache = model.run_with_cache(tokens, attention_mask=mask)
    twin = sequential.compute(cfg, model.params, tokens, attention_mask=mask, dtype="float64")
    real = mask == 1
    np.testing.assert_allclose(twin["logits"][real], logits[real], rtol=1e-12, atol=1e-12)
    for name in ("blocks.1.attn.hook_pattern", "hook_pos_embed", "blocks.1.hook_resid_post"):
        np.testing.assert_allclose(twin[name], cache[name], rtol=1e-12, atol=1e-12, err_msg=name)


def test_sums_run_in_index_order():
    x = np.array([[1.0, 2.0**-24, 2.0**-24, 2.0**-24]], np.float32)  # each small term is lost one at a time
    assert sequential.sequential_sum(x)[0, 0] == np.float32(1.0)  # 1 + 2⁻²⁴ rounds to 1, three times
    assert sequential.sequential_sum(x[:, ::-1].copy())[0, 0] == np.float32(1.0 + 2.0**-22)  # small ones first: kept


@pytest.mark.slow
def test_the_golden_error_model_is_the_larger_of_both_orders():
    """On the trained model with random tokens (flat predictions: the vocabulary softmax sums 8,192
    similar terms) the sequential pass's row factors are far larger than refgpt's pairwise ones,
    and the golden's f_X and r_X are the sequential pass's."""
    m0 = load_default()
    model = Model(m0.cfg, {k: np.asarray(v, np.float32).astype(np.float64) for k, v in m0.params.items()})
    tokens = np.random.default_rng(1).integers(0, model.cfg.d_vocab, (1, 32))
    g = golden.make(model, tokens, backward=True)
    ref = golden.compute(model, tokens, backward=True)
    f32 = golden.compute(golden.float32_twin(model), tokens, backward=True)
    errors = golden.ErrorModel()
    for name in ("grad.ln_final.w", "log_probs"):
        errors.add(name, ref[name], f32[name])
    twin = sequential.compute(model.cfg, golden.float32_twin(model).params, tokens, backward=True)
    p = np.exp(ref["log_probs"])
    factor = golden.float32_error("probs", p, twin["probs"])[2]
    own = golden.float32_error("probs", p, np.exp(f32["log_probs"].astype(np.float64)))[2]
    assert factor > 4 * own and g.row_freedom["probs"] == pytest.approx(factor)
    assert g.error_rms["grad.ln_final.w"] > 2 * errors.rms["grad.ln_final.w"]
    assert "sequential" in g.metadata["error_model"]
