"""TransformerLens's semantics without TransformerLens: hook objects and the hook registry, backward
hooks on the analytic backward, the optional hook points, text methods, forward keywords,
generate's keywords and the cache methods (the peer comparisons are tests/core/test_tl_ported_*.py)."""

from __future__ import annotations

import numpy as np
import pytest

from random_models import random_model, rel_err
from refgpt import Config, RefGPTError, Tokenizer
from refgpt.tl.hooks import HookPoint
from refgpt.gpt2.tokenizer import BYTE_TO_CHAR

EOT = 256


def byte_model(seed=0, n_layers=2):
    encoder = {char: byte for byte, char in BYTE_TO_CHAR.items()}
    encoder["<|endoftext|>"] = EOT
    cfg = Config(d_model=8, n_layers=n_layers, n_heads=2, d_mlp=12, d_vocab=257, n_ctx=24)
    model = random_model(cfg, seed=seed, scale=0.5)
    model.tokenizer = Tokenizer(encoder, [])
    return model


@pytest.fixture
def model():
    m = byte_model()
    yield m
    m.reset_hooks(including_permanent=True)


# ---- hook objects --------------------------------------------------------------------------------


def test_a_hook_point_is_its_name_and_has_tl_attributes(model):
    seen = []
    model.run_with_hooks("ab", fwd_hooks=[(lambda n: n.endswith("hook_q"), lambda a, hook: seen.append(hook))])
    hook = seen[0]
    assert isinstance(hook, HookPoint) and isinstance(hook, str)
    assert hook == hook.name == "blocks.0.attn.hook_q" and hook.layer() == 0 and hook.startswith("blocks.")
    assert [h.layer() for h in seen] == [0, 1]
    with pytest.raises(RefGPTError, match="no layer"):
        model.hook_dict["hook_embed"].layer()


def test_ctx_lives_with_the_model_until_reset(model):
    def count(a, hook):
        hook.ctx["n"] = hook.ctx.get("n", 0) + 1

    for _ in range(3):
        model.run_with_hooks("ab", fwd_hooks=[("hook_embed", count)])
    assert model.hook_dict["hook_embed"].ctx == {"n": 3}
    model.reset_hooks()
    assert model.hook_dict["hook_embed"].ctx == {}


def test_permanent_prepended_and_context_hooks_order_and_lifetime(model):
    order = []
    model.add_hook("hook_embed", lambda a, h: order.append("perm"), is_permanent=True)
    model.add_hook("hook_embed", lambda a, h: order.append("first"), prepend=True)
    with model.hooks(fwd_hooks=[("hook_embed", lambda a, h: order.append("ctx"))]):
        model("a")
    assert order == ["first", "perm", "ctx"]
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 2
    model.reset_hooks()
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1  # the permanent one stays
    model.reset_hooks(including_permanent=True)
    assert not model.hook_dict["hook_embed"].fwd_hooks


def test_hooks_context_removes_only_its_level_even_on_error(model):
    model.add_hook("hook_embed", lambda a, h: None)  # level None: outlives every context
    with pytest.raises(ZeroDivisionError):
        with model.hooks(fwd_hooks=[("hook_embed", lambda a, h: None)]):
            with model.hooks(fwd_hooks=[("hook_embed", lambda a, h: 1 / 0)]):
                model("a")
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1 and model.context_level == 0


def test_unknown_and_switched_off_points_are_refused(model):
    with pytest.raises(RefGPTError, match="not a hook point"):
        model.add_hook("blocks.0.hook_resid_pr", lambda a, h: None)
    with pytest.raises(RefGPTError, match="use_attn_result"):
        model.add_hook("blocks.0.attn.hook_result", lambda a, h: None)
    with pytest.raises(RefGPTError, match="run_with_cache names_filter: 'blocks.0.hook_mlp_in' exists only with "
                                          "model.cfg.use_hook_mlp_in = True"):
        model.run_with_cache("abc", names_filter=["blocks.0.hook_resid_pre", "blocks.0.hook_mlp_in"])
    assert "blocks.0.hook_mlp_in" not in model.run_with_cache("abc", names_filter=lambda n: "mlp_in" in n)[1]
    model.set_use_split_qkv_input(True)
    with pytest.raises(RefGPTError, match="one ln1 per block"):
        model.loss_and_grads("abc")
    model.set_use_split_qkv_input(False)
    with pytest.raises(RefGPTError, match="fixed once"):
        model.cfg.d_model = 4


