"""refgpt.attribute: every logit split into labelled parts that sum to it, on any weights.

Derivations: docs/decomposition.md (§ cited per test). The contract: ``values.sum(0)`` equals the
model's logit for the target (or target − against) to ≤ 1e-12 relative in float64, at every
granularity, with or without weight processing, with or without b_U.
"""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from doc_pages import numbers_script
from random_models import model_and_tokens, random_model, rel_err
import refgpt
from refgpt import Config, Model, RefGPTError
from refgpt.analysis.attribution import (GRANULARITIES, attribute, naive_attribution, naive_hooks, required_hooks,
                                         value_bias)
from refgpt.gpt2.layernorm import layer_norm
from refgpt.tl.processing import STEPS, process
from refgpt.gpt2.tokenizer import Tokenizer, bytes_to_unicode

TOL = 1e-12


def with_b_U(model, seed):
    b_U = np.random.default_rng(seed).standard_normal(model.cfg.d_vocab)
    return Model(model.cfg, {**model.params, "unembed.b_U": b_U})


def picked(logits, t, a=None):
    """logits[..., t] (− logits[..., a]) with t, a ints or [batch, pos] arrays: [batch, pos]."""
    def one(ids):
        ids = np.broadcast_to(ids, logits.shape[:-1])
        return np.take_along_axis(logits, ids[..., None], -1)[..., 0]
    return one(t) if a is None else one(t) - one(a)


cases = st.tuples(model_and_tokens(), st.sampled_from(GRANULARITIES), st.booleans(), st.booleans(),
                  st.sets(st.sampled_from(STEPS)), st.integers(0, 2**32 - 1))


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(cases)
def test_attribution_sums_to_the_logit(case):
    """§2: Σ components = logit_t (or logit_t − logit_a), ≤ 1e-12, on raw or processed weights."""
    (model, tokens), granularity, against, bias, steps, seed = case
    model = with_b_U(model, seed) if bias else model
    model = process(model, steps)
    rng = np.random.default_rng(seed)
    logits, cache = model.run_with_cache(tokens)
    V = model.cfg.d_vocab
    t = int(rng.integers(V))
    a = int(rng.integers(V)) if against else None
    result = attribute(cache, t, a, granularity=granularity)
    assert rel_err(result.total, picked(logits, t, a)) <= TOL
    assert result.check(relative=True) <= TOL  # against the logit recomputed from the cache
    per_position = rng.integers(V, size=tokens.shape)  # one target per [batch, pos]
    result = attribute(cache, per_position, a, granularity=granularity, logits=logits)
    assert rel_err(result.total, picked(logits, per_position, a)) <= TOL
    assert ("b_U" in result.labels) == ("unembed.b_U" in model.params)


@settings(max_examples=30, deadline=None)
@given(model_and_tokens(), st.integers(0, 2**32 - 1))
def test_granularities_nest(model_tokens, seed):
    """§2: heads (with their b_V shares) add up to the layer's attention, neurons to its MLP."""
    model, tokens = model_tokens
    _, cache = model.run_with_cache(tokens)
    t = int(np.random.default_rng(seed).integers(model.cfg.d_vocab))
    layer, head, neuron = (attribute(cache, t, granularity=g) for g in GRANULARITIES)
    for L in range(model.cfg.n_layers):
        heads = [f"L{L}H{h}" for h in range(model.cfg.n_heads)]
        assert rel_err(sum(head[h] for h in heads), layer[f"L{L}.attn"]) <= TOL
        assert rel_err(sum(head[h + ".b_V"] for h in heads), layer[f"L{L}.b_V"]) <= TOL
        assert rel_err(sum(neuron[f"L{L}N{n}"] for n in range(model.cfg.d_mlp)), head[f"L{L}.mlp"]) <= TOL
        for name in (f"L{L}.b_O", f"L{L}.b_out"):
            assert np.array_equal(layer[name], neuron[name])


