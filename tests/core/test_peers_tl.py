"""refgpt's activation cache against TransformerLens 3.9's run_with_cache, float64.

TL is built offline from the same random HF model (hand-made HookedTransformerConfig,
convert_gpt2_weights, load_and_process_state_dict with all processing off, then the float64 state
dict reloaded because TL 3.9 rounds it to float32 on the way in; see peers.tl_model_from_hf).
Every entry of TL's cache must be in refgpt's cache under the same name, with the same shape,
equal to ≤ 1e-11 relative; attention scores are compared where TL's are finite, and refgpt must be
-inf exactly where TL is. TL's two unembed hooks (unembed.hook_in / hook_out), which refgpt's
contract does not name, are checked against refgpt's ln_final output and logits instead.

Needs the 'peers' extra; skipped without it.
"""

from __future__ import annotations

import numpy as np
import pytest

from peers import require_peers

torch, transformers, transformer_lens = require_peers()
pytestmark = pytest.mark.peer  # every test here compares with a peer (the peers extra)

import peers as P  # noqa: E402  (after the importorskip)

P.dump_errors_at_exit()

#: TL cache names refgpt's contract does not include; compared through derived values.
TL_EXTRA = ("unembed.hook_in", "unembed.hook_out")
#: Names in refgpt's cache that TL 3.9 does not have.
REFGPT_ONLY_SUFFIX = ".hook_mean"


def _tl_setup(seed, tmp_path, **over):
    cfg = P.random_hf_config(seed, act_fns=tuple(P.TL_ACT_FNS), **over)
    hf = P.random_hf_model(cfg, seed)
    tl = P.tl_model_from_hf(hf, "float64")
    P.save_hf_layout(hf, tmp_path, dtype="F64")
    return cfg, hf, tl


def _compare_caches(model, tl, tokens, context):
    tokens = np.asarray(tokens)
    batched = tokens.ndim == 2
    tl_logits, tl_cache = P.tl_run_with_cache(tl, tokens)
    logits, cache = model.run_with_cache(tokens)
    logits = np.asarray(logits)
    log = P.ErrLog(context)
    log.add("logits", logits, tl_logits if batched else tl_logits[0])
    log.add("model(tokens) logits", np.asarray(model(tokens)), tl_logits if batched else tl_logits[0])
    names = set(cache.keys())
    missing = sorted(set(tl_cache) - names - set(TL_EXTRA))
    assert not missing, f"refgpt cache lacks TL names {missing} [{context}]"
    extra = sorted(n for n in names - set(tl_cache) if not n.endswith(REFGPT_ONLY_SUFFIX) and n not in TL_EXTRA)
    assert not extra, f"refgpt cache has names TL does not: {extra} [{context}]"
    for name, ref in tl_cache.items():
        if name in TL_EXTRA and name not in names:
            continue
        a = np.asarray(cache[name])
        assert a.dtype == np.float64, f"{name}: dtype {a.dtype} [{context}]"
        assert a.shape == ref.shape, f"{name}: shape {a.shape} != TL {ref.shape} [{context}]"
        if name.endswith("hook_attn_scores"):
            assert np.isneginf(ref).any() or tokens.shape[-1] == 1
            assert np.array_equal(np.isneginf(a), np.isneginf(ref)), f"{name}: -inf mask differs [{context}]"
            log.add(name, a, ref, finite_only=True)
        elif name.endswith("hook_pattern"):
            masked = np.triu(np.ones(ref.shape[-2:], dtype=bool), 1)
            assert np.all(ref[..., masked] == 0)
            assert np.all(a[..., masked] == 0), f"{name}: nonzero weight on a future token [{context}]"
            log.add(name, a, ref)
        else:
            log.add(name, a, ref)
    # TL's unembed hooks, via refgpt's own values
    w = P._np(tl.ln_final.w)
    b = P._np(tl.ln_final.b)
    log.add("unembed.hook_in ~ ln_final out", np.asarray(cache["ln_final.hook_normalized"]) * w + b, tl_cache["unembed.hook_in"])
    log.add("unembed.hook_out ~ logits", logits if batched else logits[None], tl_cache["unembed.hook_out"])
    return log


# ----------------------------------------------------------------------------------------------
# Harness sanity: TL built offline holds HF's float64 weights and reproduces HF
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_harness_tl_matches_hf(seed):
    cfg = P.random_hf_config(700 + seed, act_fns=tuple(P.TL_ACT_FNS))
    hf = P.random_hf_model(cfg, 700 + seed)
    tl = P.tl_model_from_hf(hf, "float64")  # asserts every TL weight is float64 and == HF's
    assert all(p.dtype == torch.float64 for p in tl.parameters())
    assert torch.equal(tl.unembed.W_U, hf.lm_head.weight.T)
    toks = P.random_tokens(seed, cfg.vocab_size, cfg.n_positions, batch=2)
    ref = P.reference_model(hf, "F64", "float64")
    hf_logits, hidden, extra = P.hf_forward(ref, toks, internals=True)
    tl_logits, tl_cache = P.tl_run_with_cache(tl, toks)
    log = P.ErrLog(f"TL vs HF | {P.describe_config(cfg)}")
    log.add("logits", tl_logits, hf_logits)
    for name, v in extra.items():
        if name in tl_cache:
            log.add(name, tl_cache[name], v)
    log.add("ln_final out", tl_cache["unembed.hook_in"], hidden[-1])
    assert len(log.errs) > 10
    log.check(1e-12, "harness: TL vs HF float64")