# ---- the optional hook points --------------------------------------------------------------------


def test_hook_result_sums_to_attn_out_and_mlp_in_edits_only_the_mlp(model):
    model.set_use_attn_result(True)
    model.set_use_hook_mlp_in(True)
    model.cfg.use_hook_tokens = True
    logits, cache = model.run_with_cache("abc")
    result = cache["blocks.1.attn.hook_result"]  # [batch, pos, head, d_model]
    b_O = model.params["blocks.1.attn.b_O"]
    assert np.allclose(result.sum(2) + b_O, cache["blocks.1.hook_attn_out"], rtol=0, atol=1e-14)
    assert np.array_equal(cache["hook_tokens"], model.to_tokens("abc"))
    zeroed = model.run_with_hooks("abc", fwd_hooks=[("blocks.1.hook_mlp_in", lambda a, h: a * 0)], return_type=None)
    assert zeroed is None
    _, c2 = model.run_with_cache("abc", fwd_hooks=[("blocks.1.hook_mlp_in", lambda a, h: a * 0)])
    assert np.array_equal(c2["blocks.1.hook_resid_mid"], cache["blocks.1.hook_resid_mid"])  # the stream is untouched
    assert not np.allclose(c2["blocks.1.hook_mlp_out"], cache["blocks.1.hook_mlp_out"])
    for switch in ("use_attn_result", "use_hook_mlp_in", "use_hook_tokens"):
        setattr(model.cfg, switch, False)
    assert np.allclose(model("abc"), logits, rtol=0, atol=1e-13)


# ---- backward hooks --------------------------------------------------------------------------------


def test_loss_and_grads_takes_texts_of_equal_length_and_refuses_a_padded_batch(model):
    """A padded batch's backward is not implemented, so texts of different token counts are refused;
    texts of equal length (each starting with BOS, the pad id too) are one batch, row by row the texts alone."""
    with pytest.raises(RefGPTError, match="the texts have different lengths"):
        model.loss_and_grads(["ab", "abcd"])
    both = model.loss_and_grads(["ab", "cd"])
    rows = [model.loss_and_grads(text) for text in ("ab", "cd")]
    assert both.loss == pytest.approx((rows[0].loss + rows[1].loss) / 2, rel=1e-14)
    for name in both.params:  # the mean over both rows' targets: the mean of the rows' gradients (rounding apart)
        assert rel_err(both.params[name], (rows[0].params[name] + rows[1].params[name]) / 2) <= 1e-13, name


def test_backward_hooks_read_and_replace_gradients(model):
    tokens = model.to_tokens("abcd")
    plain = model.loss_and_grads(tokens)
    seen = {}
    def record(grad, hook):
        seen[hook.name] = grad.copy()  # returns None: the gradient flows on unchanged

    model.add_hook(lambda n: n.endswith(("hook_resid_post", "hook_z")), record, dir="bwd")
    again = model.loss_and_grads(tokens)
    assert np.array_equal(seen["blocks.1.hook_resid_post"], plain.activations["blocks.1.hook_resid_post"])
    assert np.array_equal(seen["blocks.0.attn.hook_z"], plain.activations["blocks.0.attn.hook_z"])
    assert again.loss == plain.loss
    model.reset_hooks()
    # Doubling ∂loss/∂mlp_out of block 1 doubles the gradients of block 1's MLP (linear in it),
    # leaves the stream's gradient above it alone, and changes what flows below (resid_mid on).
    model.add_hook("blocks.1.hook_mlp_out", lambda g, h: 2 * g, dir="bwd")
    doubled = model.loss_and_grads(tokens)
    for name in ("mlp.W_out", "mlp.b_out", "mlp.W_in", "ln2.w"):
        assert np.allclose(doubled.params["blocks.1." + name], 2 * plain.params["blocks.1." + name], rtol=1e-13, atol=0)
    assert np.array_equal(doubled.activations["blocks.1.hook_resid_post"], plain.activations["blocks.1.hook_resid_post"])
    assert not np.allclose(doubled.params["blocks.1.attn.W_Q"], plain.params["blocks.1.attn.W_Q"])
    model.reset_hooks()
    # Inside an op too: no gradient through block 0's pattern means none into its W_Q, W_K (and
    # ∂W_V, which reaches W_V through z, not the pattern, is untouched).
    model.add_hook("blocks.0.attn.hook_pattern", lambda g, h: g * 0, dir="bwd")
    cut = model.loss_and_grads(tokens)
    assert not cut.params["blocks.0.attn.W_Q"].any() and not cut.params["blocks.0.attn.b_K"].any()
    assert np.array_equal(cut.params["blocks.0.attn.W_V"], plain.params["blocks.0.attn.W_V"])
    model.reset_hooks()
    with model.hooks(fwd_hooks=[("hook_embed", lambda a, h: None)]):
        with pytest.raises(RefGPTError, match="forward hooks are attached"):
            model.loss_and_grads(tokens)


