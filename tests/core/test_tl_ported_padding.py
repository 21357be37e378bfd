"""Ported from TransformerLens 3.9's tests/integration/test_left_padding.py, test_attention_mask.py,
test_kv_cache.py and the batch cases of generate: each body runs on refgpt and on TransformerLens
(same random float64 GPT-2, GPT-2's tokenizer; tests/tl_port.py), and refgpt's numbers are
compared with TransformerLens's to 1e-11 relative (TL's own tests use atol 1e-4 between padded
and unpadded runs; here both sides are float64, so the bound is peers.TL_TOL).

Departures, on purpose (docs/transformerlens.md): refgpt has no ``model.pos_embed`` module, so the
position embeddings are read at ``hook_pos_embed``; its KV cache is ``model.kv_cache(batch)``
(TL: ``TransformerLensKeyValueCache.init_cache``) and has no ``freeze()``; ``attention_mask=`` with
a KV cache masks only the new positions (the cache keeps the earlier ones)."""

from __future__ import annotations

import numpy as np
import pytest

import peers as P

torch, transformers, transformer_lens = P.require_peers()
pytestmark = pytest.mark.peer  # every test here compares with a peer (the peers extra)

import tl_port  # noqa: E402
from tl_port import N, close  # noqa: E402
from refgpt import RefGPTError  # noqa: E402
from transformer_lens import utilities as utils  # noqa: E402  (utils is deprecated in 3.9)
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache  # noqa: E402

PROMPTS = ["Hello world!", "How are you today?", "I'm fine, thank you.", "I am happy."]


@pytest.fixture(params=["refgpt", "torch"])
def pair(tl_pair, tl_torch, request):
    """(refgpt's model, TransformerLens): refgpt's NumPy model, or its torch-facing model (which runs
    TransformerLens's bodies as written); built once per session, reset around each test."""
    return tl_pair if request.param == "refgpt" else (tl_torch, tl_pair[1])


def reset(pair, side="right"):
    for model in pair:
        model.cfg.default_prepend_bos = True
        model.tokenizer.padding_side = side
    return pair


def kv_cache(model, batch):
    if hasattr(model, "kv_cache"):
        return model.kv_cache(batch)
    if hasattr(model, "refgpt"):  # DEPARTURE: the torch-facing model's cache is refgpt.tl_torch's class, same API
        from refgpt.tl_torch import TransformerLensKeyValueCache as Cache

        return Cache.init_cache(model.cfg, model.cfg.device, batch)
    return TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, batch)


def is_tl(model):
    return not hasattr(model, "kv_cache")


