"""refgpt's torch-facing model (refgpt/tl_torch/) against TransformerLens 3.9 on the same random
float64 GPT-2 (tests/tl_port.py): torch tensors at every boundary, shared memory, the module tree,
hooks that clone and edit, gradients through torch into refgpt's analytic backward, TransformerLens's
FactoredMatrix and weight processing, loading, generate, and TL's own helpers given this model.
Every number is compared with TransformerLens's to peers.TL_TOL (float64)."""

from __future__ import annotations

import numpy as np
import pytest

import peers as P

torch, transformers, transformer_lens = P.require_peers()

import tl_port  # noqa: E402
from tl_port import N, close  # noqa: E402


def same(a, b, tol=P.TL_TOL) -> bool:
    """close(), with −∞ where both have it (masked attention scores)."""
    return P.rel_err_finite(N(a), N(b)) <= tol
from refgpt import RefGPTError  # noqa: E402

PROMPT = "When John and Mary went to the shops, John gave the bag to"


@pytest.fixture
def pair(tl_torch, tl_pair):
    return tl_torch, tl_pair[1]


# ---- tensors at the boundary, memory shared -------------------------------------------------------


def test_outputs_are_float64_tensors_equal_to_tl(pair):
    ref, tl = pair
    tokens = ref.to_tokens(PROMPT)
    assert isinstance(tokens, torch.Tensor) and tokens.dtype == torch.int64 and torch.equal(tokens, tl.to_tokens(PROMPT))
    for out_ref, out_tl in ((ref(tokens), tl(tokens)), (ref(tokens[0]), tl(tokens[0])), (ref(PROMPT), tl(PROMPT))):
        assert isinstance(out_ref, torch.Tensor) and out_ref.dtype == torch.float64 and out_ref.shape == out_tl.shape
        assert close(out_ref, out_tl)
    for kw in ({"return_type": "loss"}, {"return_type": "loss", "loss_per_token": True}):
        assert close(ref(tokens, **kw), tl(tokens, **kw))
    both_ref, both_tl = ref(tokens, return_type="both"), tl(tokens, return_type="both")
    assert close(both_ref.logits, both_tl.logits) and close(both_ref.loss, both_tl.loss)
    assert ref(tokens, return_type=None) is None
    assert close(ref(tokens, stop_at_layer=2), tl(tokens, stop_at_layer=2))
    resid = tl(tokens, stop_at_layer=3)
    assert close(ref(resid, start_at_layer=3), tl(resid, start_at_layer=3))
    assert close(ref.loss_fn(ref(tokens), tokens), tl.loss_fn(tl(tokens), tokens))
    assert close(ref.loss_fn(ref(tokens), tokens, per_token=True), tl.loss_fn(tl(tokens), tokens, per_token=True))


def test_the_cache_is_tl_s_names_shapes_and_values(pair):
    ref, tl = pair
    logits, cache = ref.run_with_cache(PROMPT)
    tl_logits, tl_cache = tl.run_with_cache(PROMPT)
    assert list(cache.keys()) == list(tl_cache.keys())  # unembed.hook_in/hook_out included, no hook_mean
    for name, value in tl_cache.items():
        assert isinstance(cache[name], torch.Tensor) and cache[name].shape == value.shape, name
        assert P.rel_err_finite(cache[name], value) <= P.TL_TOL, name
    assert cache["blocks.0.hook_resid_pre"].data_ptr() == cache["resid_pre", 0].data_ptr()
    for layer in torch.arange(-1, 2):  # a 0-d integer tensor as the layer, as TL code loops (Exploratory_Analysis 17)
        assert close(cache["attn", layer], tl_cache["attn", layer])
    with pytest.raises(RefGPTError, match="whole number"):
        cache["attn", torch.tensor(0.5)]
    kept = {name: value.clone() for name, value in cache.items()}
    ref.run_with_cache("Another pass, of another length, on the same model.")
    assert all(torch.equal(cache[name], value) for name, value in kept.items())  # no scratch memory reused under it
    cache.cache_dict["blocks.0.hook_resid_pre"][0, 0, 0] = 7.0  # writable, as TL's
    _, sliced = ref.run_with_cache(PROMPT, pos_slice=-1, remove_batch_dim=True)
    _, tl_sliced = tl.run_with_cache(PROMPT, pos_slice=-1, remove_batch_dim=True)
    assert all(close(sliced[k], v) for k, v in tl_sliced.items())
    ref.set_use_hook_mean(True)
    _, with_mean = ref.run_with_cache(PROMPT, names_filter=lambda n: n.endswith("hook_mean"))
    x = N(with_mean["blocks.0.hook_resid_pre"]) if "blocks.0.hook_resid_pre" in with_mean else N(tl_cache["resid_pre", 0])
    assert close(with_mean["blocks.0.ln1.hook_mean"], x.mean(-1, keepdims=True))