@settings(max_examples=30, deadline=None)
@given(model_and_tokens())
def test_value_bias_reaches_the_stream_as_a_constant(model_tokens):
    """§2: v = (w ⊙ x̂)·W_V + b_V with b_V = b_V + ln1.b·W_V, and z = A·(w ⊙ x̂)·W_V + 1·b_V
    because each pattern row sums to 1; so b_V·W_O is a constant: its attribution times σ is the
    same at every position."""
    model, tokens = model_tokens
    _, cache = model.run_with_cache(tokens)
    p = model.params
    for L in range(model.cfg.n_layers):
        b_V = value_bias(p, L)  # [head, d_head]
        x_hat = cache[f"blocks.{L}.ln1.hook_normalized"] * p[f"blocks.{L}.ln1.w"]  # [batch, pos, d_model]
        v = np.einsum("bpd,hde->bhpe", x_hat, p[f"blocks.{L}.attn.W_V"])  # [batch, head, pos, d_head]
        moving = (cache[f"blocks.{L}.attn.hook_pattern"] @ v).transpose(0, 2, 1, 3)  # [batch, pos, head, d_head]
        assert rel_err(cache[f"blocks.{L}.attn.hook_z"] - moving, np.broadcast_to(b_V, moving.shape)) <= TOL
    result = attribute(cache, 0, granularity="head")
    sigma = cache["ln_final.hook_scale"][..., 0]  # [batch, pos]
    for h in range(model.cfg.n_heads):
        share = result[f"L0H{h}.b_V"] * sigma  # [batch, pos]
        assert rel_err(share, np.full_like(share, share[0, 0])) <= TOL


@settings(max_examples=30, deadline=None)
@given(model_and_tokens(), st.integers(0, 2**32 - 1))
def test_projecting_first_equals_expanding_first(model_tokens, seed):
    """§2: c·P(w ⊙ W_U[:,t])/σ equals (w ⊙ P·c/σ)·W_U[:,t] computed from the full [d_model] pieces
    (TransformerLens-style stacks through the cached scale), head by head and neuron by neuron."""
    model, tokens = model_tokens
    _, cache = model.run_with_cache(tokens)
    t = int(np.random.default_rng(seed).integers(model.cfg.d_vocab))
    p = model.params
    direction = p["ln_final.w"] * p["unembed.W_U"][:, t]  # [d_model]
    result = attribute(cache, t, granularity="neuron")
    heads, labels = cache.stack_head_results(apply_ln=True, return_labels=True)  # [head, batch, pos, d_model]
    b_V = np.concatenate([[value_bias(p, L)[h] @ p[f"blocks.{L}.attn.W_O"][h] for h in range(model.cfg.n_heads)]
                          for L in range(model.cfg.n_layers)])  # [layer·head, d_model]
    shares = cache.apply_ln_to_stack(np.broadcast_to(b_V[:, None, None], heads.shape))  # [head, batch, pos, d_model]
    for i, label in enumerate(labels):
        assert rel_err(result[label], (heads[i] - shares[i]) @ direction) <= TOL
        assert rel_err(result[label + ".b_V"], shares[i] @ direction) <= TOL
    neurons, labels = cache.stack_neuron_results(-1, apply_ln=True, return_labels=True, project_output_onto=direction)
    for i, label in enumerate(labels):
        assert rel_err(result[label], neurons[i]) <= TOL


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(model_and_tokens(), st.integers(0, 2**32 - 1))
def test_processing_moves_only_constants(model_tokens, seed):
    """§3: fold_ln, center_writing_weights, fold_value_biases and refactoring leave every
    input-dependent component's attribution unchanged; ln_final.b moves into b_U and each b_V
    share into b_O. center_unembed shifts every component by an amount that does not depend on
    the target, so attributions of a difference target − against are unchanged by it too."""
    model, tokens = model_tokens
    model = with_b_U(model, seed)
    rng = np.random.default_rng(seed)
    t, a = (int(i) for i in rng.integers(model.cfg.d_vocab, size=2))
    _, cache = model.run_with_cache(tokens)
    steps = [s for s in STEPS if s != "center_unembed"]
    _, new_cache = process(model, steps).run_with_cache(tokens)
    old, new = attribute(cache, t, granularity="neuron"), attribute(new_cache, t, granularity="neuron")
    assert old.labels == new.labels
    moved = {"ln_final.b", "b_U"} | {x for x in old.labels if x.endswith((".b_V", ".b_O"))}
    for label in old.labels:
        if label not in moved:
            assert rel_err(new[label], old[label]) <= TOL, label
    assert not new["ln_final.b"].any() and rel_err(new["b_U"], old["b_U"] + old["ln_final.b"]) <= TOL
    for L in range(model.cfg.n_layers):
        shares = [f"L{L}H{h}.b_V" for h in range(model.cfg.n_heads)]
        assert all(np.allclose(new[s], 0, rtol=0, atol=TOL) for s in shares)
        assert rel_err(new[f"L{L}.b_O"], old[f"L{L}.b_O"] + sum(old[s] for s in shares)) <= TOL
    _, all_cache = process(model, True).run_with_cache(tokens)
    old, new = attribute(cache, t, a, granularity="head"), attribute(all_cache, t, a, granularity="head")
    for label in old.labels:
        if label not in moved:
            assert rel_err(new[label], old[label]) <= TOL, label


