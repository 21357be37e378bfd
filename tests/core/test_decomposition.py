"""refgpt's TransformerLens-named decomposition API: what holds without TransformerLens.

tests/core/test_decomposition_tl.py checks the values against TL 3.9 itself; here: the stacks add up
to the stream they decompose (to ≤ 1e-12 relative, where TL's "bias" row is summed in float32),
what they sum to through W_U (docs/decomposition.md §5), and where refgpt departs from TL on
purpose.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from random_models import model_and_tokens, random_model, rel_err
from refgpt import Config, Model, RefGPTError
from refgpt.tl.processing import process

TOL = 1e-12


def stream_into(cache, n_layers, layer, mlp_input=False):
    """The residual stream entering ``layer`` (its MLP, if mlp_input): [batch, pos, d_model]."""
    if layer == n_layers:
        return cache[f"blocks.{n_layers - 1}.hook_resid_post"]
    return cache[f"blocks.{layer}.hook_resid_{'mid' if mlp_input else 'pre'}"]


layers = st.tuples(model_and_tokens(), st.integers(0, 3), st.booleans(), st.booleans())


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(layers)
def test_full_resid_decomposition_sums_to_the_stream(drawn):
    """§5: heads + neurons (or mlp_outs) + embed + pos_embed + bias = the stream entering layer."""
    (model, tokens), layer, mlp_input, expand = drawn
    n = model.cfg.n_layers
    layer = min(layer, n - 1 if mlp_input else n)
    _, cache = model.run_with_cache(tokens)
    stack = cache.get_full_resid_decomposition(layer, mlp_input=mlp_input, expand_neurons=expand)
    stream = stream_into(cache, n, layer, mlp_input)
    assert rel_err(stack.sum(0), stream) <= TOL
    normalised = cache.get_full_resid_decomposition(layer, mlp_input=mlp_input, expand_neurons=expand, apply_ln=True)
    ln = "ln_final" if layer == n else f"blocks.{layer}.ln{2 if mlp_input else 1}"
    assert rel_err(normalised.sum(0), cache[ln + ".hook_normalized"]) <= TOL  # P·x/σ: the view is linear


@settings(max_examples=40, deadline=None)
@given(layers)
def test_remainders_complete_the_stream(drawn):
    """§5: heads + "remainder" and neurons + "remainder" = the stream entering layer (layer 0 too)."""
    (model, tokens), layer, _, _ = drawn
    n = model.cfg.n_layers
    layer = min(layer, n)
    _, cache = model.run_with_cache(tokens)
    stream = stream_into(cache, n, layer)
    assert rel_err(cache.stack_head_results(layer, incl_remainder=True).sum(0), stream) <= TOL
    assert rel_err(cache.stack_neuron_results(layer, incl_remainder=True).sum(0), stream) <= TOL


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(model_and_tokens(), st.booleans(), st.integers(0, 2**32 - 1))
def test_projection_inside_layernorm_equals_projection_after(model_tokens, mlp_input, seed):
    """§5: with apply_ln and project_output_onto every row, neurons included, is LN'd with the
    same scale and then projected; TL's fused neuron path uses ln1's scale even for mlp_input."""
    model, tokens = model_tokens
    layer = model.cfg.n_layers - 1 if mlp_input else model.cfg.n_layers
    _, cache = model.run_with_cache(tokens)
    project = np.random.default_rng(seed).standard_normal((model.cfg.d_model, 2))
    fused = cache.get_full_resid_decomposition(layer, mlp_input=mlp_input, apply_ln=True, project_output_onto=project)
    after = cache.get_full_resid_decomposition(layer, mlp_input=mlp_input, apply_ln=True) @ project
    assert rel_err(fused, after) <= TOL
    # Without apply_ln, the rows are projected as they are (no LayerNorm on the way).
    raw = cache.get_full_resid_decomposition(layer, mlp_input=mlp_input, project_output_onto=project)
    assert rel_err(raw, cache.get_full_resid_decomposition(layer, mlp_input=mlp_input) @ project) <= TOL


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(model_and_tokens(), st.integers(0, 2**32 - 1))
def test_stacks_reach_the_logits_only_once_ln_final_is_folded(model_tokens, seed):
    """§5 (TL issue #523): Σ_i (P·c_i/σ)·W_U + b_U = logits needs ln_final's w and b in W_U and
    b_U (fold_ln). On raw weights the same stack needs w ⊙ … and + ln_final.b·W_U added back."""
    model, tokens = model_tokens
    assume(model.cfg.d_model >= 2)
    rng = np.random.default_rng(seed)
    model = Model(model.cfg, {**model.params, "unembed.b_U": rng.standard_normal(model.cfg.d_vocab)})
    p = model.params
    logits, cache = model.run_with_cache(tokens)
    stack = cache.get_full_resid_decomposition(apply_ln=True)  # [component, batch, pos, d_model]
    naive = (stack @ p["unembed.W_U"]).sum(0) + p["unembed.b_U"]
    exact = ((stack * p["ln_final.w"]) @ p["unembed.W_U"]).sum(0) + p["ln_final.b"] @ p["unembed.W_U"] + p["unembed.b_U"]
    assert rel_err(exact, logits) <= TOL
    assert rel_err(naive, logits) > 1e6 * TOL  # not a rounding-size miss
    folded = process(model, ["fold_ln"])
    logits, cache = folded.run_with_cache(tokens)
    stack = cache.get_full_resid_decomposition(apply_ln=True)
    assert rel_err((stack @ folded.params["unembed.W_U"]).sum(0) + folded.params["unembed.b_U"], logits) <= TOL
    t = int(rng.integers(model.cfg.d_vocab))
    missing_b_U = logits[..., t] - folded.params["unembed.b_U"][t]
    assert rel_err(cache.logit_attrs(cache.get_full_resid_decomposition(), t).sum(0), missing_b_U) <= TOL


def test_layer_zero_remainder_is_the_embedding():
    """§5: a departure from TL 3.9, whose layer-0 remainder is the final stream: here it is
    embed + pos_embed, what enters block 0."""
    cfg = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)
    _, cache = random_model(cfg).run_with_cache(np.array([[1, 2, 3]]))
    stack, labels = cache.stack_head_results(0, incl_remainder=True, return_labels=True)
    assert labels == ["remainder"]
    assert np.array_equal(stack[0], cache["hook_embed"] + cache["hook_pos_embed"])


def test_int_neuron_slice_keeps_the_neuron_axis():
    """§5: a departure from TL 3.9, which concatenates one neuron's results along positions."""
    cfg = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)
    _, cache = random_model(cfg).run_with_cache(np.array([[1, 2, 3]]))
    stack, labels = cache.stack_neuron_results(2, neuron_slice=5, return_labels=True)
    assert labels == ["L0N5", "L1N5"] and stack.shape == (2, 1, 3, 8)


