"""refgpt against HF transformers' GPT2LMHeadModel on random tiny models.

Every test builds a random GPT2Config (every knob: activation, epsilon, n_inner, attention
scaling, scaling by inverse layer index, reorder-and-upcast, tied or untied head), perturbs every
parameter (HF's init leaves biases 0 and LayerNorms identity, which hides bugs), writes a checkpoint
(save_pretrained layout, sharded or not, or the hub's openai-community/gpt2 layout) in F16, BF16,
F32 or F64, loads it with ``refgpt.load`` and compares logits, hidden states and every activation
HF exposes (via forward hooks) with HF run on the same (equally rounded) weights:
≤ 1e-12 relative in float64, ≤ 2e-5 in float32.

Needs the 'peers' extra; skipped without it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from peers import require_peers

torch, transformers, transformer_lens = require_peers()
pytestmark = pytest.mark.peer  # every test here compares with a peer (the peers extra)

import peers as P  # noqa: E402  (after the importorskip)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

P.dump_errors_at_exit()


def _load(path, dtype="float64"):
    return P.refgpt_load(path, dtype)


def _check_cfg(model, hf_cfg):
    c = model.cfg
    d = hf_cfg.n_embd
    assert (c.d_model, c.n_layers, c.n_heads, c.d_head) == (d, hf_cfg.n_layer, hf_cfg.n_head, d // hf_cfg.n_head)
    assert c.d_mlp == (hf_cfg.n_inner if hf_cfg.n_inner is not None else 4 * d)
    assert (c.d_vocab, c.n_ctx) == (hf_cfg.vocab_size, hf_cfg.n_positions)
    assert c.eps == hf_cfg.layer_norm_epsilon
    act = hf_cfg.activation_function
    assert c.act_fn in {act, P.TL_ACT_FNS.get(act, act)}, f"act_fn {c.act_fn!r} for HF {act!r}"


def _token_sets(seed, cfg):
    """A batch of 3 sequences of a random length, an unbatched full-context one, and a [1, 1] one."""
    rng = np.random.default_rng(seed + 12345)
    V, N = cfg.vocab_size, cfg.n_positions
    return [
        P.random_tokens(rng, V, N, batch=3),
        P.random_tokens(rng, V, N, pos=N),
        P.random_tokens(rng, V, N, batch=1, pos=1),
    ]


def _compare(model, hf_ref, cfg, seed, tol, category, context):
    for toks in _token_sets(seed, cfg):
        ctx = f"{context} | tokens {toks.shape} | {P.describe_config(cfg)}"
        P.compare_to_hf(model, hf_ref, toks, tol, ctx).check(tol, category)


# ----------------------------------------------------------------------------------------------
# Harness sanity: the checkpoints we write are what we say they are, and HF itself reads them back
# ----------------------------------------------------------------------------------------------


def test_harness_hf_layout_roundtrips_through_hf(tmp_path):
    cfg = P.random_hf_config(3, tie_word_embeddings=False, reorder_and_upcast_attn=False)
    hf = P.random_hf_model(cfg, 3)
    P.save_hf_layout(hf, tmp_path / "hf", dtype="F64")
    sd = P.read_safetensors(tmp_path / "hf")
    assert "lm_head.weight" in sd and "transformer.wte.weight" in sd
    assert all(k.startswith("transformer.") or k == "lm_head.weight" for k in sd)
    assert all(v.dtype == torch.float64 for v in sd.values())
    assert not torch.equal(sd["lm_head.weight"], sd["transformer.wte.weight"])
    for name, p in hf.named_parameters():  # bit-exact storage
        assert torch.equal(sd[name], p.detach()), name
    back = transformers.GPT2LMHeadModel.from_pretrained(
        tmp_path / "hf", attn_implementation="eager", dtype=torch.float64
    ).eval()
    toks = P.random_tokens(0, cfg.vocab_size, cfg.n_positions, batch=2)
    assert P.rel_err(P.hf_forward(back, toks)[0], P.hf_forward(hf, toks)[0]) == 0.0

    P.save_hf_layout(hf, tmp_path / "sharded", dtype="BF16", max_shard_size=2000)
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    sd = P.read_safetensors(tmp_path / "sharded")
    assert all(v.dtype == torch.bfloat16 for v in sd.values())


def test_harness_openai_layout_roundtrips_through_hf(tmp_path):
    cfg = P.random_hf_config(4, tie_word_embeddings=True, reorder_and_upcast_attn=False, n_layer=2)
    hf = P.random_hf_model(cfg, 4)
    P.save_openai_layout(hf, tmp_path)
    sd = P.read_safetensors(tmp_path)
    assert "wte.weight" in sd and "ln_f.weight" in sd and "h.1.mlp.c_proj.bias" in sd
    assert not any(k.startswith("transformer.") or k.startswith("lm_head") for k in sd)
    n = cfg.n_positions
    for L in range(2):
        bias = sd[f"h.{L}.attn.bias"]
        assert bias.dtype == torch.float32 and bias.shape == (1, 1, n, n)
        assert torch.equal(bias[0, 0], torch.tril(torch.ones(n, n)))
        mb = sd[f"h.{L}.attn.masked_bias"]
        assert mb.shape == () and mb.item() == -1e4
    assert all(v.dtype == torch.float32 for v in sd.values())
    hub_cfg = json.loads((tmp_path / "config.json").read_text())
    assert hub_cfg["model_type"] == "gpt2" and "task_specific_params" in hub_cfg
    assert hub_cfg["n_ctx"] == n and "tie_word_embeddings" not in hub_cfg
    back = transformers.GPT2LMHeadModel.from_pretrained(
        tmp_path, attn_implementation="eager", dtype=torch.float64
    ).eval()
    toks = P.random_tokens(0, cfg.vocab_size, cfg.n_positions, batch=2)
    ref = P.reference_model(hf, "F32", "float64")
    assert P.rel_err(P.hf_forward(back, toks)[0], P.hf_forward(ref, toks)[0]) == 0.0


def test_harness_hf_internals_are_consistent():
    """The hook-captured HF internals agree with HF's own outputs (hidden_states, attentions)."""
    cfg = P.random_hf_config(5, n_layer=2, reorder_and_upcast_attn=False)
    hf = P.random_hf_model(cfg, 5)
    toks = P.random_tokens(1, cfg.vocab_size, cfg.n_positions, batch=2)
    logits, hidden, extra = P.hf_forward(hf, toks, internals=True)
    for L in range(2):
        assert P.rel_err(extra[f"blocks.{L}.hook_resid_pre"], hidden[L]) == 0.0
        s = extra[f"blocks.{L}.hook_resid_pre"] + extra[f"blocks.{L}.hook_attn_out"]
        assert P.rel_err(s, extra[f"blocks.{L}.hook_resid_mid"]) < 1e-15
        s = extra[f"blocks.{L}.hook_resid_mid"] + extra[f"blocks.{L}.hook_mlp_out"]
        assert P.rel_err(s, extra[f"blocks.{L}.hook_resid_post"]) < 1e-15
        pat = extra[f"blocks.{L}.attn.hook_pattern"]
        assert np.allclose(pat.sum(-1), 1.0) and np.all(np.triu(pat, 1) == 0)
    assert P.rel_err(extra["ln_final.out"], hidden[-1]) == 0.0
    assert P.rel_err(extra["ln_final.in"], extra["blocks.1.hook_resid_post"]) == 0.0


