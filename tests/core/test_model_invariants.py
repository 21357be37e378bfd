"""What must hold of any GPT-2 forward pass, whatever its weights: property tests over random models."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from random_models import model_and_tokens, rel_err

EXACT = 1e-12  # float64: rounding only, relative to max(1, max|ref|)


@settings(max_examples=40, deadline=None)
@given(model_and_tokens(), st.data())
def test_causal_prefix_invariance(model_tokens, data):
    """A position's logits depend only on tokens at or before it: a prefix gives the same logits."""
    model, tokens = model_tokens
    cut = data.draw(st.integers(1, tokens.shape[1]))
    assert rel_err(model(tokens[:, :cut]), model(tokens)[:, :cut]) <= EXACT


@settings(max_examples=40, deadline=None)
@given(model_and_tokens())
def test_batch_invariance(model_tokens):
    """Each sequence of a batch gets the logits it gets alone; [pos] input gives [pos, d_vocab]."""
    model, tokens = model_tokens
    batched = model(tokens)
    for i, row in enumerate(tokens):
        alone = model(row)
        assert alone.shape == (tokens.shape[1], model.cfg.d_vocab)
        assert rel_err(alone, batched[i]) <= EXACT


@settings(max_examples=40, deadline=None)
@given(model_and_tokens())
def test_residual_stream_is_a_running_sum(model_tokens):
    """resid_pre(0) = embed + pos_embed; resid_mid = resid_pre + attn_out; resid_post = resid_mid + mlp_out."""
    model, tokens = model_tokens
    _, cache = model.run_with_cache(tokens)
    np.testing.assert_array_equal(cache["resid_pre", 0], cache["hook_embed"] + cache["hook_pos_embed"])
    for L in range(model.cfg.n_layers):
        np.testing.assert_array_equal(cache["resid_mid", L], cache["resid_pre", L] + cache["attn_out", L])
        np.testing.assert_array_equal(cache["resid_post", L], cache["resid_mid", L] + cache["mlp_out", L])
        assert rel_err(cache["resid_post", L], cache["resid_pre", L] + cache["attn_out", L] + cache["mlp_out", L]) <= EXACT
        if L + 1 < model.cfg.n_layers:
            np.testing.assert_array_equal(cache["resid_pre", L + 1], cache["resid_post", L])


@settings(max_examples=40, deadline=None)
@given(model_and_tokens())
def test_attention_pattern_rows_sum_to_one_and_mask_is_exact(model_tokens):
    """Every pattern row sums to 1; entries above the diagonal are exactly 0 and their scores −∞."""
    model, tokens = model_tokens
    _, cache = model.run_with_cache(tokens)
    pos = tokens.shape[1]
    above = np.triu(np.ones((pos, pos), dtype=bool), k=1)
    for L in range(model.cfg.n_layers):
        pattern, scores = cache["pattern", L], cache["attn_scores", L]
        assert np.all(np.abs(pattern.sum(-1) - 1) <= pos * np.finfo(pattern.dtype).eps)
        assert np.all(pattern[..., above] == 0.0)
        assert np.all(scores[..., above] == -np.inf) and np.all(np.isfinite(scores[..., ~above]))


@settings(max_examples=40, deadline=None)
@given(model_and_tokens())
def test_logits_are_final_layernorm_output_times_unembedding(model_tokens):
    """logits = (w ⊙ ln_final.hook_normalized + b)·W_U, and hook_normalized = (x − mean)/scale."""
    model, tokens = model_tokens
    logits, cache = model.run_with_cache(tokens)
    p = model.params
    final = cache["ln_final.hook_normalized"] * p["ln_final.w"] + p["ln_final.b"]
    np.testing.assert_array_equal(final @ p["unembed.W_U"], logits)
    x = cache["resid_post", -1]
    np.testing.assert_array_equal(cache["ln_final.hook_mean"], x.mean(-1, keepdims=True))
    assert rel_err(cache["ln_final.hook_normalized"],
                   (x - cache["ln_final.hook_mean"]) / cache["ln_final.hook_scale"]) <= EXACT
    assert rel_err(cache["ln_final.hook_scale"], np.sqrt(x.var(-1, keepdims=True) + model.cfg.eps)) <= EXACT


@settings(max_examples=20, deadline=None)
@given(model_and_tokens())
def test_float32_stays_float32_end_to_end(model_tokens):
    """A float32 model computes every activation in float32: nothing promotes to float64."""
    model64, tokens = model_tokens
    from refgpt import Model

    model = Model(model64.cfg, dict(model64.params), dtype="float32")
    logits, cache = model.run_with_cache(tokens)
    assert logits.dtype == np.float32
    assert {a.dtype for a in cache.values()} == {np.dtype(np.float32)}


def test_return_types_loss_and_both():
    """return_type="loss" is the mean next-token loss alone; "both" is Output(logits, loss), the
    same logits and the same loss."""
    from random_models import random_model
    from refgpt import Config
    from refgpt.model import Output

    model = random_model(Config(d_model=8, n_layers=1, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6), seed=4)
    tokens = np.array([[1, 2, 3, 4]])
    loss = model(tokens, return_type="loss")
    both = model(tokens, return_type="both")
    assert np.ndim(loss) == 0 and not isinstance(loss, Output)
    assert isinstance(both, Output)
    assert np.array_equal(both.logits, model(tokens)) and both.loss == loss
    one = model(tokens[0], return_type="both")  # unbatched in, unbatched out: logits [pos, d_vocab]
    assert np.array_equal(one.logits, model(tokens[0])) and one.logits.ndim == 2 and one.loss == loss


@settings(max_examples=20, deadline=None)
@given(model_and_tokens())
def test_unembed_is_transformerlens_unembed_the_product_alone(model_tokens):
    """Issue 37: ``Model.unembed`` means what TransformerLens's ``model.unembed(x)`` means, x·W_U (+ b_U)
    with no ln_final; ln_final then unembed is ``logits_from_resid``. (Before, ``unembed`` applied
    ln_final and ``unembedding`` was the product: two names, two meanings, one of them not TL's.)"""
    model, tokens = model_tokens
    logits, cache = model.run_with_cache(tokens)
    p = model.params
    final = cache["ln_final.hook_normalized"] * p["ln_final.w"] + p["ln_final.b"]  # [batch, pos, d_model]
    np.testing.assert_array_equal(model.unembed(final), logits)
    resid = cache["resid_post", -1]  # [batch, pos, d_model]
    np.testing.assert_array_equal(model.unembed(resid), resid @ p["unembed.W_U"] + p.get("unembed.b_U", 0))
    from refgpt.tl.hooks import HookRun

    np.testing.assert_array_equal(model.logits_from_resid(resid, HookRun(model.hook_dict, [])), logits)
    assert not hasattr(model, "unembedding")