def test_parameters_are_tl_s_and_share_the_forward_s_memory(pair):
    ref, tl = pair
    assert [n for n, _ in ref.named_parameters()] == [n for n, _ in tl.named_parameters()]
    assert list(ref.state_dict()) == [k for k in tl.state_dict() if not k.endswith(("IGNORE", "mask"))]
    for (name, p), (_, q) in zip(ref.named_parameters(), tl.named_parameters()):
        assert p.dtype == torch.float64 and p.shape == q.shape and close(p, q), name
    assert ref.blocks[1].attn.W_Q is dict(ref.named_parameters())["blocks.1.attn.W_Q"]
    assert close(ref.W_Q, tl.W_Q) and close(ref.W_out, tl.W_out) and close(ref.b_U, tl.b_U) and close(ref.W_E_pos, tl.W_E_pos)
    before = ref(PROMPT)
    with torch.no_grad():
        saved = ref.blocks[2].attn.W_V.clone()
        ref.blocks[2].attn.W_V[0] *= 3  # an edit of the parameter is an edit of the weights used
        try:
            assert not close(ref(PROMPT), before)
        finally:
            ref.blocks[2].attn.W_V.copy_(saved)
    assert close(ref(PROMPT), before)
    assert ref.eval() is ref and ref.train() is ref and ref.to("cpu") is ref and ref.cpu() is ref
    assert ref.cfg.device == "cpu" and ref.cfg.dtype == torch.float64 and not ref.cfg.attn_only
    with pytest.raises(RefGPTError, match="CPU"):
        ref.to("meta")
    with pytest.raises(RefGPTError):
        ref.half()


def test_module_tree_is_tl_s(pair):
    ref, tl = pair
    for path in ("embed.W_E", "pos_embed.W_pos", "unembed.W_U", "unembed.b_U", "blocks.3.attn.W_Q", "blocks.3.attn.b_O",
                 "blocks.3.mlp.W_in", "blocks.3.ln1.w", "ln_final.b"):
        a, b = ref, tl
        for part in path.split("."):
            a, b = (a[int(part)], b[int(part)]) if part.isdigit() else (getattr(a, part), getattr(b, part))
        assert close(a, b), path
    assert set(ref.hook_dict) >= set(tl.hook_dict)
    assert ref.blocks[2].attn.hook_z is ref.hook_dict["blocks.2.attn.hook_z"] and ref.hook_dict["blocks.2.attn.hook_z"].name == "blocks.2.attn.hook_z"
    assert repr(ref.hook_dict["hook_embed"]) == repr(tl.hook_dict["hook_embed"])
    tokens = ref.to_tokens(PROMPT)
    _, tl_cache = tl.run_with_cache(tokens)
    assert close(ref.embed(tokens), tl.embed(tokens)) and close(ref.pos_embed(tokens), tl.pos_embed(tokens))
    assert close(ref.ln_final(tl_cache["blocks.6.hook_resid_post"]), tl.ln_final(tl_cache["blocks.6.hook_resid_post"]))
    assert close(ref.unembed(tl_cache["unembed.hook_in"]), tl.unembed(tl_cache["unembed.hook_in"]))
    assert close(ref.blocks[2](tl_cache["blocks.2.hook_resid_pre"]), tl.blocks[2](tl_cache["blocks.2.hook_resid_pre"]))
    assert close(ref.blocks[2].mlp(tl_cache["blocks.2.ln2.hook_normalized"]),
                 tl.blocks[2].mlp(tl_cache["blocks.2.ln2.hook_normalized"]))