# ----------------------------------------------------------------------------------------------
# float64: random configs over every knob, save_pretrained layout stored in F64
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(24))
def test_float64_random_config(seed, tmp_path):
    cfg = P.random_hf_config(seed)
    hf = P.random_hf_model(cfg, seed)
    P.save_hf_layout(hf, tmp_path, dtype="F64")
    model = _load(tmp_path, "float64")
    _check_cfg(model, cfg)
    ref = P.reference_model(hf, "F64", "float64")
    _compare(model, ref, cfg, seed, P.F64_TOL, "float64 vs HF", "hf layout F64")


@pytest.mark.parametrize("seed", range(6))
def test_float64_large_weights(seed, tmp_path):
    """Weights 3x larger: near one-hot attention, large residuals, logits in the hundreds."""
    seed = 50 + seed
    cfg = P.random_hf_config(seed)
    hf = P.random_hf_model(cfg, seed, scale=3.0)
    P.save_hf_layout(hf, tmp_path, dtype="F64")
    model = _load(tmp_path, "float64")
    ref = P.reference_model(hf, "F64", "float64")
    _compare(model, ref, cfg, seed, P.F64_TOL, "float64 vs HF", "large weights")


def test_default_dtype_is_float64(tmp_path):
    """refgpt.load(path) without dtype computes in float64, whatever the stored dtype says."""
    import refgpt

    cfg = P.random_hf_config(60)
    hf = P.random_hf_model(cfg, 60)
    P.save_hf_layout(hf, tmp_path, dtype="F16")
    model = refgpt.load(str(tmp_path))
    toks = P.random_tokens(60, cfg.vocab_size, cfg.n_positions, batch=2)
    logits = np.asarray(model(toks))
    assert logits.dtype == np.float64
    ref = P.reference_model(hf, "F16", "float64")
    assert P.rel_err(logits, P.hf_forward(ref, toks)[0]) <= P.F64_TOL


