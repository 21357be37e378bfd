"""Incremental decoding with a KV cache computes exactly what the full forward pass computes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from random_models import model_and_tokens, random_model, rel_err
from refgpt import Config, RefGPTError


@settings(max_examples=40, deadline=None)
@given(model_and_tokens(), st.data())
def test_incremental_logits_equal_full_forward(model_tokens, data):
    """Feeding the tokens in chunks through a KVCache gives the full forward's logits, ≤ 1e-12 relative."""
    model, tokens = model_tokens
    full = model(tokens)
    past = model.kv_cache(tokens.shape[0])
    start, pieces = 0, []
    while start < tokens.shape[1]:
        step = data.draw(st.integers(1, tokens.shape[1] - start))
        pieces.append(model(tokens[:, start:start + step], past=past))
        start += step
    assert past.length == tokens.shape[1]
    assert rel_err(np.concatenate(pieces, axis=1), full) <= 1e-12


@settings(max_examples=20, deadline=None)
@given(model_and_tokens())
def test_last_only_is_the_last_row(model_tokens):
    model, tokens = model_tokens
    # Not bit-identical: BLAS may order a one-row product's sums differently from a many-row one's.
    assert rel_err(model(tokens, last_only=True), model(tokens)[:, -1:]) <= 1e-12


def test_hooks_apply_during_incremental_steps():
    """A hook edits an incremental step as it edits the full pass; the cache sees the new positions only."""
    model = random_model(Config(d_model=8, n_layers=2, n_heads=2, d_mlp=8, d_vocab=11, n_ctx=8), seed=4)
    tokens = np.array([[1, 2, 3, 4, 5]])
    hook = [("blocks.1.hook_resid_pre", lambda a, n: a * 2)]
    full = model.run_with_hooks(tokens, fwd_hooks=hook)
    past = model.kv_cache()
    model.run_with_hooks(tokens[:, :3], fwd_hooks=hook, past=past)
    logits, cache = model.run_with_cache(tokens[:, 3:], fwd_hooks=hook, past=past)
    assert rel_err(logits, full[:, 3:]) <= 1e-12
    assert cache["resid_pre", 0].shape == (1, 2, 8) and cache["pattern", 0].shape == (1, 2, 2, 5)


def test_generate_greedy_and_seeded():
    model = random_model(Config(d_model=8, n_layers=2, n_heads=2, d_mlp=8, d_vocab=11, n_ctx=12), seed=5)
    prompt = np.array([1, 2, 3])
    greedy = model.generate(prompt, 5, temperature=0, stop_at_eos=False)
    # Greedy decoding = repeatedly appending the arg-max of a full forward pass.
    expected = prompt
    for _ in range(5):
        expected = np.append(expected, model(expected)[-1].argmax())
    np.testing.assert_array_equal(greedy, expected)
    a = model.generate(prompt, 6, temperature=1.0, top_k=3, seed=7, stop_at_eos=False)
    np.testing.assert_array_equal(a, model.generate(prompt, 6, temperature=1.0, top_k=3, seed=7, stop_at_eos=False))
    assert a.shape == (9,)
    with pytest.raises(RefGPTError, match="3 prompt tokens \\+ 10 new exceed n_positions=12"):
        model.generate(prompt, 10, stop_at_eos=False)
    with pytest.raises(RefGPTError, match="after 3 cached"):
        past = model.kv_cache()
        model(prompt, past=past)
        model(np.arange(10), past=past)


def test_a_hook_reads_where_its_rows_start_from_hook_start():
    """refgpt/tl/hooks.py: row 0 of a KV-cached step's activation is position ``hook.start``; a
    TransformerLens-style ``fn(activation, hook)`` reads it like ``hook.name``."""
    model = random_model(Config(d_model=8, n_layers=1, n_heads=2, d_mlp=8, d_vocab=11, n_ctx=10), seed=2)
    starts = []

    def hook(activation, hook):
        starts.append((hook.start, activation.shape[1]))

    past = model.kv_cache(1)
    for chunk in ([[1, 2, 3]], [[4]], [[5, 6]]):
        model.run_with_hooks(np.array(chunk), fwd_hooks=[("hook_embed", hook)], past=past)
    model.run_with_hooks(np.array([[1, 2]]), fwd_hooks=[("hook_embed", hook)])
    assert starts == [(0, 3), (3, 1), (4, 2), (0, 2)]


def test_a_kv_cache_pass_runs_every_block():
    """start_at_layer > 0 or stop_at_layer with a KV cache is refused (the cache holds every layer's
    keys); without a cache both work."""
    model = random_model(Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6), seed=3)
    tokens = np.array([[1, 2, 3]])
    resid = model(tokens, stop_at_layer=1)  # [batch, pos, d_model], entering block 1
    assert np.array_equal(model(resid, start_at_layer=1), model(tokens))
    for kwargs in ({"start_at_layer": 1}, {"stop_at_layer": 1}):
        past = model.kv_cache()
        with pytest.raises(RefGPTError, match="a pass with a KV cache runs every block"):
            model(resid if "start_at_layer" in kwargs else tokens, past_kv_cache=past, **kwargs)
        assert past.length == 0


def test_a_kv_cache_is_for_a_whole_number_of_sequences():
    model = random_model(Config(d_model=8, n_layers=1, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6), seed=3)
    assert model.kv_cache(1).batch == 1 and model.kv_cache(3).keys.shape[1] == 3
    for bad in (0, -1, True, 1.5, "2", None):
        with pytest.raises(RefGPTError, match=f"kv_cache: batch must be a whole number ≥ 1, found {bad!r}"):
            model.kv_cache(bad)