def test_run_with_cache_takes_the_forward_arguments_by_position_too(model):
    """As TransformerLens's run_with_cache(*model_args): (input, return_type, …) positionally."""
    tokens = model.to_tokens("abcd")
    loss, cache = model.run_with_cache(tokens, "loss", incl_bwd=True, names_filter="blocks.0.hook_resid_pre")
    assert loss == model(tokens, "loss") and "blocks.0.hook_resid_pre_grad" in cache
    with pytest.raises(RefGPTError, match="run_with_cache: .*'bogus'"):
        model.run_with_cache(tokens, bogus=1)
    with pytest.raises(RefGPTError, match="run_with_cache: .*'return_type'"):
        model.run_with_cache(tokens, "loss", return_type="logits")


def test_run_with_cache_incl_bwd_is_the_analytic_gradient(model):
    loss, cache = model.run_with_cache("abcd", return_type="loss", incl_bwd=True, names_filter=lambda n: "resid" in n)
    grads = model.loss_and_grads("abcd")
    assert loss == pytest.approx(grads.loss, rel=1e-15)
    assert np.array_equal(cache["blocks.0.hook_resid_pre_grad"], grads.activations["blocks.0.hook_resid_pre"])
    # The gradient is taken over the same tokens as the forward: text read with the call's prepend_bos.
    loss, cache = model.run_with_cache("abcd", return_type="loss", incl_bwd=True, prepend_bos=False,
                                       names_filter="blocks.0.hook_resid_pre")
    grads = model.loss_and_grads(model.to_tokens("abcd", prepend_bos=False))
    assert loss == pytest.approx(grads.loss, rel=1e-15)
    assert np.array_equal(cache["blocks.0.hook_resid_pre_grad"], grads.activations["blocks.0.hook_resid_pre"])


# ---- text, forward keywords, generate ------------------------------------------------------------


def test_to_tokens_and_friends_follow_tl(model):
    assert model.to_tokens("ab").tolist() == [[EOT, 97, 98]]
    assert model.to_tokens("a<|endoftext|>b", prepend_bos=False).tolist() == [[97, EOT, 98]]
    assert model.to_tokens(["a", "abc"]).tolist() == [[EOT, 97, EOT, EOT], [EOT, 97, 98, 99]]
    assert model.to_tokens(["a", "abc"], padding_side="left").tolist() == [[EOT, EOT, EOT, 97], [EOT, 97, 98, 99]]
    assert model.to_string(np.array([[97, 98], [99, 100]])) == ["ab", "cd"] and model.to_string([97]) == "a"
    assert model.to_str_tokens("ab") == ["<|endoftext|>", "a", "b"]
    assert model.to_str_tokens(["a", "bc"], prepend_bos=False) == [["a"], ["b", "c"]]
    assert model.to_single_token("a") == 97 and model.get_token_position("b", "abab", mode="last") == 4
    assert model.to_tokens("x" * 30).shape == (1, 24) and model.to_tokens("x" * 30, truncate=False).shape == (1, 31)
    with pytest.raises(RefGPTError, match="not one"):
        model.to_single_token("ab")
    with pytest.raises(RefGPTError, match="does not occur"):
        model.get_token_position("z", "ab")