@pytest.mark.parametrize("act", P.ACT_FNS)
def test_float64_every_activation(act, tmp_path):
    seed = 100 + P.ACT_FNS.index(act)
    cfg = P.random_hf_config(seed, activation_function=act)
    hf = P.random_hf_model(cfg, seed)
    P.save_hf_layout(hf, tmp_path, dtype="F64")
    model = _load(tmp_path, "float64")
    _check_cfg(model, cfg)
    ref = P.reference_model(hf, "F64", "float64")
    toks = P.random_tokens(seed, cfg.vocab_size, cfg.n_positions, batch=2, pos=cfg.n_positions)
    ctx = f"act {act} | {P.describe_config(cfg)}"
    P.compare_to_hf(model, ref, toks, P.F64_TOL, ctx).check(P.F64_TOL, "float64 vs HF")


@pytest.mark.parametrize("act", P.ACT_FNS)
def test_activation_elementwise(act, tmp_path):
    """mlp.hook_post == HF's ACT2FN[act](mlp.hook_pre) elementwise, to 1e-14 in float64 (tighter
    than the model-level 1e-12, which cannot tell gelu_fast's truncated √(2/π) from gelu_new's:
    those two differ by ~1e-12 relative) and 1e-6 in float32."""
    from transformers.activations import ACT2FN

    seed = 150 + P.ACT_FNS.index(act)
    cfg = P.random_hf_config(seed, activation_function=act, n_inner=96, n_positions=32)
    hf = P.random_hf_model(cfg, seed)
    P.save_hf_layout(hf, tmp_path, dtype="F64")
    toks = P.random_tokens(seed, cfg.vocab_size, cfg.n_positions, batch=4, pos=cfg.n_positions)
    for dtype, tol in (("float64", 1e-14), ("float32", 1e-6)):
        _, cache = _load(tmp_path, dtype).run_with_cache(toks)
        for L in range(cfg.n_layer):
            pre = np.asarray(cache[f"blocks.{L}.mlp.hook_pre"])
            post = np.asarray(cache[f"blocks.{L}.mlp.hook_post"])
            assert pre.dtype == post.dtype == np.dtype(dtype)
            with torch.no_grad():
                want = ACT2FN[act](torch.tensor(pre)).numpy()
            err = P.rel_err(post, want)
            P.record_error(f"activation elementwise {dtype}", err)
            assert err <= tol, f"{act} {dtype} layer {L}: rel err {err:.3e} (|pre| ≤ {np.abs(pre).max():.1f})"


# ----------------------------------------------------------------------------------------------
# Stored dtypes x layouts: F16/BF16/F32/F64, save_pretrained (flat, sharded) and openai layouts.
# The HF reference has its weights rounded to the stored dtype, then upcast to float64.
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["hf", "hf-sharded", "openai"])
@pytest.mark.parametrize("storage", P.STORAGE_DTYPES)
def test_float64_storage_dtype_and_layout(storage, layout, tmp_path):
    seed = 200 + 10 * P.STORAGE_DTYPES.index(storage) + ["hf", "hf-sharded", "openai"].index(layout)
    over = {"tie_word_embeddings": True} if layout == "openai" else {}
    cfg = P.random_hf_config(seed, **over)
    hf = P.random_hf_model(cfg, seed)
    if layout == "openai":
        P.save_openai_layout(hf, tmp_path, dtype=storage)
    else:
        P.save_hf_layout(hf, tmp_path, dtype=storage, max_shard_size=3000 if layout == "hf-sharded" else None)
        if layout == "hf-sharded":
            assert (tmp_path / "model.safetensors.index.json").exists()
    model = _load(tmp_path, "float64")
    _check_cfg(model, cfg)
    ref = P.reference_model(hf, storage, "float64")
    _compare(model, ref, cfg, seed, P.F64_TOL, f"float64 vs HF ({storage} stored)", f"{layout} {storage}")