# ---- hooks ---------------------------------------------------------------------------------------


def test_hooks_get_the_activation_s_memory_and_edits_flow_on(pair):
    ref, tl = pair
    tokens = ref.to_tokens(PROMPT)
    seen = {}

    def in_place(z, hook):
        seen["type"], seen["hook"] = type(z), hook
        z[:, :, 1] = 0.0  # no return: the edit in place is what flows on

    def cloned(z, hook):
        z = z.clone()
        z[:, -1, 0] = 0.0
        return z

    def doubled(x, hook):
        return x * 2

    for fwd in ([("blocks.1.attn.hook_z", in_place)], [("blocks.1.attn.hook_z", cloned)],
                [("blocks.2.hook_resid_pre", doubled), (lambda n: n.endswith("hook_v"), cloned)]):
        assert close(ref.run_with_hooks(tokens, fwd_hooks=fwd), tl.run_with_hooks(tokens, fwd_hooks=fwd))
    ref.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", in_place)])
    assert seen["type"] is torch.Tensor and seen["hook"] is ref.blocks[1].attn.hook_z
    ref.blocks[3].attn.hook_z.add_hook(cloned)  # on the module, as TL users do
    tl.blocks[3].attn.hook_z.add_hook(cloned)
    assert len(ref.hook_dict["blocks.3.attn.hook_z"].fwd_hooks) == 1
    assert close(ref(tokens), tl(tokens))
    ref.blocks[3].attn.hook_z.remove_hooks()
    tl.blocks[3].attn.hook_z.remove_hooks()
    with pytest.raises(AssertionError):  # TL asserts; refgpt's TLAssertionError is also a RefGPTError
        ref.add_hook("blocks.0.hook_attn_in", doubled)
    with pytest.raises(RefGPTError, match="use_hook_mean"):
        ref.add_hook("blocks.0.ln1.hook_mean", doubled)
    with pytest.raises(RefGPTError, match="not a hook point"):
        ref.add_hook("blocks.0.hook_in", doubled)


# ---- gradients through torch: refgpt's analytic backward -------------------------------------------


def _logit_diff(model):
    correct, wrong = model.to_single_token(" Mary"), model.to_single_token(" John")
    return lambda logits: logits[:, -1, correct].mean() - logits[:, -1, wrong].mean()


def _fwd_and_bwd(model, tokens, metric, names):
    """The attribution-patching demo's get_cache_fwd_and_bwd: forward cache, backward hooks, metric.backward()."""
    model.reset_hooks()
    model.zero_grad()
    cache, grad_cache = {}, {}

    def forward_cache_hook(act, hook):
        cache[hook.name] = act.detach().clone()

    def backward_cache_hook(act, hook):
        grad_cache[hook.name] = act.detach().clone()

    model.add_hook(lambda n: n in names, forward_cache_hook, "fwd")
    model.add_hook(lambda n: n in names, backward_cache_hook, "bwd")
    value = metric(model(tokens))
    value.backward()
    model.reset_hooks()
    return value.item(), cache, grad_cache, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_metric_backward_fires_tl_s_backward_hooks_with_tl_s_gradients(pair):
    ref, tl = pair
    tokens = ref.to_tokens([PROMPT, "When Tom and James went to the park, James gave the ball to"])
    # every hook point both have, but ln1's: TL runs ln1 three times (q, k, v inputs), so its backward
    # hooks there see one third of the path each (docs/transformerlens.md 2.21)
    names = [n for n in tl.hook_dict if ".ln1." not in n and n in ref.hook_names]
    ref.set_use_attn_result(True)
    tl.set_use_attn_result(True)
    ref.set_use_hook_mlp_in(True)
    tl.set_use_hook_mlp_in(True)
    got = _fwd_and_bwd(ref, tokens, _logit_diff(ref), names)
    want = _fwd_and_bwd(tl, tokens, _logit_diff(tl), names)
    assert abs(got[0] - want[0]) <= P.TL_TOL * max(1, abs(want[0]))
    assert set(got[2]) == set(want[2]) and len(got[2]) > 10 * ref.cfg.n_layers
    for name in want[1]:
        assert same(got[1][name], want[1][name]), name
    for name in want[2]:
        assert same(got[2][name], want[2][name]), name
    for name in want[3]:
        assert close(got[3][name], want[3][name]), name