def test_b_U_is_a_component_of_its_own():
    """§2: b_U[t] − b_U[a] at every position, labelled "b_U"; a model without b_U has no such row."""
    cfg = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)
    model = random_model(cfg, seed=5)
    tokens = np.array([[1, 2, 3], [4, 5, 6]])
    assert "b_U" not in attribute(model.run_with_cache(tokens)[1], 3).labels
    biased = with_b_U(model, 6)
    result = attribute(biased.run_with_cache(tokens)[1], 3, against=7)
    b_U = biased.params["unembed.b_U"]
    assert np.array_equal(result["b_U"], np.full((2, 3), b_U[3] - b_U[7]))
    assert result.labels[-2:] == ["ln_final.b", "b_U"]


def test_neuron_granularity_never_materialises_neurons_by_d_model():
    """§2: neuron attributions project W_out onto the target direction first: peak memory stays far
    below one [batch, pos, neuron, d_model] array (what expanding first would need per layer)."""
    cfg = Config(d_model=64, n_layers=2, n_heads=4, d_mlp=256, d_vocab=50, n_ctx=64)
    model = random_model(cfg, seed=7)
    tokens = np.random.default_rng(7).integers(0, cfg.d_vocab, (2, 64))
    logits, cache = model.run_with_cache(tokens, names=required_hooks(cfg, logits=False))
    expanded = 2 * 64 * cfg.d_mlp * cfg.d_model * 8  # bytes of [batch, pos, neuron, d_model], float64
    tracemalloc.start()
    result = attribute(cache, 3, granularity="neuron", logits=logits)
    result = attribute(cache, tokens, granularity="neuron", logits=logits)  # one direction per position
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert result.values.shape == (len(result.labels), 2, 64)
    assert peak < expanded / 4, f"peak {peak / 2**20:.1f} MiB vs {expanded / 2**20:.1f} MiB expanded"


def test_top_check_and_to_dict():
    cfg = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)
    model = random_model(cfg, seed=8)
    logits, cache = model.run_with_cache(np.array([[1, 2, 3, 4]]))
    result = attribute(cache, 5, granularity="head", logits=logits)
    top = result.top(4, pos=2)
    assert len(top) == 4 and all(abs(top[i][1]) >= abs(top[i + 1][1]) for i in range(3))
    assert top[0][1] == max(result.values[:, 0, 2], key=abs)
    assert result.check() <= TOL * max(1.0, float(np.abs(result.logit).max()))
    as_dict = json.loads(json.dumps(result.to_dict()))
    assert as_dict["labels"] == result.labels and as_dict["target"] == 5 and as_dict["against"] is None
    assert np.array_equal(np.array(as_dict["values"]), result.values)
    assert "components" in repr(result)


