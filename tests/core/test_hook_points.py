"""refgpt/tl/hook_points.py is the one table of hook names and axes: it names exactly what the forward
pass caches, in order, with each axis's true size; and a missing activation is one error everywhere."""

from __future__ import annotations

import numpy as np
import pytest

from random_models import random_model
from refgpt import Config, RefGPTError
from refgpt.tl import hook_points
from refgpt.analysis.attribution import attribute
from refgpt.analysis.lens import logit_lens_final_scale
from refgpt.errors import MissingActivation

CFG = Config(d_model=12, n_layers=3, n_heads=3, d_mlp=20, d_vocab=30, n_ctx=9)


@pytest.fixture(scope="module")
def run():
    model = random_model(CFG, seed=5)
    tokens = np.random.default_rng(1).integers(0, CFG.d_vocab, size=(2, 7))
    _, cache = model.run_with_cache(tokens)
    return model, tokens, cache


def test_the_table_names_every_cached_activation_in_forward_order(run):
    model, _, cache = run
    assert model.hook_names == hook_points.hook_names(CFG.n_layers) == list(cache)
    assert len(model.hook_names) == 2 + CFG.n_layers * len(hook_points.BLOCK) + 3


def test_every_axis_label_is_the_true_size(run):
    _, tokens, cache = run
    size = {"batch": 2, "pos": 7, "key_pos": 7, "head": CFG.n_heads, "d_head": CFG.d_head,
            "d_model": CFG.d_model, "d_mlp": CFG.d_mlp, "1": 1}
    for name, activation in cache.items():
        assert activation.shape == tuple(size[a] for a in hook_points.axes(name)), name
    assert hook_points.axes("logits") is None and hook_points.axes("blocks.0.hook_nothing") is None


def test_positions_are_the_query_axis_of_scores_and_patterns():
    assert hook_points.position_axis("blocks.1.attn.hook_pattern") == 2
    assert hook_points.position_axis("blocks.1.attn.hook_q") == 1
    assert hook_points.position_axis("ln_final.hook_scale") == 1
    assert hook_points.split("blocks.12.ln2.hook_mean") == (12, "ln2.hook_mean")
    assert hook_points.split("hook_embed") == (None, "hook_embed")


def test_a_missing_activation_is_one_error_a_keyerror_and_a_refgpterror(run):
    model, tokens, _ = run
    _, few = model.run_with_cache(tokens, names=["hook_embed"])
    with pytest.raises(MissingActivation, match="blocks.1.hook_resid_pre"):
        few["resid_pre", 1]
    assert issubclass(MissingActivation, KeyError) and issubclass(MissingActivation, RefGPTError)
    with pytest.raises(MissingActivation, match="decomposition: the cache has no 'blocks.0.hook_resid_pre'"):
        few.accumulated_resid()
    with pytest.raises(MissingActivation, match="attribute: the cache has no .*required_hooks"):
        attribute(few, target=3)
    with pytest.raises(MissingActivation, match="logit_lens_final_scale: the cache has no 'ln_final.hook_scale'"):
        logit_lens_final_scale(few)
