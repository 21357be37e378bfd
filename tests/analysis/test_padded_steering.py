"""Front-position interventions on a padded batch edit each row where they would edit it alone.

A left-padded row's first real token is position 0 (TransformerLens's and HF's count,
refgpt/gpt2/padding.py), so steering "the first m positions" of a left-padded batch must edit each
row's first m real tokens, not the pads that fill the front of the array. Property: every row of
a padded, steered batch equals that row steered alone, in float64, to rounding; and steered
greedy generation of a left-padded batch gives each row's own continuation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from random_models import random_model
from refgpt import Config, RefGPTError, Tokenizer
from refgpt.analysis.interventions import add_vector, injection_limit, patch, steering_vector
from refgpt.gpt2.tokenizer import BYTE_TO_CHAR, ENDOFTEXT

CFG = Config(d_model=8, n_layers=3, n_heads=2, d_mlp=12, d_vocab=257, n_ctx=20)
# As tests/core/test_padding.py: a padded row's arithmetic differs from the lone row's only in which
# zeros (masked keys) enter the sums and in BLAS blocking of longer rows (measured ≤ 2.4e-15 there);
# the steering edit itself is the same float64 addition (or assignment) in both runs.
TOL = 1e-13


def byte_tokenizer():
    encoder = {BYTE_TO_CHAR[b]: b for b in range(256)}
    encoder[ENDOFTEXT] = 256
    return Tokenizer(encoder, [])


MODEL = random_model(CFG, seed=5, scale=0.5)
MODEL.tokenizer = byte_tokenizer()
RNG = np.random.default_rng(0)
VECTOR = RNG.normal(size=(2, CFG.d_model)) * 3  # [2, d_model]: positions 0 and 1 (BOS and the first byte)
DIRECTION = RNG.normal(size=CFG.d_model)  # [d_model]


def rel(a, b):
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


def interventions(position):
    shortest = MODEL.to_tokens("a")  # [1, 2]: BOS + one byte, the fewest positions a prompt has here
    return {"add_vector": add_vector(MODEL, shortest, VECTOR, layer=1, coeff=2.0),
            "steering_vector": steering_vector(MODEL, "ab", "xy!", layer=1, coeff=4.0),
            "injection_limit": injection_limit(MODEL, DIRECTION, layer=1, position=position)}


texts = st.lists(st.text(alphabet="abc xyz!", min_size=3, max_size=9), min_size=2, max_size=4)


@settings(max_examples=12, deadline=None)
@given(texts=texts, side=st.sampled_from(["left", "right"]), position=st.sampled_from([0, 1, 2, -1]))
def test_a_padded_steered_batch_equals_each_row_steered_alone(texts, side, position):
    # Counted from the end (−1), a right-padded row without a mask ends at the array's end, its pads
    # included (the plain causal pass, as TransformerLens): only left-padded rows share their end.
    assume(position >= 0 or side == "left")
    tokens = MODEL.to_tokens(texts, padding_side=side)  # [batch, pos]
    width = tokens.shape[1]
    for what, intervention in interventions(position).items():
        batch = MODEL.run_with_hooks(texts, fwd_hooks=intervention, padding_side=side)  # [batch, pos, d_vocab]
        unsteered = MODEL(texts, padding_side=side)
        for i, text in enumerate(texts):
            alone = MODEL.to_tokens(text)  # [1, n]
            n = alone.shape[1]
            real = slice(width - n, width) if side == "left" else slice(0, n)
            steered_alone = MODEL.run_with_hooks(alone, fwd_hooks=intervention)[0]  # [n, d_vocab]
            assert rel(batch[i, real], steered_alone) <= TOL, (what, i)
            assert rel(steered_alone, MODEL(alone)[0]) > 1e-6, what  # the edit did change this row
        assert rel(batch, unsteered) > 1e-6


def test_the_old_bug_a_left_padded_row_is_not_steered_at_its_pads():
    texts = ["a", "abcdefg"]  # row 0: six pads, then BOS and "a"
    tokens = MODEL.to_tokens(texts, padding_side="left")
    sv = steering_vector(MODEL, "b", "x", layer=1, coeff=4.0)  # [2, d_model]: BOS (zero) and the byte
    name = "blocks.1.hook_resid_pre"
    _, plain = MODEL.run_with_cache(texts, padding_side="left", names=[name])
    with sv:
        _, steered = MODEL.run_with_cache(texts, padding_side="left", names=[name])
    edit = steered[name] - plain[name]  # [batch, pos, d_model]
    pads = tokens.shape[1] - 2
    assert np.all(edit[0, :pads] == 0)
    assert np.allclose(edit[0, pads:pads + 2], sv.vector[:2], rtol=1e-15, atol=1e-15)


def test_steered_generation_of_a_left_padded_batch_gives_each_rows_own_continuation():
    texts = ["abc", "xyz abc", "b!!"]
    sv = steering_vector(MODEL, "ab", "xy!", layer=1, coeff=4.0)
    with sv:
        batch = MODEL.generate(texts, max_new_tokens=4, do_sample=False, stop_at_eos=False, return_type="tokens",
                               padding_side="left")
        for i, text in enumerate(texts):
            alone = MODEL.generate(text, max_new_tokens=4, do_sample=False, stop_at_eos=False, return_type="tokens")
            assert np.array_equal(batch[i, -4:], alone[0, -4:])


def test_a_left_padded_row_shorter_than_the_steered_positions_is_refused_naming_it():
    sv = steering_vector(MODEL, "abcd", "xyz!", layer=1)  # 5 positions with BOS
    with pytest.raises(RefGPTError, match=r"needs at least 5 positions, the prompt has 2 \(batch row 0"):
        MODEL.run_with_hooks(["a", "abcdefgh"], fwd_hooks=sv, padding_side="left")


def test_patching_a_left_padded_run_is_refused():
    texts = ["a", "abcd"]
    _, source = MODEL.run_with_cache(texts, padding_side="left")
    tokens = MODEL.to_tokens(texts, padding_side="left")
    edit = patch(MODEL, tokens, source, ["blocks.1.hook_resid_pre"], positions=[0])
    with pytest.raises(RefGPTError, match="left-padded"):
        MODEL.run_with_hooks(texts, fwd_hooks=edit, padding_side="left")