def test_harness_tl_untied_head():
    cfg = P.random_hf_config(710, act_fns=tuple(P.TL_ACT_FNS), tie_word_embeddings=False)
    hf = P.random_hf_model(cfg, 710)
    tl = P.tl_model_from_hf(hf, "float64")
    assert torch.equal(tl.unembed.W_U, hf.lm_head.weight.T)
    assert not torch.equal(tl.unembed.W_U, hf.transformer.wte.weight.T)


# ----------------------------------------------------------------------------------------------
# refgpt vs TL
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_cache_matches_tl(seed, tmp_path):
    seed = 800 + seed
    cfg, hf, tl = _tl_setup(seed, tmp_path)
    model = P.refgpt_load(tmp_path, "float64")
    rng = np.random.default_rng(seed)
    for toks in (
        P.random_tokens(rng, cfg.vocab_size, cfg.n_positions, batch=3),
        P.random_tokens(rng, cfg.vocab_size, cfg.n_positions, pos=cfg.n_positions),
    ):
        ctx = f"tokens {toks.shape} | {P.describe_config(cfg)}"
        _compare_caches(model, tl, toks, ctx).check(P.TL_TOL, "float64 vs TL")


@pytest.mark.parametrize("act", tuple(P.TL_ACT_FNS))
def test_cache_matches_tl_every_activation(act, tmp_path):
    seed = 900 + tuple(P.TL_ACT_FNS).index(act)
    cfg, hf, tl = _tl_setup(seed, tmp_path, activation_function=act)
    model = P.refgpt_load(tmp_path, "float64")
    toks = P.random_tokens(seed, cfg.vocab_size, cfg.n_positions, batch=2)
    _compare_caches(model, tl, toks, f"act {act} | {P.describe_config(cfg)}").check(P.TL_TOL, "float64 vs TL")


@pytest.mark.parametrize(
    "over",
    [
        dict(scale_attn_weights=False, scale_attn_by_inverse_layer_idx=True, n_layer=3),
        dict(scale_attn_weights=True, scale_attn_by_inverse_layer_idx=True, n_layer=3),
        dict(tie_word_embeddings=False, n_inner=7),
        dict(layer_norm_epsilon=0.5, n_head=1),
        dict(reorder_and_upcast_attn=True, n_positions=32),
    ],
    ids=["noscale-inv", "scale-inv", "untied-ninner", "bigeps-1head", "reorder"],
)
def test_cache_matches_tl_knobs(over, tmp_path):
    cfg, hf, tl = _tl_setup(950, tmp_path, **over)
    model = P.refgpt_load(tmp_path, "float64")
    toks = P.random_tokens(950, cfg.vocab_size, cfg.n_positions, batch=2, pos=cfg.n_positions)
    _compare_caches(model, tl, toks, f"{over} | {P.describe_config(cfg)}").check(P.TL_TOL, "float64 vs TL")


@pytest.mark.parametrize("seed", range(3))
def test_cache_matches_tl_large_weights(seed, tmp_path):
    seed = 970 + seed
    cfg = P.random_hf_config(seed, act_fns=tuple(P.TL_ACT_FNS))
    hf = P.random_hf_model(cfg, seed, scale=3.0)
    tl = P.tl_model_from_hf(hf, "float64")
    P.save_hf_layout(hf, tmp_path, dtype="F64")
    model = P.refgpt_load(tmp_path, "float64")
    toks = P.random_tokens(seed, cfg.vocab_size, cfg.n_positions, batch=2, pos=cfg.n_positions)
    _compare_caches(model, tl, toks, f"large weights | {P.describe_config(cfg)}").check(P.TL_TOL, "float64 vs TL")


def test_run_with_cache_names_subset(tmp_path):
    """names=[...] caches (at least) those names, with the same values as the full cache."""
    cfg, hf, tl = _tl_setup(960, tmp_path, n_layer=2)
    model = P.refgpt_load(tmp_path, "float64")
    toks = P.random_tokens(960, cfg.vocab_size, cfg.n_positions, batch=2)
    _, tl_cache = P.tl_run_with_cache(tl, toks)
    want = ["blocks.1.attn.hook_pattern", "blocks.0.ln2.hook_scale", "ln_final.hook_normalized", "hook_embed"]
    logits, cache = model.run_with_cache(toks, names=want)
    assert set(want) <= set(cache.keys())
    for n in want:
        assert P.rel_err(np.asarray(cache[n]), tl_cache[n]) <= P.TL_TOL, n
