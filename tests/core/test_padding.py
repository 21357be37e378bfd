"""Padding is invisible (refgpt/gpt2/padding.py): every row of a padded batch, left or right, equals that
row run alone — logits, every activation at its real positions, the loss, generation and the KV
cache — to rounding, in float64. And a batch without pads takes the old causal path bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from random_models import random_model
from refgpt import Config, RefGPTError, Tokenizer
from refgpt.gpt2.padding import attention_mask_from_tokens, position_ids
from refgpt.gpt2.tokenizer import BYTE_TO_CHAR

EOT = 256


def byte_tokenizer() -> Tokenizer:
    """The 256 bytes and <|endoftext|> (id 256), no merges: a real GPT-2 tokenizer, tiny."""
    encoder = {char: byte for byte, char in BYTE_TO_CHAR.items()}
    encoder["<|endoftext|>"] = EOT
    return Tokenizer(encoder, [])


def model_with_tokenizer(seed=0, n_layers=2, n_heads=2, d_head=4, n_ctx=16, act_fn="gelu_new", scale=0.5):
    cfg = Config(d_model=n_heads * d_head, n_layers=n_layers, n_heads=n_heads, d_mlp=12, d_vocab=257,
                 n_ctx=n_ctx, act_fn=act_fn)
    model = random_model(cfg, seed=seed, scale=scale)
    model.tokenizer = byte_tokenizer()
    return model


MODEL = model_with_tokenizer()
# Relative to max(1, |reference|): a padded row's arithmetic differs from the lone row's only in
# which zeros (masked keys, exp(−∞) = 0) enter the sums and in BLAS blocking of longer rows:
# measured ≤ 2.4e-15 over every activation of 300 random batches (left and right, with and without
# BOS), so 1e-13 leaves a 40× margin.
TOL = 1e-13


def rel(a, b):
    if np.size(b) == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


texts = st.lists(st.text(alphabet="abc xyz!", min_size=1, max_size=10), min_size=2, max_size=4)


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(texts=texts, side=st.sampled_from(["left", "right"]), bos=st.booleans())
def test_a_padded_batch_equals_each_row_alone(texts, side, bos):
    model = MODEL
    tokens = model.to_tokens(texts, prepend_bos=bos, padding_side=side)  # [batch, pos]
    logits, cache = model.run_with_cache(texts, prepend_bos=bos, padding_side=side)
    width = tokens.shape[1]
    for i, text in enumerate(texts):
        alone = model.to_tokens(text, prepend_bos=bos)  # [1, n]
        n = alone.shape[1]
        real = slice(width - n, width) if side == "left" else slice(0, n)
        assert np.array_equal(tokens[i, real], alone[0])
        alone_logits, alone_cache = model.run_with_cache(alone)
        assert rel(logits[i, real], alone_logits[0]) <= TOL
        for name in ("blocks.0.hook_resid_pre", "blocks.1.attn.hook_z", "blocks.1.ln2.hook_scale", "blocks.1.hook_resid_post"):
            assert rel(cache[name][i, real], alone_cache[name][0]) <= TOL, name
        pattern = cache["blocks.1.attn.hook_pattern"][i][:, real, real]  # [head, n, n]
        assert rel(pattern, alone_cache["blocks.1.attn.hook_pattern"][0]) <= TOL
        assert np.all(cache["blocks.1.attn.hook_pattern"][i][:, real][..., np.r_[0:width][~np.isin(np.r_[0:width], np.r_[real])]] == 0)
        per_token = model(alone, return_type="loss", loss_per_token=True)  # [1, n − 1]
        batch_loss = model(texts, return_type="loss", loss_per_token=True, prepend_bos=bos, padding_side=side)
        inner = slice(real.start, real.stop - 1)
        assert rel(batch_loss[i, inner], per_token[0]) <= TOL


@settings(max_examples=10, deadline=None)
@given(texts=texts, bos=st.booleans())
def test_left_padded_generation_and_kv_cache_equal_each_row_alone(texts, bos):
    model = MODEL
    out = model.generate(texts, max_new_tokens=4, do_sample=False, prepend_bos=bos, stop_at_eos=False,
                         return_type="tokens")
    for i, text in enumerate(texts):
        alone = model.generate(text, max_new_tokens=4, do_sample=False, prepend_bos=bos, stop_at_eos=False,
                               return_type="tokens")
        assert np.array_equal(out[i, -4:], alone[0, -4:])
    without_cache = model.generate(texts, max_new_tokens=4, do_sample=False, prepend_bos=bos, stop_at_eos=False,
                                   return_type="tokens", use_past_kv_cache=False)
    assert np.array_equal(out, without_cache)


def test_a_kv_cached_step_without_a_mask_after_a_padded_prompt_is_all_real_tokens():
    """Once a KV cache holds a padded batch, a step given no attention_mask, by a model with no
    tokenizer to find pads with (inputs.padding_of), marks its new tokens real, mask 1
    (KVCache.attention_mask): the full pass with the prompt's mask extended by ones. Marked 0
    they would be pads (unseen, no position); marked 2, not real (``mask == 1``) and their
    positions, the cumulative sum of the mask, off by one each."""
    bare = random_model(MODEL.cfg, seed=0, scale=0.5)  # no tokenizer
    tokens = np.array([[7, 7, 3, 1, 4], [9, 2, 6, 5, 3]])
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    more = np.array([[2, 8], [4, 4]])
    past = bare.kv_cache(2)
    bare(tokens, past=past, attention_mask=mask)
    step = bare(more, past=past)  # [batch, 2, d_vocab]
    full = bare(np.concatenate([tokens, more], axis=1), attention_mask=np.pad(mask, ((0, 0), (0, 2)), constant_values=1))
    assert rel(step, full[:, -2:]) <= TOL
    # The loss of such a step counts the step's own next-token pair in each row (the mask of its
    # 2 new keys, all real), not the pairs the prompt makes (4 real pairs in row 0, 3 in row 1).
    again = bare.kv_cache(2)
    bare(tokens, past=again, attention_mask=np.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]]))
    logits, loss = bare(more, past=again, return_type="both")
    first = logits[:, 0] - logits[:, 0].max(-1, keepdims=True)  # [batch, d_vocab]
    log_p = first - np.log(np.exp(first).sum(-1, keepdims=True))  # [batch, d_vocab]
    assert abs(loss - -log_p[[0, 1], more[:, 1]].mean()) <= TOL * abs(loss)


def test_an_all_ones_mask_is_the_unpadded_pass_bit_for_bit():
    tokens = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    plain = MODEL(tokens)
    assert np.array_equal(MODEL(tokens, attention_mask=np.ones_like(tokens)), plain)
    assert np.array_equal(MODEL(tokens, padding_side="left"), plain)  # no leading pad id: no mask


def test_a_mask_from_the_caller_is_used_as_given():
    tokens = np.array([[7, 7, 3, 1, 4], [9, 2, 6, 5, 3]])
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    logits = MODEL(tokens, attention_mask=mask)
    assert rel(logits[0, 2:], MODEL(tokens[:1, 2:])[0]) <= TOL
    assert np.array_equal(logits[1], MODEL(tokens[1:])[0])  # an unpadded row: the same arithmetic


def test_attention_mask_from_tokens_is_transformer_lens_rule():
    t = np.array([[EOT, EOT, EOT, 5, EOT], [5, 6, EOT, EOT, EOT]])
    assert attention_mask_from_tokens(t, EOT, False, "left").tolist() == [[0, 0, 0, 1, 1], [1, 1, 1, 1, 1]]
    assert attention_mask_from_tokens(t, EOT, True, "left").tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert attention_mask_from_tokens(t, EOT, True, "right").tolist() == [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]
    assert position_ids(np.array([[0, 0, 1, 1, 1]])).tolist() == [[0, 0, 0, 1, 2]]


def test_pads_get_a_zero_position_embedding_and_see_nothing():
    _, cache = MODEL.run_with_cache(["a", "abcd"], prepend_bos=False, padding_side="left")
    assert not cache["hook_pos_embed"][0, :3].any()
    assert not cache["blocks.0.attn.hook_pattern"][0, :, :3].any()  # a left pad attends to nothing
    assert not cache["blocks.0.attn.hook_z"][0, :3].any()


def test_bad_masks_and_sides_are_refused():
    tokens = np.array([[1, 2, 3]])
    with pytest.raises(RefGPTError, match="attention_mask: shape"):
        MODEL(tokens, attention_mask=np.ones((1, 2)))
    with pytest.raises(RefGPTError, match="only 0"):
        MODEL(tokens, attention_mask=np.array([[1, 2, 1]]))
    with pytest.raises(RefGPTError, match=r"only 0 \(pad\) and 1 \(real token\), found 0.5"):
        MODEL(tokens, attention_mask=np.array([[1, 0.5, 1]]))
    for bad in (np.array([["1", "1", "1"]]), np.array([[1, None, 1]], dtype=object)):
        with pytest.raises(RefGPTError, match=f"attention_mask: must be numbers .*found dtype {bad.dtype}"):
            MODEL(tokens, attention_mask=bad)
    with pytest.raises(RefGPTError, match="padding_side must be 'left' or 'right'"):
        MODEL(tokens, padding_side="middle")
    bare = random_model(MODEL.cfg)
    with pytest.raises(RefGPTError, match="pass attention_mask="):
        bare(tokens, padding_side="left")