def test_layer_minus_one_or_none_is_the_unembedding_and_layer_zero_is_empty():
    """As TransformerLens: layer None or -1 means n_layers; layer 0 stacks nothing, in the
    projection's width when one is given."""
    cfg = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)
    _, cache = random_model(cfg).run_with_cache(np.array([[1, 2, 3]]))
    full = cache.stack_neuron_results(2)
    assert np.array_equal(cache.stack_neuron_results(-1), full) and np.array_equal(cache.stack_neuron_results(None), full)
    assert cache.stack_neuron_results(0, project_output_onto=np.ones((8, 3))).shape == (0, 1, 3, 3)
    with pytest.raises(RefGPTError, match=r"stack_neuron_results: layer must be in \[0, 2\]"):
        cache.stack_neuron_results(3)


def test_accumulated_bias_of_the_unembedding_has_no_mlp_input():
    from refgpt.tl.decomposition import accumulated_bias

    model = random_model(Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6))
    assert accumulated_bias(model, 2).shape == (8,)
    with pytest.raises(RefGPTError, match="mlp_input=True needs a layer below n_layers=2"):
        accumulated_bias(model, 2, mlp_input=True)


@pytest.mark.parametrize("call, message", [
    (lambda c: c.accumulated_resid(7), "layer must be in"),
    (lambda c: c.decompose_resid(mode="heads"), "mode"),
    (lambda c: c.decompose_resid(mlp_input=True), "mlp_input"),
    (lambda c: c.get_full_resid_decomposition(mlp_input=True), "mlp_input"),
    (lambda c: c.stack_head_results(pos_slice="last"), "pos_slice"),
    (lambda c: c.logit_attrs(c.decompose_resid(), 3, incorrect_tokens=[1, 2]), "same shape"),
    (lambda c: c.logit_attrs(c.decompose_resid(), 11), "outside the vocabulary"),
    (lambda c: c.logit_attrs(c.decompose_resid(), -1), "id -1 is outside the vocabulary"),
    (lambda c: c.logit_attrs(c.decompose_resid(), 3.0), "must be integers, found float64"),
    (lambda c: c.logit_attrs(c.decompose_resid(), np.array([1.0, 2.0])), "must be integers, found float64"),
    (lambda c: c.logit_attrs(c.decompose_resid(), True), "must be integers, found bool"),
    (lambda c: c.logit_attrs(c.decompose_resid(), "a"), "'a' is text, but this model has no tokenizer"),
    (lambda c: c.stack_head_results(pos_slice=[0.5]), "an index list must be 1-D integers"),
    (lambda c: c.stack_head_results(pos_slice=[[0, 1]]), "an index list must be 1-D integers"),
])
def test_bad_arguments_are_refgpt_errors(call, message):
    cfg = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)
    _, cache = random_model(cfg).run_with_cache(np.array([[1, 2, 3]]))
    with pytest.raises(RefGPTError, match=message):
        call(cache)


def test_token_zero_is_a_token():
    """Ids run from 0: logit_attrs of token 0 is each row through ln_final's scale, dotted with W_U[:, 0]."""
    cfg = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)
    model = random_model(cfg)
    _, cache = model.run_with_cache(np.array([[1, 2, 3]]))
    stack = cache.decompose_resid()  # [component, batch, pos, d_model]
    expected = cache.apply_ln_to_stack(stack) @ model.params["unembed.W_U"][:, 0]  # [component, batch, pos]
    assert rel_err(cache.logit_attrs(stack, 0), expected) <= TOL  # d_model products, summed in another order
    assert np.array_equal(cache.logit_attrs(stack, [0, 0, 0]), cache.logit_attrs(stack, np.zeros((1, 3), int)))


def test_token_id_is_one_token_given_as_an_id_or_as_text():
    from refgpt.tl.decomposition import token_id
    from refgpt.gpt2.tokenizer import Tokenizer, bytes_to_unicode

    cfg = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=12, d_vocab=257, n_ctx=6)
    model = random_model(cfg)
    model.tokenizer = Tokenizer({ch: b for b, ch in bytes_to_unicode().items()} | {"<|endoftext|>": 256}, [])
    assert token_id(model, 3) == 3 and token_id(model, [[3]]) == 3 and token_id(model, "a") == 97
    assert token_id(model, "<|endoftext|>") == 256
    with pytest.raises(RefGPTError, match=r"token: 'ab' is 2 tokens \[97, 98\], not exactly one"):
        token_id(model, "ab")
    with pytest.raises(RefGPTError, match=r"token: expected one token, found 2 \(\[3, 4\]\)"):
        token_id(model, [3, 4])