def test_loss_backward_and_gradient_replacements_are_tl_s(pair):
    ref, tl = pair
    tokens = ref.to_tokens(PROMPT)
    out = []
    for m in (ref, tl):
        m.zero_grad()
        with m.hooks(bwd_hooks=[("blocks.4.hook_mlp_out", lambda g, hook: (g * 0.5,)),
                                ("blocks.2.attn.hook_pattern", lambda g, hook: g * 0)], reset_hooks_end=True):
            loss = m(tokens, return_type="loss", loss_per_token=True)
            (loss * torch.arange(loss.shape[-1], dtype=loss.dtype)).sum().backward()
        out.append({n: p.grad.clone() for n, p in m.named_parameters()})
    assert all(close(out[0][n], out[1][n]) for n in out[1])


def test_a_metric_of_a_tensor_a_hook_kept_differentiates_into_the_model(pair):
    ref, tl = pair
    tokens = ref.to_tokens(PROMPT)
    out = []
    for m in (ref, tl):
        m.zero_grad()
        kept = {}
        logits = m.run_with_hooks(tokens, fwd_hooks=[("blocks.3.hook_resid_mid", lambda x, hook: kept.update(x=x))])
        ((kept["x"] ** 2).sum() + logits[0, -1, 5]).backward()
        out.append({n: p.grad.clone() for n, p in m.named_parameters()})
    assert all(close(out[0][n], out[1][n]) for n in out[1])
    assert out[0]["blocks.0.attn.W_Q"].abs().sum() > 0 and not out[0]["blocks.5.mlp.W_in"][:, :3].abs().sum() == 0


def test_backward_is_refused_where_refgpt_s_would_be_wrong(pair):
    ref, _ = pair
    tokens = ref.to_tokens(PROMPT)

    def patch(x, hook):
        x = x.clone()
        x[:, 0] = 0
        return x

    logits = ref.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_pre", patch)])
    assert logits.requires_grad
    with pytest.raises(RefGPTError, match="replaced or edited"):
        logits.sum().backward()
    padded = ref(["A short one", "and a much longer text than that"], padding_side="left")
    with pytest.raises(RefGPTError, match="padded"):
        padded.sum().backward()
    with torch.no_grad():  # nothing to refuse without a graph
        assert not ref.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_pre", patch)]).requires_grad


def test_run_with_cache_incl_bwd_is_tl_s(pair):
    ref, tl = pair
    caches = [m.run_with_cache(PROMPT, return_type="loss", incl_bwd=True, names_filter=lambda n: "resid" in n)[1]
              for m in pair]
    assert list(caches[0].keys()) == list(caches[1].keys())
    assert all(same(caches[0][k], caches[1][k]) for k in caches[1].keys())


# ---- TL's helpers given this model ----------------------------------------------------------------


def test_tl_s_patching_and_test_prompt_and_activation_cache_run_on_refgpt(pair, capsys):
    from transformer_lens import ActivationCache, patching, utils

    ref, tl = pair
    clean, corrupt = ref.to_tokens([PROMPT]), ref.to_tokens(["When John and Mary went to the shops, Mary gave the bag to"])
    results = []
    for m in (ref, tl):
        with torch.no_grad():
            _, clean_cache = m.run_with_cache(clean)
            metric = _logit_diff(m)
            results.append(patching.get_act_patch_resid_pre(m, corrupt, clean_cache, metric))
            tl_cache = ActivationCache(dict(clean_cache.cache_dict), m)  # TL's cache class over the model
            results.append(tl_cache.decompose_resid(-1, pos_slice=-1))
            results.append(tl_cache.stack_head_results(-1, pos_slice=-1))
        utils.test_prompt(PROMPT, " Mary", m, prepend_bos=True)
    assert all(close(a, b) for a, b in zip(results[:3], results[3:]))
    printed = capsys.readouterr().out.split("Tokenized prompt")
    assert len(printed) == 3 and printed[1] == printed[2]  # every number printed the same


