"""Hooks see and edit every activation; the cache holds exactly what was asked for, read-only."""

from __future__ import annotations

import numpy as np
import pytest

from random_models import random_model
from refgpt import Config, RefGPTError, act_name

CFG = Config(d_model=12, n_layers=3, n_heads=3, d_mlp=20, d_vocab=17, n_ctx=8)
TOKENS = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, seed=7)


def test_full_cache_has_every_hook_point_with_tl_shapes(model):
    logits, cache = model.run_with_cache(TOKENS)
    assert list(cache) == model.hook_names
    b, p, d, h, dh = 2, 5, CFG.d_model, CFG.n_heads, CFG.d_head
    shapes = {"hook_embed": (b, p, d), "hook_pos_embed": (b, p, d),
              "blocks.1.hook_resid_pre": (b, p, d), "blocks.1.ln1.hook_mean": (b, p, 1),
              "blocks.1.ln1.hook_scale": (b, p, 1), "blocks.1.ln1.hook_normalized": (b, p, d),
              "blocks.1.attn.hook_q": (b, p, h, dh), "blocks.1.attn.hook_z": (b, p, h, dh),
              "blocks.1.attn.hook_attn_scores": (b, h, p, p), "blocks.1.attn.hook_pattern": (b, h, p, p),
              "blocks.1.hook_attn_out": (b, p, d), "blocks.1.mlp.hook_pre": (b, p, CFG.d_mlp),
              "blocks.1.mlp.hook_post": (b, p, CFG.d_mlp), "blocks.1.hook_mlp_out": (b, p, d),
              "blocks.2.hook_resid_post": (b, p, d), "ln_final.hook_scale": (b, p, 1)}
    for name, shape in shapes.items():
        assert cache[name].shape == shape, name
    assert logits.shape == (b, p, CFG.d_vocab)
    assert cache.model is model
    assert cache.nbytes == sum(a.nbytes for a in cache.values())


def test_cache_keeps_only_what_was_asked(model):
    logits, cache = model.run_with_cache(TOKENS, names=["blocks.0.hook_resid_pre", "ln_final.hook_scale"])
    assert sorted(cache) == ["blocks.0.hook_resid_pre", "ln_final.hook_scale"]
    _, by_predicate = model.run_with_cache(TOKENS, names=lambda n: n.endswith("hook_scale"))
    assert sorted(by_predicate) == sorted(n for n in model.hook_names if n.endswith("hook_scale"))
    _, one = model.run_with_cache(TOKENS, names="hook_embed")
    assert list(one) == ["hook_embed"]
    _, same = model.run_with_cache(TOKENS, names_filter="hook_embed")  # TransformerLens's name for names
    assert list(same) == ["hook_embed"]
    with pytest.raises(RefGPTError, match="pass names_filter= or its alias names=, not both"):
        model.run_with_cache(TOKENS, names_filter="hook_embed", names="hook_pos_embed")  # which? no guess
    np.testing.assert_array_equal(logits, model(TOKENS))


def test_unbatched_input_still_caches_a_batch_axis(model):
    logits, cache = model.run_with_cache(TOKENS[0])
    assert logits.shape == (5, CFG.d_vocab)
    assert cache["resid_pre", 0].shape == (1, 5, CFG.d_model)


def test_cache_is_read_only(model):
    _, cache = model.run_with_cache(TOKENS)
    with pytest.raises(ValueError):
        cache["hook_embed"][0, 0, 0] = 1.0
    with pytest.raises(TypeError):
        cache["hook_embed"] = np.zeros(3)


def test_short_keys_as_in_transformer_lens(model):
    _, cache = model.run_with_cache(TOKENS)
    same = {("resid_pre", 1): "blocks.1.hook_resid_pre", ("resid_post", -1): "blocks.2.hook_resid_post",
            ("pattern", -3): "blocks.0.attn.hook_pattern", ("attn", 0): "blocks.0.attn.hook_pattern",
            "scale": "ln_final.hook_scale", ("scale", 2, "ln1"): "blocks.2.ln1.hook_scale",
            ("mean", 0, "ln2"): "blocks.0.ln2.hook_mean", "normalized": "ln_final.hook_normalized",
            "k2": "blocks.2.attn.hook_k", "scale1ln1": "blocks.1.ln1.hook_scale",
            "embed": "hook_embed", "pos_embed": "hook_pos_embed", ("post", 1): "blocks.1.mlp.hook_post",
            ("attn_out", 2): "blocks.2.hook_attn_out", ("mlp_pre", 0): "blocks.0.mlp.hook_pre"}
    for key, full in same.items():
        assert key in cache
        assert cache[key] is cache[full], key
    assert act_name("k", 6, "a") == "blocks.6.attn.hook_k" and act_name("pre5") == "blocks.5.mlp.hook_pre"
    assert ("resid_pre", 7) not in cache
    with pytest.raises(KeyError, match="blocks.7.hook_resid_pre"):
        cache["resid_pre", 7]


def test_hook_edit_flows_downstream(model):
    """Doubling ln_final's scale halves the normalized stream: logits = (x̂/2 ⊙ w + b)·W_U exactly."""
    p = model.params
    logits, cache = model.run_with_cache(TOKENS, fwd_hooks=[("ln_final.hook_scale", lambda a, n: 2 * a)])
    _, clean = model.run_with_cache(TOKENS)
    np.testing.assert_array_equal(cache["ln_final.hook_scale"], 2 * clean["ln_final.hook_scale"])
    expected = ((clean["resid_post", -1] - clean["ln_final.hook_mean"]) / (2 * clean["ln_final.hook_scale"])
                * p["ln_final.w"] + p["ln_final.b"]) @ p["unembed.W_U"]
    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-13 * np.abs(expected).max())


def test_in_place_edit_and_hook_order(model):
    seen = []

    def zero_attn(a, name):
        seen.append(("zero", name))
        a[...] = 0.0  # in place, returns None: still flows downstream

    def record(a, name):
        seen.append(("check", name, float(np.abs(a).max())))

    logits, cache = model.run_with_cache(TOKENS, fwd_hooks=[(lambda n: n.endswith("hook_attn_out"), zero_attn),
                                                           ("blocks.1.hook_attn_out", record)])
    assert seen[:3] == [("zero", "blocks.0.hook_attn_out"), ("zero", "blocks.1.hook_attn_out"),
                        ("check", "blocks.1.hook_attn_out", 0.0)]
    for L in range(CFG.n_layers):
        np.testing.assert_array_equal(cache["resid_mid", L], cache["resid_pre", L])


def test_hooks_context_manager(model):
    clean = model(TOKENS)
    with model.hooks([("blocks.0.hook_resid_pre", lambda a, n: a * 0)]):
        inside = model(TOKENS)
        assert not np.allclose(inside, clean)
    np.testing.assert_array_equal(model(TOKENS), clean)


def test_remove_batch_dim_drops_the_batch_axis_of_a_single_sequence(model):
    logits, cache = model.run_with_cache(TOKENS[:1], remove_batch_dim=True)
    _, full = model.run_with_cache(TOKENS[:1])
    assert logits.shape == (1, 5, CFG.d_vocab)  # the output keeps its batch axis, as TL's does
    for name in ("hook_embed", "blocks.1.attn.hook_pattern", "ln_final.hook_scale"):
        assert cache[name].shape == full[name].shape[1:], name
        np.testing.assert_array_equal(cache[name], full[name][0])