def test_check_is_the_largest_miss_relative_to_the_logit_or_to_one():
    """check(): max |Σ values − logit|; relative: divided by max(1, max |logit|), so small logits
    are not inflated and large ones scale it."""
    values = np.array([[[1.0, 2.0]], [[0.5, 0.0]]])  # [component, batch, pos]: Σ = [[1.5, 2.0]]
    large = refgpt.Attribution(["a", "b"], values, np.array([[1.0, 4.0]]), 5, None, "layer")
    assert large.check() == 2.0 and large.check(relative=True) == 0.5
    small = refgpt.Attribution(["a", "b"], values, np.array([[1.25, 1.75]]) / 2 ** 3, 5, None, "layer")
    assert small.check() == small.check(relative=True) == 2.0 - 1.75 / 8


def test_one_target_and_one_against_per_position_with_or_without_the_logits():
    """ids [batch, pos] for target and against: the sum is each position's own logit difference,
    checked against the logits given (3-D, or 2-D for one sequence) and against the cache's own."""
    cfg = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)
    model = with_b_U(random_model(cfg, seed=10), 10)
    logits, cache = model.run_with_cache(np.array([[1, 2, 3, 4, 5]]))
    rng = np.random.default_rng(10)
    t, a = rng.integers(11, size=(1, 5)), rng.integers(11, size=(1, 5))
    for given in (None, logits, logits[0], logits.tolist()):  # any array-like, as TL takes a tensor
        result = attribute(cache, t, a, granularity="neuron", logits=given)
        assert rel_err(result.logit, picked(logits, t, a)) <= TOL and result.check(relative=True) <= TOL
        assert rel_err(result.total, picked(logits, t, a)) <= TOL
    with pytest.raises(KeyError, match="'L9.attn' is not a component"):
        result["L9.attn"]


def test_text_targets_need_exactly_one_token():
    cfg = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=12, d_vocab=257, n_ctx=6)
    model = random_model(cfg, seed=9)
    encoder = {ch: b for b, ch in bytes_to_unicode().items()} | {"<|endoftext|>": 256}
    model.tokenizer = Tokenizer(encoder, [])
    _, cache = model.run_with_cache(np.array([[104, 105]]))
    assert attribute(cache, "a").target == 97
    assert attribute(cache, "<|endoftext|>", against="b").against == 98
    with pytest.raises(RefGPTError, match="2 tokens"):
        attribute(cache, "ab")


@pytest.mark.parametrize("call, message", [
    (lambda c: attribute(c, 3, granularity="heads"), "granularity"),
    (lambda c: attribute(c, 99), "outside the vocabulary"),
    (lambda c: attribute(c, np.zeros((3, 3), int)), "broadcast"),
    (lambda c: attribute(c, 2.5), "integers"),
    (lambda c: attribute(c, 3, logits=np.zeros((1, 2, 11))), "logits"),
])
def test_bad_input_is_a_refgpt_error(call, message):
    cfg = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)
    _, cache = random_model(cfg).run_with_cache(np.array([[1, 2, 3]]))
    with pytest.raises(RefGPTError, match=message):
        call(cache)


def test_a_partial_cache_names_what_is_missing():
    cfg = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)
    model = random_model(cfg)
    _, cache = model.run_with_cache(np.array([[1, 2]]), names=["hook_embed"])
    with pytest.raises(RefGPTError, match="required_hooks"):
        attribute(cache, 3)
    _, cache = model.run_with_cache(np.array([[1, 2]]), names=required_hooks(cfg))
    assert attribute(cache, 3).check(relative=True) <= TOL


def test_float32_models_attribute_in_float32():
    cfg = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)
    _, cache = random_model(cfg, dtype="float32").run_with_cache(np.array([[1, 2, 3]]))
    for granularity in GRANULARITIES:
        assert attribute(cache, 3, 4, granularity=granularity).values.dtype == np.float32


def test_exported_from_the_package():
    assert refgpt.attribute is attribute and refgpt.Attribution.__name__ == "Attribution"