def test_openai_layout_real_gpt2_knobs(tmp_path):
    """The hub's own knob values (gelu_new, eps 1e-5, n_inner None, scaled attention, tied)."""
    cfg = P.random_hf_config(
        7,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        n_inner=None,
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False,
        reorder_and_upcast_attn=False,
        tie_word_embeddings=True,
        n_layer=3,
    )
    hf = P.random_hf_model(cfg, 7)
    P.save_openai_layout(hf, tmp_path)
    hub_cfg = json.loads((tmp_path / "config.json").read_text())
    assert "n_inner" not in hub_cfg and "scale_attn_weights" not in hub_cfg
    for dtype, tol, cat in (("float64", P.F64_TOL, "float64 vs HF (F32 stored)"), ("float32", P.F32_TOL, "float32 vs HF")):
        model = _load(tmp_path, dtype)
        _check_cfg(model, cfg)
        ref = P.reference_model(hf, "F32", dtype)
        _compare(model, ref, cfg, 7, tol, cat, f"openai layout, refgpt {dtype}")


# ----------------------------------------------------------------------------------------------
# float32 compute, against HF float32 (with reorder_and_upcast_attn exactly as configured)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_float32_random_config(seed, tmp_path):
    seed = 300 + seed
    cfg = P.random_hf_config(seed)
    hf = P.random_hf_model(cfg, seed)
    P.save_hf_layout(hf, tmp_path, dtype="F32")
    model = _load(tmp_path, "float32")
    _check_cfg(model, cfg)
    ref = P.reference_model(hf, "F32", "float32")
    assert ref.transformer.h[0].attn.reorder_and_upcast_attn == cfg.reorder_and_upcast_attn
    _compare(model, ref, cfg, seed, P.F32_TOL, "float32 vs HF", "hf layout F32, refgpt float32")


@pytest.mark.parametrize("layout", ["hf", "openai"])
@pytest.mark.parametrize("storage", ["F16", "BF16", "F64"])
def test_float32_storage_dtype_and_layout(storage, layout, tmp_path):
    seed = 350 + 10 * ["F16", "BF16", "F64"].index(storage) + ["hf", "openai"].index(layout)
    over = {"tie_word_embeddings": True} if layout == "openai" else {}
    cfg = P.random_hf_config(seed, **over)
    hf = P.random_hf_model(cfg, seed)
    if layout == "openai":
        P.save_openai_layout(hf, tmp_path, dtype=storage)
    else:
        P.save_hf_layout(hf, tmp_path, dtype=storage)
    model = _load(tmp_path, "float32")
    ref = P.reference_model(hf, storage, "float32")
    _compare(model, ref, cfg, seed, P.F32_TOL, "float32 vs HF", f"{layout} {storage}, refgpt float32")


@pytest.mark.parametrize("seed", range(3))
def test_reorder_and_upcast_attn(seed, tmp_path):
    """The flag on: float32 against HF float32 taking its upcast/reorder (baddbmm) path; float64
    against HF float64 with the flag off (same function in exact arithmetic; HF's path raises
    in float64)."""
    seed = 400 + seed
    cfg = P.random_hf_config(seed, reorder_and_upcast_attn=True, scale_attn_by_inverse_layer_idx=bool(seed % 2))
    hf = P.random_hf_model(cfg, seed)
    P.save_hf_layout(hf, tmp_path, dtype="F32")
    assert json.loads((tmp_path / "config.json").read_text())["reorder_and_upcast_attn"] is True
    ref32 = P.reference_model(hf, "F32", "float32")
    assert all(b.attn.reorder_and_upcast_attn for b in ref32.transformer.h)
    _compare(_load(tmp_path, "float32"), ref32, cfg, seed, P.F32_TOL, "float32 vs HF", "reorder flag, float32")
    ref64 = P.reference_model(hf, "F32", "float64")
    assert not any(b.attn.reorder_and_upcast_attn for b in ref64.transformer.h)
    _compare(_load(tmp_path, "float64"), ref64, cfg, seed, P.F64_TOL, "float64 vs HF (F32 stored)", "reorder flag, float64")


