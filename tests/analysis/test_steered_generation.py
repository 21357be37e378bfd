"""Steered generation: interventions on prompt positions under the KV cache (refgpt/tl/hooks.py
``hook.start``, refgpt/analysis/interventions.py "Under generation").

The property: greedy generation with a KV cache inside ``with intervention:`` gives the tokens of
a greedy loop that recomputes the whole steered forward pass, prompt and generated tokens, at
every step. Each KV-cached step's logits equal the recomputation's to the KV cache's own
rounding (tests/core/test_kv_cache.py, ≤ 1e-12 relative); so the tokens must agree at every step
whose top two logits are further apart than twice that error, and the comparison stops at the
first step that is a near-tie (where either token is a correct greedy choice).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from random_models import model_and_tokens, random_model, rel_err
from refgpt import Config
from refgpt.analysis.interventions import add_vector, injection_limit, patch, steering_vector
from refgpt.errors import RefGPTError

KV_REL_ERR = 1e-12  # tests/core/test_kv_cache.py: incremental logits vs the full pass


@st.composite
def interventions(draw, model, tokens):
    """One intervention on positions of ``tokens`` [batch, pos], of every kind the module builds."""
    cfg, (batch, n_pos) = model.cfg, tokens.shape
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    layer = draw(st.integers(0, cfg.n_layers - 1))
    kind = draw(st.sampled_from(["steering_vector", "add_vector", "patch", "injection_limit"]))
    if kind == "steering_vector":
        m = draw(st.integers(1, n_pos))
        plus, minus = rng.integers(0, cfg.d_vocab, m), rng.integers(0, cfg.d_vocab, draw(st.integers(1, m)))
        coeff = draw(st.sampled_from([-3.0, 1.0, 10.0, 1e6]))
        return steering_vector(model, plus, minus, layer, coeff, prepend_bos=False, pad_token=0)
    if kind == "add_vector":
        where = sorted(set(rng.integers(-n_pos, n_pos, draw(st.integers(1, n_pos))).tolist()),
                       key=lambda p: p % n_pos)
        where = list({p % n_pos: p for p in where}.values())
        vector = rng.standard_normal((len(where), cfg.d_model))
        return add_vector(model, tokens, vector, layer, where, coeff=draw(st.sampled_from([1.0, 30.0, 1e8])))
    if kind == "patch":
        _, source = model.run_with_cache(rng.integers(0, cfg.d_vocab, (draw(st.sampled_from([1, batch])), n_pos)))
        names = [f"blocks.{layer}.hook_resid_mid", f"blocks.{layer}.attn.hook_pattern",
                 f"blocks.{layer}.attn.hook_attn_scores", f"blocks.{layer}.ln2.hook_scale", "hook_embed"]
        chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))
        positions = None if draw(st.booleans()) else [int(rng.integers(-n_pos, n_pos))]
        return patch(model, tokens, source, chosen, positions)
    direction = rng.standard_normal(cfg.d_model)
    assume(np.ptp(direction) > 0)
    return injection_limit(model, direction, layer, int(rng.integers(0, n_pos)))


def recomputed_greedy(model, tokens, n_new, intervention):
    """Greedy decoding that reruns the whole steered forward pass at every step: (tokens, the
    logits each step chose from [step, batch, d_vocab])."""
    seq, chosen_from = tokens, []
    for _ in range(n_new):
        logits = model.run_with_hooks(seq, fwd_hooks=intervention)[:, -1]  # [batch, d_vocab]
        chosen_from.append(logits)
        seq = np.concatenate([seq, logits.argmax(-1)[:, None]], axis=1)  # [batch, pos + 1]
    return seq, np.array(chosen_from)


def cached_steps(model, seq, n_prompt, intervention):
    """The KV-cached logits for the steps that produced seq[:, n_prompt:] [step, batch, d_vocab]."""
    past, out, step = model.kv_cache(seq.shape[0]), [], seq[:, :n_prompt]
    with intervention:
        for i in range(seq.shape[1] - n_prompt):
            out.append(model(step, past=past, last_only=True)[:, -1])
            step = seq[:, n_prompt + i:n_prompt + i + 1]
    return np.array(out)


def decisive_steps(logits, error):
    """How many leading steps have, in every batch row, a top-two gap above 2·error·max(1, max|logit|)."""
    top2 = np.sort(logits, axis=-1)[..., -2:]  # [step, batch, 2]
    gap = top2[..., 1] - top2[..., 0]  # [step, batch]
    allowance = 2 * error * np.maximum(1.0, np.abs(logits).max(-1))  # [step, batch]
    ok = np.all(gap > allowance, axis=1)  # [step]
    return len(ok) if ok.all() else int(np.argmin(ok))


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(st.data())
def test_kv_cached_steered_greedy_equals_recomputing_the_steered_pass(data):
    model, tokens = data.draw(model_and_tokens())
    n_prompt = tokens.shape[1]
    assume(model.cfg.n_ctx > n_prompt)
    n_new = data.draw(st.integers(1, model.cfg.n_ctx - n_prompt))
    intervention = data.draw(interventions(model, tokens))

    expected, chosen_from = recomputed_greedy(model, tokens, n_new, intervention)
    with intervention:
        generated = model.generate(tokens, n_new, temperature=0, stop_at_eos=False)
    # Every step's cached logits are the recomputation's, to the KV cache's rounding …
    cached = cached_steps(model, expected, n_prompt, intervention)
    for step in range(n_new):
        assert rel_err(cached[step], chosen_from[step]) <= KV_REL_ERR
    # … so the tokens agree up to the first near-tie (and the prompt is kept as it was).
    decisive = decisive_steps(chosen_from, KV_REL_ERR)
    assert np.array_equal(generated[:, :n_prompt + decisive], expected[:, :n_prompt + decisive])


def test_the_issue_example_generates_and_steers():
    """``with steering_vector(...): model.generate(...)`` used to raise ("needs at least 3
    positions, the prompt has 1"): it generates, and the steered text is the recomputed one."""
    cfg = Config(d_model=16, n_layers=2, n_heads=2, d_mlp=32, d_vocab=30, n_ctx=16)
    model = random_model(cfg, seed=4, scale=0.5)
    prompt = np.array([3, 7, 1, 9, 2])
    sv = steering_vector(model, [1, 2, 3], [4, 5, 6], layer=1, coeff=50.0, prepend_bos=False)
    with sv:
        steered = model.generate(prompt, 8, temperature=0, stop_at_eos=False)
    expected, _ = recomputed_greedy(model, prompt[None], 8, sv)
    assert np.array_equal(steered, expected[0])
    assert not np.array_equal(steered, model.generate(prompt, 8, temperature=0, stop_at_eos=False))


def test_prompt_positions_are_edited_once_in_the_pass_that_computes_them():
    cfg = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=8, d_vocab=11, n_ctx=10)
    model = random_model(cfg, seed=5)
    prompt = np.array([[1, 2, 3, 4]])
    v = add_vector(model, prompt, np.ones(8), 0, [0, 2], coeff=5.0)
    seen = []
    watch = ("blocks.0.hook_resid_pre", lambda a, name: seen.append(a.copy()))
    with v:
        model.generate(prompt, 3, temperature=0, seed=0, stop_at_eos=False)
    _, clean = model.run_with_cache(prompt, names=["blocks.0.hook_resid_pre"])
    model.run_with_hooks(prompt, fwd_hooks=[watch])  # the clean prompt pass, for reference
    with v:
        past = model.kv_cache(1)
        model.run_with_hooks(prompt, fwd_hooks=[watch], past=past)  # prompt pass: edited
        model.run_with_hooks(np.array([[5]]), fwd_hooks=[watch], past=past)  # a step: not edited
    clean_pre, steered_pre, step_pre = seen[-3:]
    assert np.array_equal(steered_pre - clean_pre, np.where(np.isin(np.arange(4), [0, 2])[:, None], 5.0, 0.0)[None]
                          * np.ones(8))
    assert step_pre.shape == (1, 1, 8)
    assert np.array_equal(step_pre, model.run_with_cache(np.array([[1, 2, 3, 4, 5]]),
                                                         names=["blocks.0.hook_resid_pre"])[1]
                          ["blocks.0.hook_resid_pre"][:, 4:])


def test_a_first_pass_shorter_than_the_steered_positions_is_an_error():
    cfg = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=8, d_vocab=11, n_ctx=10)
    model = random_model(cfg, seed=6)
    sv = steering_vector(model, [1, 2, 3], [4, 5, 6], layer=0, prepend_bos=False)
    with sv, pytest.raises(RefGPTError, match="at least 3 positions, the prompt has 2"):
        model.generate(np.array([1, 2]), 3, temperature=0, stop_at_eos=False)


def test_a_limit_position_counted_from_the_end_is_refused_under_a_kv_cache():
    """injection_limit takes no prompt, so position −1 means "the run's last": in a full
    recomputation that moves with every generated token. Under a KV cache that is ambiguous, and
    refgpt says so instead of guessing."""
    cfg = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=8, d_vocab=11, n_ctx=10)
    model = random_model(cfg, seed=7)
    limit = injection_limit(model, np.arange(8.0), 0, -1)
    with limit, pytest.raises(RefGPTError, match="ambiguous once a KV cache"):
        model.generate(np.array([1, 2, 3]), 2, temperature=0, stop_at_eos=False)