@pytest.mark.slow
def test_every_number_on_the_page_comes_from_the_script():
    """docs/decomposition.md quotes each N row of docs/make_decomposition_numbers.py as it prints it
    (bounds: the measurement stays below the stated power of ten), and quotes no other row."""
    import re

    script, page = numbers_script()
    rows = script.numbers()
    assert script.check_page(rows, page) == []
    tags = set(re.findall(r"\((N\d+|T\d+)\b", page))
    quoted = {name for name, (kind, _) in rows.items() if kind != "line"}  # table lines carry no tag
    assert tags == quoted | {"T1", "T2"}  # the T rows: tests/core/test_decomposition_tl.py


@pytest.mark.parametrize("seed", [3, 4])
def test_naive_attribution_is_each_piece_by_its_own_scale_beside_the_exact_one(seed):
    """§1 as numbers: each naive piece is LN(c) (own σ, no bias) read by W_U, the exact pieces are
    attribute()'s layer components regrouped by the stream's pieces and sum to the logit (≤ TOL
    relative, the module's contract), and the constants are the same on both sides."""
    cfg = Config(d_model=16, n_layers=2, n_heads=4, d_mlp=24, d_vocab=40, n_ctx=16)
    model = with_b_U(random_model(cfg, seed=seed, scale=0.5), seed)
    tokens = np.random.default_rng(seed).integers(0, cfg.d_vocab, size=(2, 7))  # [batch, pos]
    logits, cache = model.run_with_cache(tokens)
    t, a, b, pos = 5, 9, 1, 4
    naive = naive_attribution(cache, t, a, pos=pos, batch=b, logits=logits)
    assert naive.labels == ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out",
                            "ln_final.b", "b_U"]
    p = model.params
    d = p["unembed.W_U"][:, t] - p["unembed.W_U"][:, a]  # [d_model]
    pieces, _ = cache.decompose_resid(return_labels=True)  # [piece, batch, pos, d_model]
    zero = np.zeros(cfg.d_model)
    alone = layer_norm(pieces[:, b, pos], p["ln_final.w"], zero, cfg.eps) @ d  # [piece]
    assert rel_err(naive.naive[:-2], alone) <= TOL
    exact = attribute(cache, t, a, granularity="layer", logits=logits)
    column = {label: exact[label][b, pos] for label in exact.labels}
    grouped = [column["embed"], column["pos_embed"]]
    for L in range(cfg.n_layers):
        grouped += [column[f"L{L}.attn"] + column[f"L{L}.b_V"] + column[f"L{L}.b_O"],
                    column[f"L{L}.mlp"] + column[f"L{L}.b_out"]]
    assert rel_err(naive.exact[:-2], np.array(grouped)) <= TOL
    assert naive.naive[-2:].tolist() == naive.exact[-2:].tolist() == [column["ln_final.b"], column["b_U"]]
    assert naive.logit == logits[b, pos, t] - logits[b, pos, a]
    assert abs(naive.exact_sum - naive.logit) <= TOL * max(1.0, abs(naive.logit))
    assert naive.scale == cache["ln_final.hook_scale"][b, pos, 0]
    assert np.isnan(naive.own_scale[-2:]).all() and (naive.own_scale[:-2] > 0).all()
    # the cache naive_hooks names is enough, and without the logits the logit is recomputed
    _, small = model.run_with_cache(tokens, names=naive_hooks(cfg) + ["ln_final.hook_normalized"])
    again = naive_attribution(small, t, a, pos=pos, batch=b)
    assert rel_err(again.naive, naive.naive) == 0.0 and abs(again.logit - naive.logit) <= TOL * max(1.0, abs(naive.logit))
    with pytest.raises(RefGPTError, match="outside the cache"):
        naive_attribution(cache, t, pos=7)
    with pytest.raises(RefGPTError, match="hook_attn_out"):
        naive_attribution(model.run_with_cache(tokens, names=required_hooks(cfg))[1], t)
