"""Ported from TransformerLens 3.9's tests/integration/test_hooks.py, test_cache_hook_names.py,
test_cache_pos_slice.py and the cache-API tests of tests/acceptance/test_activation_cache.py: each
body runs on refgpt and on TransformerLens (same random float64 GPT-2, GPT-2's tokenizer;
tests/tl_port.py), comparing what both compute.

Departures, on purpose (docs/transformerlens.md, each marked DEPARTURE below):
- refgpt raises ``RefGPTError`` where TransformerLens raises ``AssertionError``;
- backward hooks run in refgpt's analytic ``loss_and_grads`` (there is no ``.backward()``), and
  are compared with TL's torch backward on the same loss;
- ``use_split_qkv_input`` / ``use_attn_in`` are not implemented: turning them on raises;
- cached arrays are read-only; there is no ``toggle_autodiff`` (no autograd) and no module tree
  (``model.blocks[L].mlp.W_out`` is ``model.W_out[L]``);
- refgpt's cache has each LayerNorm's ``hook_mean`` and lacks TL's ``unembed.hook_in/hook_out``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import peers as P

torch, transformers, transformer_lens = P.require_peers()
pytestmark = pytest.mark.peer  # every test here compares with a peer (the peers extra)

import tl_port  # noqa: E402
from tl_port import N, close, is_numpy  # noqa: E402
from refgpt import RefGPTError  # noqa: E402
from transformer_lens.utilities import Slice, get_act_name  # noqa: E402

prompt = "Hello World!"
embed = lambda name: name == "hook_embed"  # noqa: E731


@pytest.fixture(params=["refgpt", "torch"])
def pair(tl_pair, tl_torch, request):
    """(refgpt's model, TransformerLens): refgpt's NumPy model, or its torch-facing model (which runs
    TransformerLens's bodies as written); built once per session, reset around each test."""
    return tl_pair if request.param == "refgpt" else (tl_torch, tl_pair[1])


@pytest.fixture(params=["refgpt", "torch", "tl"])
def model(tl_pair, tl_torch, request):
    """refgpt's NumPy model (with the departures below), its torch-facing model (TL's bodies as
    written) or TransformerLens."""
    m = {"refgpt": tl_pair[0], "torch": tl_torch, "tl": tl_pair[1]}[request.param]
    m.cfg.default_prepend_bos = True
    m.tokenizer.padding_side = "right"
    m.reset_hooks(including_permanent=True)
    yield m
    m.reset_hooks(including_permanent=True)


def error_of(model):
    return RefGPTError if hasattr(model, "kv_cache") else AssertionError


class Counter:
    def __init__(self):
        self.count = 0

    def inc(self, *args, **kwargs):
        self.count += 1


# ---- test_hooks.py (TL: solu-1l) --------------------------------------------------------------


def test_hook_attaches_normally(model):
    c = Counter()
    _ = model.run_with_hooks(prompt, fwd_hooks=[(embed, c.inc)])
    assert all([len(hp.fwd_hooks) == 0 for _, hp in model.hook_dict.items()])
    assert c.count == 1


def test_perma_hook_attaches_normally(model):
    c = Counter()
    model.add_perma_hook(embed, c.inc)
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1
    model.run_with_hooks(prompt, fwd_hooks=[])
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1
    assert c.count == 1


def test_hook_context_manager(model):
    c = Counter()
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1
        model.forward(prompt)
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 0
    assert c.count == 1


def test_nested_hook_context_manager(model):
    c = Counter()
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1
        model.forward(prompt)
        assert c.count == 1
        with model.hooks(fwd_hooks=[(embed, c.inc)]):
            assert len(model.hook_dict["hook_embed"].fwd_hooks) == 2
            model.forward(prompt)
            assert c.count == 3
        assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 0
    assert c.count == 3


def test_context_manager_run_with_cache(model):
    c = Counter()
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1
        model.run_with_cache(prompt)
        assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 0
    assert c.count == 1


def backward(model):
    """TL's ``out = model(prompt); out.sum().backward()``, as written for TL and the torch-facing
    model. DEPARTURE for the NumPy model (2.4): it has no autograd, its backward hooks run in
    ``loss_and_grads`` (the mean next-token loss)."""
    if is_numpy(model):
        return model.loss_and_grads(prompt)
    out = model(prompt)
    out.sum().backward()


def test_backward_hook_runs_successfully(model):
    c = Counter()

    def skip_grad(output_grad, hook: Any):
        c.inc()
        return (output_grad,)

    with model.hooks(bwd_hooks=[(embed, skip_grad)]):
        assert len(model.hook_dict["hook_embed"].bwd_hooks) == 1
        assert c.count == 0
        backward(model)
        assert len(model.hook_dict["hook_embed"].bwd_hooks) == 1
    assert len(model.hook_dict["hook_embed"].bwd_hooks) == 0
    assert c.count == 1


@pytest.mark.parametrize("returns", ["bare", "none"])
def test_backward_hook_returning_bare_tensor_or_none(model, returns):
    c = Counter()

    def hook_fn(grad, hook: Any):
        c.inc()
        return grad if returns == "bare" else None

    with model.hooks(bwd_hooks=[("blocks.0.hook_resid_post", hook_fn)]):
        backward(model)
    assert c.count == 1


def test_backward_hooks_see_and_replace_the_same_gradients_as_tl(pair):
    """Beyond TL's file: the gradient every replaceable hook point sees, and a replacement's effect
    on the parameter gradients, equal torch autograd's through TL's hooks (float64)."""
    ref, tl = pair
    names = ["blocks.1.hook_resid_post", "blocks.1.hook_mlp_out", "blocks.1.hook_attn_out",
             "blocks.0.hook_resid_mid", "blocks.0.hook_resid_pre", "hook_embed", "hook_pos_embed",
             "blocks.0.attn.hook_z", "blocks.1.mlp.hook_post"]
    # (The LayerNorm points are left out: TL 3.9's backward hooks at ln*.hook_scale and
    # hook_normalized report values that differ from the analytic gradients — at block 0 they are 0
    # at position 0 — which tests/core/test_backward.py checks against finite differences.)
    for m in pair:
        m.reset_hooks(including_permanent=True)
    seen = {"refgpt": {}, "tl": {}}

    def record(lib):
        def hook_fn(grad, hook):
            seen[lib][hook.name] = N(grad).copy()
        return hook_fn

    def halve(grad, hook):
        return grad * 0.5

    for lib, m in (("refgpt", ref), ("tl", tl)):
        for n in names:
            m.add_hook(n, record(lib), dir="bwd")
        m.add_hook("blocks.1.hook_mlp_out", halve, dir="bwd", prepend=True)  # runs before the recorder
        m.add_hook("blocks.1.attn.hook_z", halve, dir="bwd", prepend=True)  # inside attention
        m.add_hook("blocks.0.mlp.hook_post", halve, dir="bwd", prepend=True)  # inside the MLP
    if is_numpy(ref):
        grads = ref.loss_and_grads(prompt).params
    else:  # the torch-facing model: TL's way, through torch, into refgpt's analytic backward
        ref.zero_grad()
        ref(prompt, return_type="loss").backward()
        grads = {n: p.grad for n, p in ref.named_parameters()}
    tl.zero_grad()
    tl(prompt, return_type="loss").backward()
    for n in names:
        assert close(seen["refgpt"][n], seen["tl"][n]), n
    tl_params = dict(tl.named_parameters())
    for name in ("blocks.1.mlp.W_out", "blocks.1.mlp.W_in", "blocks.1.attn.W_V", "blocks.1.attn.W_Q",
                 "blocks.0.mlp.W_in", "blocks.0.attn.W_Q", "pos_embed.W_pos"):
        assert close(grads[name], tl_params[name].grad), name
    for m in pair:
        m.reset_hooks(including_permanent=True)


def test_hook_context_manager_with_permanent_hook(model):
    c = Counter()
    model.add_perma_hook(embed, c.inc)
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        assert len(model.hook_dict["hook_embed"].fwd_hooks) == 2
        model.forward(prompt)
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1
    assert c.count == 2


def test_nested_context_manager_with_failure(model):
    def fail_hook(z, hook):
        raise ValueError("fail")

    c = Counter()
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        with pytest.raises(ValueError):
            with model.hooks(fwd_hooks=[(embed, fail_hook)]):
                assert len(model.hook_dict["hook_embed"].fwd_hooks) == 2
                model.forward(prompt)
        assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1
        assert c.count == 1
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 0


def test_reset_hooks_in_context_manager(model):
    c = Counter()
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1
        model.reset_hooks()
        assert len(model.hook_dict["hook_embed"].fwd_hooks) == 0
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 0


def test_remove_hook(model):
    c = Counter()
    model.add_perma_hook(embed, c.inc)
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1
    model.remove_all_hook_fns()
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1
    model.remove_all_hook_fns(including_permanent=True)
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 0
    model.run_with_hooks(prompt, fwd_hooks=[])
    assert c.count == 0


def test_contexts_levels_and_cache_object_as_tl(model):
    # Not a TL test: the hook-registry keywords docs/transformerlens.md §1 calls "same", run on both
    name = "blocks.0.hook_resid_pre"
    assert {"hook_embed", name, "ln_final.hook_normalized"} <= {hp.name for hp in model.hook_points()}
    hp = model.hook_dict[name]

    def count(x, hook):
        hook.ctx["n"] = hook.ctx.get("n", 0) + 1

    model.add_hook(name, count)
    model(prompt)
    assert hp.ctx == {"n": 1}
    model.reset_hooks(clear_contexts=False)
    assert hp.ctx == {"n": 1} and not hp.fwd_hooks
    model.clear_contexts()
    assert hp.ctx == {}
    model.add_hook(name, count, level=1)
    model.add_hook(name, count, level=2)
    model.reset_hooks(level=2)  # only level 2's hook goes
    model(prompt)
    assert len(hp.fwd_hooks) == 1 and hp.ctx == {"n": 1}
    model.reset_hooks()
    model.run_with_hooks(prompt, fwd_hooks=[(name, count)], clear_contexts=True)
    assert hp.ctx == {} and not hp.fwd_hooks
    _, cache_dict = model.run_with_cache(prompt, names_filter=name, return_cache_object=False)
    assert type(cache_dict) is dict and list(cache_dict) == [name]
    assert np.array_equal(N(model.to_tokens(prompt, move_to_device=False)), N(model.to_tokens(prompt)))


def test_conditional_hooks(model):
    def identity_hook(z, hook):
        return z

    for hook_name, set_use_hook_function in [
        ("blocks.0.attn.hook_result", model.set_use_attn_result),
        ("blocks.0.hook_q_input", model.set_use_split_qkv_input),
        ("blocks.0.hook_mlp_in", model.set_use_hook_mlp_in),
        ("blocks.0.hook_attn_in", model.set_use_attn_in),
    ]:
        model.reset_hooks()
        set_use_hook_function(False)
        with pytest.raises(error_of(model)):
            model.add_hook(hook_name, identity_hook)
        set_use_hook_function(True)
        model.add_hook(hook_name, identity_hook)
        set_use_hook_function(False)
    n = model.to_tokens(prompt).shape[1]
    correct_shapes = {3: (1, n, model.cfg.d_model), 4: (1, n, model.cfg.n_heads, model.cfg.d_model)}
    for hook_name, set_use_hook_function, dims in [("blocks.0.hook_q_input", model.set_use_split_qkv_input, 4),
                                                    ("blocks.0.hook_attn_in", model.set_use_attn_in, 4),
                                                    ("blocks.0.hook_mlp_in", model.set_use_hook_mlp_in, 3),
                                                    ("blocks.0.attn.hook_result", model.set_use_attn_result, 4)]:
        model.reset_hooks()
        set_use_hook_function(True)
        cache = model.run_with_cache(prompt, names_filter=lambda x: x == hook_name)[1]
        assert list(cache.keys()) == [hook_name]
        assert cache[hook_name].shape == correct_shapes[dims]
        set_use_hook_function(False)


def test_ln1_hooks_run_once_per_block_in_refgpt_three_times_in_tl(pair):
    """DEPARTURE 2.21: TL applies ln1 to the query, key and value inputs separately."""
    calls = []
    for m in pair:
        count = []
        m.run_with_hooks(prompt, fwd_hooks=[("blocks.0.ln1.hook_scale", lambda x, hook: count.append(N(x).copy()))])
        calls.append(count)
    assert len(calls[0]) == 1 and len(calls[1]) == 3
    assert all(close(calls[0][0], c) for c in calls[1])


@pytest.mark.parametrize("switches", [("use_attn_result", "use_hook_mlp_in"), ("use_attn_in",), ("use_split_qkv_input",),
                                      ("use_attn_in", "use_split_qkv_input", "use_attn_result")])
def test_optional_hook_points_equal_tl(pair, switches):
    """Beyond TL's file: with the switches on, every cached value (the new points, ln1's per-head
    statistics) is TL's, in TL's order (but for 2.10), and an edit at hook_q_input moves only q."""
    outs = []
    for m in pair:
        for s in switches:
            getattr(m, "set_" + s)(True)
        logits, cache = m.run_with_cache(prompt)
        edited = None
        if "use_split_qkv_input" in switches:
            _, edited = m.run_with_cache(prompt, names_filter=["blocks.1.attn.hook_q", "blocks.1.attn.hook_k"],
                                         fwd_hooks=[("blocks.1.hook_q_input", lambda x, hook: x * 2)]) if m is pair[0] else \
                (None, None)
        outs.append((N(logits), {k: N(v) for k, v in cache.items()}, cache, edited))
        for s in switches:
            getattr(m, "set_" + s)(False)
    (ref_logits, ref_cache, ref_obj, edited), (tl_logits, tl_cache, _, _) = outs
    assert close(ref_logits, tl_logits)
    if is_numpy(pair[0]):  # DEPARTURE 2.10: hook_mean, no unembed hooks
        assert [k for k in ref_cache if not k.endswith("hook_mean")] == [k for k in tl_cache if not k.startswith("unembed.")]
    else:
        assert list(ref_cache) == list(tl_cache)
    for k, v in tl_cache.items():
        if k in ref_cache:
            assert (P.rel_err_finite(ref_cache[k], v) if "attn_scores" in k else P.rel_err(ref_cache[k], v)) <= P.TL_TOL, k
    if edited is not None:
        assert not np.allclose(N(edited["blocks.1.attn.hook_q"]), N(ref_obj["blocks.1.attn.hook_q"]))
        assert np.allclose(N(edited["blocks.1.attn.hook_k"]), N(ref_obj["blocks.1.attn.hook_k"]), rtol=0, atol=1e-14)


@pytest.mark.parametrize("zero_attach_pos,prepend", [(z, p) for z in range(2) for p in [True, False]])
def test_prepending_hooks(model, zero_attach_pos, prepend):
    def set_to_zero(z, hook):
        z[:] = 0.0
        return z

    def set_to_randn(z, hook):
        return z * 0 + 0.1 * np.random.default_rng(0).standard_normal(z.shape) if isinstance(z, np.ndarray) else torch.randn_like(z) * 0.1

    model.reset_hooks()
    for hook_idx in range(2):
        model.add_hook("blocks.0.hook_resid_post", set_to_zero if hook_idx == zero_attach_pos else set_to_randn,
                       prepend=prepend)
    tokens = np.arange(5)[None, :] if hasattr(model, "kv_cache") else torch.arange(5)[None, :]
    logits = N(model(tokens))
    # GPT-2 has 1 layer here... the stream after block 0 feeds block 1: zeros give a fixed function of
    # the position only, so every position's logits are the same as a zero-stream run's.
    logits_are_from_zero = (zero_attach_pos == 1) != prepend
    model.reset_hooks()
    zero = N(model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_post", lambda z, hook: z * 0)]))
    assert np.allclose(logits, zero) == logits_are_from_zero


# ---- test_cache_hook_names.py -------------------------------------------------------------------


def test_cache_hook_names(pair):
    """TL's list is solu-1l's; for GPT-2 the two libraries' lists agree in order except the
    DEPARTURE: refgpt has ln*.hook_mean, TL has unembed.hook_in/hook_out."""
    ref, tl = pair
    names = {}
    for lib, m in (("refgpt", ref), ("tl", tl)):
        _, cache = m.run_with_cache(prompt)
        names[lib] = list(cache.keys())
    if is_numpy(ref):
        assert [n for n in names["refgpt"] if not n.endswith("hook_mean")] == \
               [n for n in names["tl"] if not n.startswith("unembed.")]
    else:  # the torch-facing model: TL's names exactly
        assert names["refgpt"] == names["tl"]


# ---- test_cache_pos_slice.py (TL: tiny-stories-1M) ----------------------------------------------

LOREM = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor."


@pytest.mark.parametrize("remove_batch_dim", [False, True])
def test_run_with_cache_pos_slice(model, remove_batch_dim):
    _, cache_no_slice = model.run_with_cache(LOREM, return_type=None, remove_batch_dim=remove_batch_dim)
    num_tokens = len(model.tokenizer.encode(LOREM))
    d_model, d_head, n_heads = model.cfg.d_model, model.cfg.d_head, model.cfg.n_heads
    lead = () if remove_batch_dim else (1,)
    b = () if remove_batch_dim else (0,)
    for i in [0, num_tokens // 2, num_tokens - 1, -1]:
        _, cache_with_slice = model.run_with_cache(LOREM, return_type=None, pos_slice=i, remove_batch_dim=remove_batch_dim)
        assert tuple(cache_with_slice["embed"].shape) == (*lead, 1, d_model)
        assert tuple(cache_with_slice["q", 0].shape) == (*lead, 1, n_heads, d_head)
        for name in ["embed", "pos_embed"]:
            assert np.array_equal(N(cache_no_slice[name])[(*b, i)], N(cache_with_slice[name])[(*b, 0)])
        for layer in range(model.cfg.n_layers):
            for key in [("resid_pre", layer), ("resid_post", layer), ("resid_mid", layer), ("scale", layer, "ln1"),
                        ("scale", layer, "ln2"), ("normalized", layer, "ln1"), ("q", layer), ("k", layer),
                        ("v", layer), ("z", layer), ("pre", layer), ("post", layer), ("mlp_out", layer),
                        ("attn_out", layer)]:
                assert np.array_equal(N(cache_no_slice[key])[(*b, i)], N(cache_with_slice[key])[(*b, 0)]), key
            for key in [("attn_scores", layer), ("pattern", layer)]:
                assert np.array_equal(N(cache_no_slice[key])[(*b, slice(None), i)],
                                      N(cache_with_slice[key])[(*b, slice(None), 0)]), key


# ---- test_activation_cache.py: the cache API (TL: solu-2l, attn-only-2l, processed) -------------


def test_remove_batch_dim(model):
    tokens = model.to_tokens(["Hello World!", "Goodbye, moon"])
    _, cache = model.run_with_cache(tokens[:1])
    assert cache.has_batch_dim
    shapes_before_removal = {key: tuple(cache.cache_dict[key].shape) for key in cache.cache_dict}
    cache.remove_batch_dim()
    assert not cache.has_batch_dim
    assert all(shapes_before_removal[k][1:] == tuple(cache.cache_dict[k].shape) for k in shapes_before_removal)
    cache.remove_batch_dim()
    assert not cache.has_batch_dim
    assert all(shapes_before_removal[k][1:] == tuple(cache.cache_dict[k].shape) for k in shapes_before_removal)


def test_remove_batch_dim_fails_if_batch_gt_1(model):
    _, cache = model.run_with_cache(model.to_tokens(["Hello World!", "Goodbye, moon"]))
    assert cache.has_batch_dim
    with pytest.raises(error_of(model)):
        cache.remove_batch_dim()


def test_retrieve_activations(model):
    _, cache = model.run_with_cache(model.to_tokens(["Hello World!", "Goodbye, moon"]))
    n = model.cfg.n_layers
    pairs = [(("scale", 1, "ln1"), get_act_name("scale", 1, "ln1")), (("scale", -1, "ln1"), f"scale{n - 1}ln1"),
             (("k", -1, None), f"blocks.{n - 1}.attn.hook_k"), ("embed", get_act_name("embed")),
             (("embed", None), get_act_name("embed", None))]
    for key, str_key in pairs:
        assert np.array_equal(N(cache[key]), N(cache[str_key]))


def test_get_items_values_keys(model):
    _, cache = model.run_with_cache(model.to_tokens(["Hello World!", "Goodbye, moon"]))
    assert all(k == dk and np.array_equal(N(v), N(dv)) for (k, v), (dk, dv) in zip(cache.items(), cache.cache_dict.items()))
    assert all(np.array_equal(N(v), N(dv)) for v, dv in zip(cache.values(), cache.cache_dict.values()))
    assert all(k == dk for k, dk in zip(cache.keys(), cache.cache_dict.keys()))


def test_apply_slice_to_batch_dim(model):
    _, cache = model.run_with_cache(model.to_tokens(["a", "b c", "d e f", "g", "h i"]))
    assert cache.has_batch_dim
    new_cache = cache.apply_slice_to_batch_dim(Slice((2, 4)))
    assert new_cache.has_batch_dim
    assert all(np.array_equal(N(cache[key])[2:4], N(new_cache[key])) for key in cache.cache_dict)
    new_cache = cache.apply_slice_to_batch_dim(2)
    assert not new_cache.has_batch_dim
    assert all(np.array_equal(N(cache[key])[2], N(new_cache[key])) for key in cache.cache_dict)


def test_stack_activation(model):
    _, cache = model.run_with_cache(model.to_tokens(["Hello World!", "Goodbye, moon"]))
    stack = N(cache.stack_activation("scale", -1, "ln1"))
    assert all(np.array_equal(N(cache[("scale", layer, "ln1")]), stack[layer]) for layer in range(model.cfg.n_layers))
    stack = N(cache.stack_activation("scale", 1, "ln1"))
    assert all(np.array_equal(N(cache[("scale", layer, "ln1")]), stack[layer]) for layer in range(1))


def test_compute_head_results_does_not_compute_results_twice(model):
    _, cache = model.run_with_cache(model.to_tokens(["Hello World!"]))
    assert "blocks.0.attn.hook_result" not in cache.cache_dict
    cache.compute_head_results()
    assert "blocks.0.attn.hook_result" in cache.cache_dict
    first = cache.cache_dict["blocks.0.attn.hook_result"]
    if hasattr(model, "kv_cache"):  # DEPARTURE: cached arrays are read-only; "not twice" is the same object
        with pytest.raises(ValueError):
            first[0, 0, 0, 0] = float("inf")
        cache.compute_head_results()
        assert cache.cache_dict["blocks.0.attn.hook_result"] is first
    else:
        first[0, 0, 0, 0] = float("inf")
        cache.compute_head_results()
        assert cache.cache_dict["blocks.0.attn.hook_result"][0, 0, 0, 0] == float("inf")


def test_head_results_and_neuron_results_equal_tl(pair):
    out = []
    rng = np.random.default_rng(0)
    direction, directions = rng.standard_normal(pair[0].cfg.d_model), rng.standard_normal((pair[0].cfg.d_model, 3))
    for m in pair:
        _, cache = m.run_with_cache(m.to_tokens(["Hello World!", "Goodbye, moon"]))
        cache.compute_head_results()
        layer = 1
        W_out = N(m.W_out[layer])  # TL: model.blocks[layer].mlp.W_out
        ref = N(cache[f"blocks.{layer}.mlp.hook_post"])[:, -1, :2, None] * W_out[:2]
        got = N(cache.get_neuron_results(layer, neuron_slice=[0, 1], pos_slice=-1))
        assert close(got, ref)
        assert np.array_equal(N(cache.get_neuron_results(layer)), N(cache[f"blocks.{layer}.mlp.hook_post"])[..., None] * W_out)
        as_dir = (lambda a: a) if hasattr(m, "kv_cache") else torch.tensor
        full = N(cache.get_neuron_results(layer))
        for d in (direction, directions):
            projected = N(cache.get_neuron_results(layer, project_output_onto=as_dir(d)))
            assert projected.shape == (full @ d).shape and close(projected, full @ d)
        out.append((N(cache["blocks.1.attn.hook_result"]), got))
    assert close(out[0][0], out[1][0]) and close(out[0][1], out[1][1])