def test_forward_keywords(model):
    tokens = model.to_tokens(["abc", "de"])
    logits, loss = model(tokens, return_type="both")
    assert np.array_equal(logits, model(tokens)) and loss == model(tokens, return_type="loss")
    both = model(tokens, return_type="both")  # TransformerLens's Output: a named tuple
    assert both.logits is both[0] and both.loss is both[1]
    per_token = model(tokens, return_type="loss", loss_per_token=True)
    assert per_token.shape == (2, 3) and per_token.mean() == pytest.approx(loss, rel=1e-15)
    resid = model(tokens, stop_at_layer=1)
    assert np.array_equal(resid, model.run_with_cache(tokens)[1]["blocks.1.hook_resid_pre"])
    assert np.array_equal(model(tokens, stop_at_layer=1, return_type=None), resid)  # TL: stop_at_layer wins
    assert model(tokens, return_type=None) is None
    assert np.array_equal(model(resid, start_at_layer=1), logits)
    assert model(resid, start_at_layer=1, tokens=tokens, return_type="loss") == loss
    with pytest.raises(RefGPTError, match="return_type='loss' with start_at_layer needs tokens= for the loss"):
        model(resid, start_at_layer=1, return_type="loss")  # the stream alone: no next tokens to score
    with pytest.raises(RefGPTError, match="return_type"):
        model(tokens, return_type="probs")


def test_a_residual_input_into_a_kv_cache_reads_padding_as_a_token_input_does(model):
    tokens = model.to_tokens(["abc", "dca"])  # no pads
    resid = model(tokens, stop_at_layer=0)  # [batch, pos, d_model], the stream entering block 0
    for mask in (None, np.ones((2, 4), int)):  # an all-ones mask is no mask: the plain causal path
        past = model.kv_cache(2)
        assert np.array_equal(model(resid, start_at_layer=0, attention_mask=mask, past_kv_cache=past), model(tokens))
        assert past.mask is None
    past = model.kv_cache(2)
    padded = model(resid, start_at_layer=0, attention_mask=[[1, 1, 1, 1], [0, 1, 1, 1]], past_kv_cache=past)
    assert past.mask is not None and np.array_equal(padded[0], model(tokens)[0])


def test_generate_keywords(model):
    out = model.generate("ab", max_new_tokens=5, do_sample=False, stop_at_eos=False)
    assert isinstance(out, str) and out.startswith("ab")
    tokens = model.generate(model.to_tokens("ab"), max_new_tokens=5, do_sample=False, stop_at_eos=False)
    assert tokens.shape == (1, 8)
    eos = int(tokens[0, 3])  # the first greedy token, made the EOS: generation stops after it
    stopped = model.generate(model.to_tokens("ab"), max_new_tokens=5, do_sample=False, eos_token_id=eos)
    assert stopped.shape == (1, 4) and stopped[0, -1] == eos
    a = model.generate("ab", 6, seed=3, top_p=0.5, freq_penalty=0.5, return_type="tokens", stop_at_eos=False)
    assert np.array_equal(a, model.generate("ab", 6, seed=3, top_p=0.5, freq_penalty=0.5, return_type="tokens",
                                            stop_at_eos=False))
    with pytest.raises(RefGPTError, match="top_p"):
        model.generate("ab", 2, top_p=1.5)
    for input in ("ab", ["ab", "c"], model.to_tokens(["ab", "c"])):  # a list of texts is left-padded anyway
        with pytest.raises(RefGPTError, match="padding_side must be 'left' or 'right', found 'middle'"):
            model.generate(input, 2, padding_side="middle")


# ---- cache methods ----------------------------------------------------------------------------------


def test_cache_reshaping_methods(model):
    _, cache = model.run_with_cache(["ab", "cd", "ef"])
    assert cache.has_batch_dim and cache.cache_dict is cache._store
    one = cache.apply_slice_to_batch_dim(1)
    assert not one.has_batch_dim and np.array_equal(one["resid_pre", 1], cache["resid_pre", 1][1])
    with pytest.raises(RefGPTError, match="batch of 1"):
        cache.remove_batch_dim()
    _, sliced = model.run_with_cache("abcd", pos_slice=-1, remove_batch_dim=True)
    assert sliced["embed"].shape == (1, 8) and sliced["q", 0].shape == (1, 2, 4) and sliced["pattern", 0].shape == (2, 1, 5)
    stack = cache.stack_activation("resid_post")
    assert stack.shape == (2, 3, 3, 8) and np.array_equal(stack[1], cache["resid_post", 1])
    cache.compute_head_results()
    assert np.allclose(cache["result", 0].sum(2) + model.params["blocks.0.attn.b_O"], cache["attn_out", 0], atol=1e-14)
    assert cache.get_neuron_results(1).shape == (3, 3, 12, 8)