@pytest.mark.parametrize("seed", range(3))
def test_untied_lm_head(seed, tmp_path):
    """tie_word_embeddings False: logits must come from lm_head.weight, not wte."""
    seed = 500 + seed
    cfg = P.random_hf_config(seed, tie_word_embeddings=False)
    hf = P.random_hf_model(cfg, seed)
    P.save_hf_layout(hf, tmp_path, dtype="F64")
    sd = P.read_safetensors(tmp_path)
    assert "lm_head.weight" in sd and not torch.equal(sd["lm_head.weight"], sd["transformer.wte.weight"])
    model = _load(tmp_path, "float64")
    ref = P.reference_model(hf, "F64", "float64")
    toks = P.random_tokens(seed, cfg.vocab_size, cfg.n_positions, batch=2)
    logits = np.asarray(model(toks))
    hf_logits = P.hf_forward(ref, toks)[0]
    # the test discriminates: a tied head would be far off
    _, hidden = P.hf_forward(ref, toks)
    tied_logits = hidden[-1] @ P._np(ref.transformer.wte.weight).T
    assert P.rel_err(tied_logits, hf_logits) > 1e-3
    err = P.rel_err(logits, hf_logits)
    assert err <= P.F64_TOL, f"untied lm_head logits rel err {err:.3e} | {P.describe_config(cfg)}"
    P.compare_to_hf(model, ref, toks, P.F64_TOL, f"untied | {P.describe_config(cfg)}").check(P.F64_TOL, "float64 vs HF")


def test_int32_tokens_and_batch_consistency(tmp_path):
    """int32 tokens work; each row of a batch equals running that row alone."""
    cfg = P.random_hf_config(600)
    hf = P.random_hf_model(cfg, 600)
    P.save_hf_layout(hf, tmp_path, dtype="F64")
    model = _load(tmp_path, "float64")
    toks = P.random_tokens(600, cfg.vocab_size, cfg.n_positions, batch=3)
    full = np.asarray(model(toks))
    assert P.rel_err(np.asarray(model(toks.astype(np.int32))), full) == 0.0
    for i in range(3):
        assert P.rel_err(np.asarray(model(toks[i])), full[i]) <= P.F64_TOL


# ----------------------------------------------------------------------------------------------
# Property test: hypothesis draws the config, storage dtype, layout and token shape
# ----------------------------------------------------------------------------------------------


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_float64_property(data, tmp_path_factory):
    cfg = P.random_hf_config(data.draw)
    layout = data.draw(st.sampled_from(["hf", "hf-sharded", "openai"] if cfg.tie_word_embeddings else ["hf", "hf-sharded"]))
    storage = data.draw(st.sampled_from(P.STORAGE_DTYPES))
    seed = data.draw(st.integers(0, 2**31 - 1))
    batch = data.draw(st.sampled_from([None, 1, 2]))
    pos = data.draw(st.integers(1, cfg.n_positions))
    hf = P.random_hf_model(cfg, seed)
    path = tmp_path_factory.mktemp("ckpt")
    if layout == "openai":
        P.save_openai_layout(hf, path, dtype=storage)
    else:
        P.save_hf_layout(hf, path, dtype=storage, max_shard_size=3000 if layout == "hf-sharded" else None)
    model = _load(path, "float64")
    ref = P.reference_model(hf, storage, "float64")
    toks = P.random_tokens(seed, cfg.vocab_size, cfg.n_positions, batch=batch, pos=pos)
    ctx = f"{layout} {storage} seed={seed} tokens {toks.shape} | {P.describe_config(cfg)}"
    P.compare_to_hf(model, ref, toks, P.F64_TOL, ctx).check(P.F64_TOL, f"float64 vs HF ({storage} stored)")