def test_generate_samples_tl_s_tokens_from_torch_s_generator(pair):
    ref, tl = pair
    texts = []
    for m in (ref, tl):
        torch.manual_seed(3)
        texts.append(m.generate("The cat", max_new_tokens=8, temperature=0.7, top_k=50, verbose=False))
        torch.manual_seed(4)
        texts.append(N(m.generate(m.to_tokens(["The cat sat", "A"]), max_new_tokens=5, top_p=0.9, verbose=False,
                                  freq_penalty=0.5)))
    assert texts[0] == texts[2] and np.array_equal(texts[1], texts[3])


# ---- circuits and weight processing --------------------------------------------------------------


def test_factored_matrix_is_tl_s(pair):
    from transformer_lens import FactoredMatrix as TLFactoredMatrix

    ref, tl = pair
    assert repr(ref.OV) == repr(tl.OV) and repr(ref.QK[2]) == repr(tl.QK[2])
    for ours, theirs in ((ref.OV, tl.OV), (ref.QK[1:3], tl.QK[1:3]), (ref.OV[2, 1], tl.OV[2, 1]),
                         (ref.W_E[:50] @ ref.OV[0] @ ref.W_U[:, :40], tl.W_E[:50] @ tl.OV[0] @ tl.W_U[:, :40])):
        assert ours.shape == theirs.shape and ours.ldim == theirs.ldim and ours.mdim == theirs.mdim
        assert close(ours.AB, theirs.AB) and close(ours.norm(), theirs.norm()) and close(ours.S, theirs.S)
        assert close(ours.U, theirs.U) and close(ours.V, theirs.V)  # torch's LAPACK: TL's signs
        assert close(ours.make_even().A, theirs.make_even().A) and close(ours.get_corner(2), theirs.get_corner(2))
        if ours.ldim == ours.rdim:
            assert close(ours.eigenvalues.real, theirs.eigenvalues.real) and close(ours.eigenvalues.imag, theirs.eigenvalues.imag)
    generator = torch.Generator().manual_seed(0)
    A, B, C = (torch.randn(s, generator=generator, dtype=torch.float64) for s in ((5, 2), (2, 5), (5, 7)))
    from refgpt.tl_torch import FactoredMatrix

    for ours, theirs in ((FactoredMatrix(A, B) @ C, TLFactoredMatrix(A, B) @ C), (C.T @ FactoredMatrix(A, B).T, C.T @ TLFactoredMatrix(A, B).T),
                         (FactoredMatrix(A, B) * 3, TLFactoredMatrix(A, B) * 3), (FactoredMatrix(A, B)[1:3], TLFactoredMatrix(A, B)[1:3])):
        assert ours.shape == theirs.shape and close(ours.AB, theirs.AB) and close(ours.A, theirs.A)
    assert close(FactoredMatrix(A, B) @ C[:, 0], TLFactoredMatrix(A, B) @ C[:, 0])
    assert close(FactoredMatrix(A, B).collapse_l(), TLFactoredMatrix(A, B).collapse_l())
    assert close(FactoredMatrix(A, B).eigenvalues.abs(), TLFactoredMatrix(A, B).eigenvalues.abs())
    with pytest.raises(AssertionError):
        FactoredMatrix(A, C)


@pytest.mark.parametrize("flags", [{}, {"refactor_factored_attn_matrices": True},
                                   {"fold_ln": False, "center_writing_weights": False, "center_unembed": False}])
def test_process_weights_in_place_equals_tl_s_in_float64(tl_pair, flags):
    from refgpt.tl_torch import HookedTransformer

    ref = HookedTransformer(tl_pair[0])
    tl = P.tl_process_float64(P.tl_copy(tl_pair[1]), **{"fold_ln": True, "center_writing_weights": True,
                                                                        "center_unembed": True, "fold_value_biases": True,
                                                                        "refactor_factored_attn_matrices": False, **flags})
    W_Q = ref.blocks[0].attn.W_Q
    ref.process_weights_(**flags)
    assert ref.blocks[0].attn.W_Q is W_Q  # in place: the same parameter objects
    assert [n for n, _ in ref.named_parameters()] == [n for n, _ in tl.named_parameters()]  # LNPre after fold_ln
    for name, p in tl.named_parameters():
        assert close(dict(ref.named_parameters())[name], p), name  # refactor: TL's signs too
    assert close(ref(PROMPT), tl(PROMPT))
    _, cache = ref.run_with_cache(PROMPT)
    _, tl_cache = tl.run_with_cache(PROMPT)
    assert all(P.rel_err_finite(cache[k], v) <= P.TL_TOL for k, v in tl_cache.items())