def pos_embed(model, tokens, **kw):
    if is_tl(model):  # TransformerLens takes torch tensors
        tokens = torch.as_tensor(tokens)
        kw = {k: torch.as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    _, cache = model.run_with_cache(tokens, names_filter="hook_pos_embed", **kw)
    return N(cache["hook_pos_embed"])


# ---- test_left_padding.py ---------------------------------------------------------------------


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("prepend_bos", [True, False])
def test_pos_embed(pair, padding_side, prepend_bos):
    ref, tl = reset(pair, padding_side)
    outs = []
    for model in (ref, tl):
        tokens = N(model.to_tokens(PROMPTS, prepend_bos=prepend_bos))
        str_tokens = model.to_str_tokens(PROMPTS, prepend_bos=prepend_bos)
        attention_mask = N(utils.get_attention_mask(tl.tokenizer, torch.tensor(tokens), prepend_bos))
        output_pos_embed = pos_embed(model, tokens, attention_mask=attention_mask)  # TL: model.pos_embed(tokens, 0, mask)
        assert output_pos_embed.shape == (tokens.shape[0], tokens.shape[1], model.cfg.d_model)
        target_position_ids = sum([list(range(len(t))) for t in str_tokens], [])
        assert close(output_pos_embed[attention_mask.astype(bool)], N(model.W_pos)[target_position_ids])
        assert output_pos_embed[~attention_mask.astype(bool)].sum() == 0
        outs.append(output_pos_embed)
    assert close(outs[0], outs[1])


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("prepend_bos", [True, False])
def test_pos_embed_as_written(tl_torch, tl_pair, padding_side, prepend_bos):
    """TL's body as written (model.pos_embed, model.pos_embed.W_pos, torch tensors), on refgpt's
    torch-facing model and on TL, whose outputs must also agree."""
    outs = []
    for model in (tl_torch, tl_pair[1]):
        model.tokenizer.padding_side = padding_side
        prompts = PROMPTS
        tokens = model.to_tokens(prompts, prepend_bos=prepend_bos)
        attention_mask = utils.get_attention_mask(model.tokenizer, tokens, prepend_bos)  # [batch pos]
        output_pos_embed = model.pos_embed(tokens, 0, attention_mask=attention_mask)  # [batch pos d_model]
        assert output_pos_embed.shape == (tokens.shape[0], tokens.shape[1], model.pos_embed.W_pos.shape[1])
        str_tokens = model.to_str_tokens(prompts, prepend_bos=prepend_bos)
        target_position_ids = torch.tensor(sum([list(range(len(t))) for t in str_tokens], []), device=tokens.device)
        target_output_pos_embed = model.pos_embed.W_pos[target_position_ids, :]
        attended_output_pos_embed = output_pos_embed[attention_mask.bool()]
        assert torch.allclose(attended_output_pos_embed, target_output_pos_embed, atol=1e-4)
        assert output_pos_embed[~attention_mask.bool()].sum() == 0
        outs.append(output_pos_embed)
    assert close(outs[0], outs[1])


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("prepend_bos", [True, False])
def test_pos_embed_with_cache_as_written(tl_torch, tl_pair, padding_side, prepend_bos):
    """TL's body as written; the one change: the torch-facing model's TransformerLensKeyValueCache
    is refgpt.tl_torch's class (DEPARTURE, the import)."""
    from refgpt.tl_torch import TransformerLensKeyValueCache as RefgptCache

    outs = []
    for model, Cache in ((tl_torch, RefgptCache), (tl_pair[1], TransformerLensKeyValueCache)):
        model.tokenizer.padding_side = padding_side
        prompts = PROMPTS
        tokens = model.to_tokens(prompts, prepend_bos=prepend_bos)
        tokens_2 = model.to_tokens(prompts, prepend_bos=False)
        past_kv_cache = Cache.init_cache(model.cfg, model.cfg.device, tokens.shape[0])
        str_tokens = model.to_str_tokens(prompts, prepend_bos=prepend_bos)
        str_tokens_2 = model.to_str_tokens(prompts, prepend_bos=False)
        attention_mask = utils.get_attention_mask(model.tokenizer, tokens, prepend_bos)  # [batch pos]
        past_kv_cache.append_attention_mask(attention_mask)
        attention_mask_2 = utils.get_attention_mask(model.tokenizer, tokens_2, False)  # [batch pos]
        cached_attention_mask = past_kv_cache.append_attention_mask(attention_mask_2)
        output_pos_embed = model.pos_embed(tokens_2, tokens.shape[1], attention_mask=cached_attention_mask)
        target_position_ids = torch.tensor(sum([list(range(len(t1), len(t1) + len(t2)))
                                                for t1, t2 in zip(str_tokens, str_tokens_2)], []), device=tokens.device)
        target_output_pos_embed = model.pos_embed.W_pos[target_position_ids, :]
        attended_output_pos_embed = output_pos_embed[attention_mask_2.bool()]
        assert torch.allclose(attended_output_pos_embed, target_output_pos_embed, atol=1e-4)
        assert output_pos_embed[~attention_mask_2.bool()].sum() == 0
        outs.append(output_pos_embed)
    assert close(outs[0], outs[1])


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("prepend_bos", [True, False])
def test_pos_embed_with_cache(pair, padding_side, prepend_bos):
    ref, tl = reset(pair, padding_side)
    outs = []
    for model in (ref, tl):
        tokens = N(model.to_tokens(PROMPTS, prepend_bos=prepend_bos))
        tokens_2 = N(model.to_tokens(PROMPTS, prepend_bos=False))
        str_tokens = model.to_str_tokens(PROMPTS, prepend_bos=prepend_bos)
        str_tokens_2 = model.to_str_tokens(PROMPTS, prepend_bos=False)
        attention_mask = N(utils.get_attention_mask(tl.tokenizer, torch.tensor(tokens), prepend_bos))
        attention_mask_2 = N(utils.get_attention_mask(tl.tokenizer, torch.tensor(tokens_2), False))
        past = kv_cache(model, tokens.shape[0])
        as_input = torch.tensor if is_tl(model) else (lambda a: a)
        model(as_input(tokens), attention_mask=as_input(attention_mask), past_kv_cache=past)
        output_pos_embed = pos_embed(model, as_input(tokens_2), attention_mask=as_input(attention_mask_2),
                                     past_kv_cache=past, prepend_bos=False)
        target = sum([list(range(len(t1), len(t1) + len(t2))) for t1, t2 in zip(str_tokens, str_tokens_2)], [])
        assert close(output_pos_embed[attention_mask_2.astype(bool)], N(model.W_pos)[target])
        assert output_pos_embed[~attention_mask_2.astype(bool)].sum() == 0
        outs.append(output_pos_embed)
    assert close(outs[0], outs[1])


def test_left_padding_by_comparing_outputs(pair):
    reset(pair)
    results = []
    for model in pair:
        num_str_tokens_list = [len(t) for t in model.to_str_tokens(PROMPTS)]
        model.tokenizer.padding_side = "left"
        left_logits, left_cache = model.run_with_cache(PROMPTS)
        model.tokenizer.padding_side = "right"
        right_logits, right_cache = model.run_with_cache(PROMPTS)
        left_logits, right_logits = N(left_logits), N(right_logits)
        width = left_logits.shape[1]
        for i, (prompt, n) in enumerate(zip(PROMPTS, num_str_tokens_list)):
            single_logits, single_cache = model.run_with_cache(prompt)
            assert close(left_logits[i, width - n:], N(single_logits)[0])
            assert close(right_logits[i, :n], N(single_logits)[0])
            for name in ["k6a", "pre2", "embed", "k6", "scale4ln1", "pre5"]:
                assert close(N(left_cache[name])[i, width - n:], N(single_cache[name])[0]), name
                assert close(N(right_cache[name])[i, :n], N(single_cache[name])[0]), name
        results.append((left_logits, right_logits, {n: N(left_cache[n]) for n in ("k6a", "pre5", "scale4ln1")}))
    assert close(results[0][0], results[1][0]) and close(results[0][1], results[1][1])
    for name in results[0][2]:
        assert close(results[0][2][name], results[1][2][name]), name


# ---- test_attention_mask.py -------------------------------------------------------------------


def test_attention_mask(pair):
    """TL builds an attn-only model with d_head=1; here the GPT-2 pair, the body unchanged."""
    input_length = 5
    masked = np.triu(np.ones((input_length, input_length)), k=1).astype(bool)
    low_attn_score = 1e-6

    def attn_scores_hook(attn_scores, hook):
        assert np.all(N(attn_scores)[:, :, masked] == -np.inf), "Attention scores excluded by the mask are not -inf"
        attn_scores[:, :, ~masked] = low_attn_score
        return attn_scores

    def attn_hook(attn, hook):
        assert np.all(N(attn)[:, :, masked] == 0), "Attention pattern attends outside the mask"
        return attn

    for model, input in zip(pair, (np.ones((1, input_length), dtype=np.int64), torch.ones((1, input_length), dtype=torch.int64))):
        fwd_hooks = [(utils.get_act_name("attn_scores", 0), attn_scores_hook), (utils.get_act_name("attn", 0), attn_hook)]
        model.run_with_hooks(input, fwd_hooks=fwd_hooks)


def test_masked_tokens(pair):
    reset(pair)
    prompts = ["Hello world!", "The quick brown fox jumps over the lazy dog."]
    outs = []
    for model in pair:
        tokens = model.to_tokens(prompts)
        as_input = torch.tensor if hasattr(tokens, "detach") else np.asarray
        full_mask = np.ones_like(N(tokens))
        no_mask_out = N(model(tokens))
        assert close(no_mask_out, N(model(tokens, attention_mask=as_input(full_mask)))), "Full mask should be no mask"
        remove_tok_idx = 2
        t = N(tokens)
        edited_tokens = np.concatenate([t[:, :remove_tok_idx], t[:, remove_tok_idx + 1:]], axis=1)
        edited_mask = full_mask.copy()
        edited_mask[:, remove_tok_idx] = 0
        edited_no_mask_out = N(model(as_input(edited_tokens)))
        edited_mask_out = N(model(tokens, attention_mask=as_input(edited_mask)))
        edited_mask_out = np.concatenate([edited_mask_out[:, :remove_tok_idx], edited_mask_out[:, remove_tok_idx + 1:]], axis=1)
        assert close(edited_no_mask_out, edited_mask_out), "Edited mask should be equivalent to no mask"
        outs.append((no_mask_out, edited_mask_out))
    assert close(outs[0][0], outs[1][0]) and close(outs[0][1], outs[1][1])


# ---- test_kv_cache.py (TL runs gpt2-small with default_padding_side="left") --------------------


def test_single_and_multiple_new_tokens(pair):
    reset(pair, "left")
    outs = []
    for model in pair:
        for post_prompt in (" Sharon", " to buy myself a mandolin"):
            pre_prompt_tokens = model.to_tokens("I went to Staten Island,")
            new_tokens = model.to_tokens(post_prompt, prepend_bos=False)
            cat = torch.cat if hasattr(new_tokens, "detach") else np.concatenate
            full_prompt_tokens = cat([pre_prompt_tokens, new_tokens], -1)
            no_cache_logits = N(model(full_prompt_tokens))
            past_kv_cache = kv_cache(model, pre_prompt_tokens.shape[0])
            model(pre_prompt_tokens, past_kv_cache=past_kv_cache)
            with_cache_logits = N(model(new_tokens, past_kv_cache=past_kv_cache))
            assert close(no_cache_logits[:, -new_tokens.shape[-1]:], with_cache_logits)
            outs.append(with_cache_logits)
    assert all(close(a, b) for a, b in zip(outs[:2], outs[2:]))


def test_kv_cache_with_custom_attention_mask(pair):
    reset(pair, "left")
    outs = []
    for model in pair:
        tokens_pre = model.to_tokens("An apple")
        tokens_post = model.to_tokens(" a day keeps junk the", prepend_bos=False)
        correct_logits = N(model(model.to_tokens("An apple a day keeps the")))
        past_kv_cache = kv_cache(model, tokens_pre.shape[0])
        model(tokens_pre, past_kv_cache=past_kv_cache)
        mask = [[1, 1, 1, 0, 1]]
        exp_logits = N(model(tokens_post, attention_mask=torch.tensor(mask) if is_tl(model) else np.array(mask),
                             past_kv_cache=past_kv_cache))
        assert close(correct_logits[:, -1], exp_logits[:, -1])
        outs.append(exp_logits)
    assert close(outs[0], outs[1])


def test_kv_cache_refuses_partial_passes(pair):
    """DEPARTURE for test_freeze_cache and test_kv_cache_and_start_at_layer: refgpt's KV cache has
    no freeze(), so a pass that runs only some blocks with it would leave it inconsistent: refused."""
    ref, _ = reset(pair, "left")
    ref = getattr(ref, "refgpt", ref)  # (the torch-facing model refuses the same way: its NumPy model does)
    past = ref.kv_cache(1)
    ref(ref.to_tokens("I went to Staten Island,"), past_kv_cache=past)
    with pytest.raises(RefGPTError, match="runs every block"):
        ref.run_with_cache(ref.to_tokens(" Sharon", prepend_bos=False), stop_at_layer=1, past_kv_cache=past)


@pytest.mark.parametrize("pre_padding", ["left", "right", None])
@pytest.mark.parametrize("post_padding", ["left", "right", None])
def test_multi_token_batch(pair, pre_padding, post_padding):
    """TL freezes the cache before the second call; refgpt's cache has no freeze and is not needed
    here: only the with-cache logits of the second call are compared."""
    reset(pair, "left")
    padded_pre = ["It's always locked", "I'd rather be burned in Canada"]
    unpadded_pre = ["It's always locked", "It's always blocked"]
    padded_post = [" by the magistrate", " than to freeze here in the South"]
    unpadded_post = [" by the magistrate", " by the candidate"]
    outs = []
    for model in pair:
        first_post = model.to_tokens(padded_post[0], prepend_bos=False)
        cat = torch.cat if hasattr(first_post, "detach") else np.concatenate
        first_full = cat([model.to_tokens(padded_pre[0]), first_post], -1)
        n = first_post.shape[-1]
        first_no_cache = N(model(first_full))[0, -n:]
        pre = (model.to_tokens(unpadded_pre) if pre_padding is None
               else model.to_tokens(padded_pre, padding_side=pre_padding))
        post = (model.to_tokens(unpadded_post, prepend_bos=False) if post_padding is None
                else model.to_tokens(padded_post, prepend_bos=False, padding_side=post_padding))
        past = kv_cache(model, pre.shape[0])
        model(pre, past_kv_cache=past, padding_side=pre_padding)
        if hasattr(past, "freeze"):
            past.freeze()
        with_cache = N(model(post, past_kv_cache=past, padding_side=post_padding, prepend_bos=False))
        first_with_cache = with_cache[0, -n:] if post_padding in ("left", None) else with_cache[0, :n]
        assert close(first_no_cache, first_with_cache)
        outs.append(with_cache)
    assert close(outs[0], outs[1])


# ---- generate on a batch of texts (TL left-pads a list) ------------------------------------------


@pytest.mark.parametrize("use_past_kv_cache", [True, False])
def test_generate_batch_greedy_equals_tl(pair, use_past_kv_cache):
    reset(pair)
    prompts = ["Hello world!", "The quick brown fox jumps", "A"]
    kw = dict(max_new_tokens=6, do_sample=False, use_past_kv_cache=use_past_kv_cache, verbose=False)
    ref, tl = pair
    for stop_at_eos in (False, True):
        assert ref.generate(prompts, stop_at_eos=stop_at_eos, **kw) == tl.generate(prompts, stop_at_eos=stop_at_eos, **kw)
        tokens = tl.to_tokens(prompts, padding_side="left")
        got = ref.generate(N(tokens), stop_at_eos=stop_at_eos, padding_side="left", **kw)
        assert np.array_equal(got, N(tl.generate(tokens, stop_at_eos=stop_at_eos, padding_side="left", **kw)))
    batch = ref.generate(prompts, return_type="tokens", stop_at_eos=False, **kw)
    for i, p in enumerate(prompts):  # each row as if alone
        alone = ref.generate(p, return_type="tokens", stop_at_eos=False, **kw)
        assert np.array_equal(batch[i, -6:], alone[0, -6:])


def test_generate_fills_finished_rows_as_tl(pair):
    # Not a TL test: a row that stops early is filled with the id TL fills it with, for one
    # eos_token_id (that id) and for a list of them (the tokenizer's <|endoftext|>)
    ref, tl = reset(pair)
    prompts = ["Hello world!", "The quick brown fox jumps"]
    kw = dict(max_new_tokens=4, do_sample=False, verbose=False, return_type="tokens")
    first = ref.generate(prompts, stop_at_eos=False, **kw)[:, -4]  # each row's first new token
    for eos in (int(first[0]), [int(first[0]), 13], (13, int(first[0]))):
        got = ref.generate(prompts, eos_token_id=eos, **kw)
        assert np.array_equal(got, N(tl.generate(prompts, eos_token_id=eos, **kw)))
        assert got[0, -1] == (eos if isinstance(eos, int) else 50256)


# ---- TransformerLens/tests/acceptance/test_generate_batch.py ------------------------------------


@pytest.mark.parametrize("use_past_kv_cache", [True, False])
def test_ht_generate_batch_matches_individual(pair, use_past_kv_cache):
    reset(pair)
    prompts = ["Hello, my dog is cute", "This is a much longer text. Hello, my cat is cute"]
    outs = []
    for gpt2_model in pair:
        kw = dict(verbose=False, do_sample=False, use_past_kv_cache=use_past_kv_cache)
        individual_outputs = [gpt2_model.generate(p, **kw) for p in prompts]
        batched_outputs = gpt2_model.generate(prompts, **kw)
        for i, prompt in enumerate(prompts):
            assert individual_outputs[i] == batched_outputs[i], f"Prompt {i} mismatch"
        outs.append(batched_outputs)
    assert outs[0] == outs[1]