def test_refactor_with_numpy_s_lapack_agrees_up_to_column_signs(tl_pair):
    """The NumPy model's refactor is TL's algorithm with NumPy's LAPACK: the circuits are the same,
    a singular vector may come out negated (docs/transformerlens.md 2.7)."""
    from refgpt.tl import processing

    ref = tl_pair[0]
    numpy_way = processing.process(ref, ["refactor_factored_attn_matrices"])
    torch_way = processing.process(ref, ["refactor_factored_attn_matrices"],
                                   factored=__import__("refgpt.tl_torch.circuits", fromlist=["TorchLapack"]).TorchLapack)
    for L in range(ref.cfg.n_layers):
        for x in "QKV":
            a, b = numpy_way.params[f"blocks.{L}.attn.W_{x}"], torch_way.params[f"blocks.{L}.attn.W_{x}"]
            signs = np.sign((a * b).sum(axis=1, keepdims=True))  # [head, 1, d_head]: ±1 per column
            assert np.all(signs != 0) and close(a * signs, b, 1e-9)
    assert close(numpy_way.OV.AB, torch_way.OV.AB, 1e-10) and close(numpy_way(ref.to_tokens(PROMPT)),
                                                                   torch_way(ref.to_tokens(PROMPT)), 1e-10)


# ---- loading -----------------------------------------------------------------------------------------


def test_from_pretrained_and_the_bridge_load_a_directory_as_tl_does(tmp_path, tl_pair):
    from refgpt.tl_torch import HookedTransformer, TransformerBridge

    directory = tl_pair[0].source
    model = HookedTransformer.from_pretrained(str(directory))
    bridge = TransformerBridge.boot_transformers(str(directory))
    raw = HookedTransformer.from_pretrained_no_processing(str(directory))
    assert model.cfg.normalization_type == "LNPre" and raw.cfg.normalization_type == "LN"
    assert close(raw(PROMPT), tl_pair[1](PROMPT)) and close(bridge(PROMPT), tl_pair[1](PROMPT))
    bridge.enable_compatibility_mode()
    tl = P.tl_process_float64(P.tl_copy(tl_pair[1]))
    for m in (model, bridge):
        assert [n for n, _ in m.named_parameters()] == [n for n, _ in tl.named_parameters()]
        assert close(m(PROMPT), tl(PROMPT))
    assert [n for n, _ in bridge.tl_named_parameters()][2:6] == ["blocks.0.attn.W_Q", "blocks.0.attn.W_K",
                                                                  "blocks.0.attn.W_V", "blocks.0.attn.W_O"]
    float32 = HookedTransformer.from_pretrained(str(directory), dtype=torch.float32)
    assert float32(PROMPT).dtype == torch.float32 and close(float32(PROMPT), model(PROMPT), 1e-4)
    with pytest.raises(RefGPTError, match="checkpoint_index"):
        HookedTransformer.from_pretrained(str(directory), checkpoint_index=3)


def test_from_pretrained_finds_a_name_in_the_hf_cache(hub, tmp_path):
    """A hub name, as TL users write it, from refgpt's HF-cache reading (a fake hub serves it)."""
    from refgpt.tl_torch import HookedTransformer

    model = HookedTransformer.from_pretrained("gpt2", fold_ln=False, center_writing_weights=False, center_unembed=False)
    again = HookedTransformer.from_pretrained("openai-community/gpt2", fold_ln=False, center_writing_weights=False,
                                              center_unembed=False)
    tokens = torch.tensor([[1, 2, 3]])
    assert close(model(tokens), again(tokens)) and model(tokens).shape[-1] == model.cfg.d_vocab
