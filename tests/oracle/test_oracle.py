"""The oracle: it names the first tensor out of tolerance at the place an error was injected; it
does not flag an independent float32 (or bfloat16) implementation under that format's profile;
it compares logits shift-invariantly; and the HF / TransformerLens / llm.c name maps put every
tensor where refgpt has it. docs/oracle.md's worked example is checked here too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from random_models import model_and_tokens, random_model
from doc_pages import load_script
from refgpt import Config, Model, RefGPTError
from refgpt.oracle import golden, comparison as oracle
from refgpt.oracle.name_maps import axes, forward_order, hf_hidden_state_name, to_refgpt, ModelShape

ROOT = Path(__file__).resolve().parents[2]


tolerance_bench = load_script(ROOT / "benchmarks" / "oracle_tolerance.py")
example = load_script(ROOT / "docs" / "oracle_example.py")

CFG = Config(d_model=16, n_layers=3, n_heads=2, d_mlp=32, d_vocab=20, n_ctx=8)
TOKENS = np.array([[3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5, 8, 9, 7, 9, 3]])


@pytest.fixture(scope="module")
def setup():
    params = example.realistic_params(CFG, seed=3)
    ref = golden.make(Model(CFG, params), TOKENS)
    return params, ref, Model(CFG, params, dtype="float32")


# ---- the first divergence -------------------------------------------------------------------------

#: Hook points an error can be injected at, with the axes of the index drawn for them.
INJECTABLE = ["hook_embed", "hook_pos_embed"] + [
    f"blocks.{{L}}.{h}" for h in (
        "hook_resid_pre", "ln1.hook_mean", "ln1.hook_scale", "ln1.hook_normalized", "attn.hook_q",
        "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z",
        "hook_attn_out", "hook_resid_mid", "ln2.hook_normalized", "mlp.hook_pre", "mlp.hook_post",
        "hook_mlp_out", "hook_resid_post")] + ["ln_final.hook_scale", "ln_final.hook_normalized"]


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), hook=st.sampled_from(INJECTABLE), layer=st.integers(0, CFG.n_layers - 1),
       magnitude=st.sampled_from([1e-3, 1e-2, 0.1, 1.0, 10.0]))
def test_first_divergence_is_where_the_error_was_injected(setup, data, hook, layer, magnitude):
    """A float32 candidate with one element changed at (hook, batch, position, index): every
    tensor before it passes and the report's first divergence is that tensor and that element."""
    params, ref, m32 = setup
    name = hook.format(L=layer)
    shape = ref.tensors[name].shape
    b = data.draw(st.integers(0, shape[0] - 1), label="batch")
    if "attn_scores" in name or "pattern" in name:
        h, q = data.draw(st.integers(0, shape[1] - 1)), data.draw(st.integers(0, shape[2] - 1), label="pos")
        index = (b, h, q, data.draw(st.integers(0, q), label="key_pos"))  # causal part only
    else:
        index = (b,) + tuple(data.draw(st.integers(0, n - 1)) for n in shape[1:])
    r = ref.tensors[name]
    S = max(1.0, float(np.max(np.abs(r[np.isfinite(r)]))))
    delta = magnitude * S
    u = oracle.UNIT_ROUNDOFF["float32"]
    assume(delta > 2 * oracle.GROWTH * u * (ref.conditioning[name] + S + abs(r[index]) + delta))

    def inject(a, _):
        a = a.copy()
        a[index] += np.float32(delta)
        return a

    cand = golden.compute(m32, TOKENS, fwd_hooks=[(name, inject)])
    report = oracle.compare(ref, cand, profile="float32")
    first = report.first_divergence
    assert first is not None and first.name == name, report.table()
    assert first.first_bad.index == index
    assert first.layer == (layer if name.startswith("blocks.") else None)
    position_axis = "pos"
    assert first.first_bad.where[position_axis] == index[axes(name, len(index)).index(position_axis)]
    assert all(t.ok for t in report.tensors[: report.tensors.index(first)])


def test_report_names_layer_position_and_index_in_words(setup):
    params, ref, m32 = setup

    def inject(a, _):
        a = a.copy()
        a[1, 5, 7] += 0.5
        return a

    report = oracle.compare(ref, golden.compute(m32, TOKENS, fwd_hooks=[("blocks.2.hook_resid_mid", inject)]))
    text = report.table()
    assert "first divergence: blocks.2.hook_resid_mid (layer 2), first at batch 1, pos 5, d_model 7 (index [1, 5, 7])" in text
    assert "FIRST DIVERGENCE" in text and not report.ok


# ---- no false alarms ------------------------------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=60, deadline=None, derandomize=True)
@given(case=model_and_tokens(), fmt=st.sampled_from(["float32", "bfloat16", "float16"]), seed=st.integers(0, 2**16))
def test_profile_accepts_an_independent_implementation_in_its_format(case, fmt, seed):
    """refgpt in float32 with an extra rounding at every activation (and, for 16-bit formats,
    activations stored in that format) passes the format's profile against the float64 golden."""
    model, tokens = case
    assume(model.cfg.d_model >= 2)  # a 1-wide LayerNorm is exact in any implementation (benchmarks/oracle_tolerance.py)
    params = {k: v.astype(np.float32).astype(np.float64) for k, v in model.params.items()}
    exact = Model(model.cfg, params)
    ref = golden.make(exact, tokens)
    cand = tolerance_bench.independent_run(model.cfg, params, tokens, fmt, seed)
    report = oracle.compare(ref, cand, profile=fmt)
    assert report.ok, report.table()


@pytest.mark.slow
@settings(max_examples=40, deadline=None, derandomize=True)
@given(case=model_and_tokens())
def test_float32_profile_does_not_flag_refgpt_float32_against_float64(case):
    model, tokens = case
    ref = golden.make(model, tokens)
    m32 = Model(model.cfg, dict(model.params), dtype="float32")
    report = oracle.compare(ref, golden.compute(m32, tokens))  # profile from the candidate: float32
    assert report.tolerance["profile"] == "float32"
    assert report.ok, report.table()


def test_profile_scales_with_the_format_and_the_measured_conditioning(setup):
    params, ref, m32 = setup
    report = oracle.compare(ref, golden.compute(m32, TOKENS), profile="bfloat16")
    t = report["blocks.1.hook_resid_mid"]
    u = 2.0**-8
    S = max(1.0, float(np.abs(ref.tensors["blocks.1.hook_resid_mid"]).max()))
    assert t.rtol == oracle.GROWTH * u
    assert t.atol == pytest.approx(oracle.GROWTH * u * (ref.conditioning["blocks.1.hook_resid_mid"] + S))
    explicit = oracle.compare(ref, golden.compute(m32, TOKENS), atol=0.0, rtol=0.0)
    assert not explicit.ok and explicit.first_divergence.name == "blocks.0.hook_resid_pre"


# ---- logits ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_golden_logits_are_the_plain_forward_bit_for_bit(dtype):
    """docs/oracle.md: keeping every activation (scores and patterns too) changes no rounding, at a
    length past the forward's blocks of 64 queries."""
    cfg = Config(d_model=16, n_layers=2, n_heads=2, d_mlp=32, d_vocab=20, n_ctx=140)
    model = random_model(cfg, seed=4, dtype=dtype)
    tokens = np.random.default_rng(4).integers(0, cfg.d_vocab, (2, cfg.n_ctx))
    assert np.array_equal(golden.make(model, tokens).tensors["logits"], model(tokens))


def test_logits_are_compared_shift_invariantly(setup):
    """A candidate whose logits are moved by a constant per position (a centred unembedding) is not
    flagged; changing one logit is."""
    params, ref, m32 = setup
    cand = golden.compute(m32, TOKENS)
    shift = np.arange(16, dtype=np.float32).reshape(2, 8, 1) * 3.5 - 20.0  # [batch, pos, 1]
    shifted = dict(cand, logits=cand["logits"] + shift)
    report = oracle.compare(ref, shifted)
    assert report.ok, report.table()
    assert report["logits"].row.largest == pytest.approx(32.5, rel=1e-5)  # raw logits differ by the shift...
    assert report["logits"].row.largest_at == [1, 7] and report["logits"].max_abs < 1e-4  # ...which is taken out
    assert report.logits.max_shift == pytest.approx(32.5, rel=1e-5)
    assert report.logits.top1_agreement == 1.0 and report.logits.top5_agreement == 1.0
    bumped = cand["logits"].copy()
    bumped[1, 3, 4] += 0.01
    report = oracle.compare(ref, dict(cand, logits=bumped))
    first = report.first_divergence
    assert first.name == "logits" and first.first_bad.index == (1, 3, 4) and first.frac_out == 1 / bumped.size
    assert report.logits.max_kl > 0


def test_top1_and_kl_report_a_changed_prediction(setup):
    params, ref, m32 = setup
    cand = golden.compute(m32, TOKENS)
    swapped = cand["logits"].copy()
    top = swapped[0, 2].argmax()
    swapped[0, 2, top] -= 100.0  # position (0, 2) now predicts something else
    report = oracle.compare(ref, {"tokens": TOKENS, "logits": swapped})
    assert report.logits.top1_agreement == pytest.approx(15 / 16)
    assert report.logits.max_kl > 0.1


# ---- what is compared, and how ------------------------------------------------------------------


def test_masked_attention_scores_are_not_compared(setup):
    params, ref, m32 = setup
    cand = golden.compute(m32, TOKENS)
    name = "blocks.0.attn.hook_attn_scores"
    garbage = cand[name].copy()
    garbage[..., np.triu(np.ones((8, 8), dtype=bool), 1)] = -1e4  # what HF's older masking leaves
    assert oracle.compare(ref, dict(cand, **{name: garbage}))[name].ok


def test_shape_mismatch_different_tokens_and_nan_are_divergences(setup):
    params, ref, m32 = setup
    cand = golden.compute(m32, TOKENS)
    report = oracle.compare(ref, dict(cand, **{"blocks.1.attn.hook_z": cand["blocks.1.attn.hook_z"][:, :, :1]}))
    assert report.first_divergence.name == "blocks.1.attn.hook_z"
    assert report.first_divergence.status == "shape mismatch"
    other = TOKENS.copy()
    other[1, 6] = 0
    report = oracle.compare(ref, dict(cand, tokens=other))
    assert report.first_divergence.name == "tokens" and report.first_divergence.first_bad.index == (1, 6)
    nan = cand["ln_final.out"].copy()
    nan[0, 1, 2] = np.nan
    report = oracle.compare(ref, dict(cand, **{"ln_final.out": nan}))
    assert report.first_divergence.name == "ln_final.out" and report.first_divergence.first_bad.index == (0, 1, 2)


def test_missing_and_unknown_names_are_listed_not_failed(setup):
    params, ref, m32 = setup
    cand = golden.compute(m32, TOKENS)
    partial = {k: v for k, v in cand.items() if "attn" not in k}
    partial["my_debug_tensor"] = np.zeros(3)
    report = oracle.compare(ref, partial)
    assert report.ok
    assert "blocks.0.attn.hook_q" in report.missing and report.unexpected == ["my_debug_tensor"]
    assert "not in the candidate" in report.table()


def test_bad_arguments_are_refgpt_errors(setup):
    params, ref, m32 = setup
    with pytest.raises(RefGPTError, match="no tensor names in common"):
        oracle.compare(ref, {"hidden_states.0": np.zeros((2, 8, 16))})
    with pytest.raises(RefGPTError, match="either a profile or atol/rtol"):
        oracle.compare(ref, ref, profile="float32", atol=1e-3)
    with pytest.raises(RefGPTError, match="unknown profile 'float8'"):
        oracle.compare(ref, ref, profile="float8")
    with pytest.raises(RefGPTError, match="unknown name map 'jax'"):
        oracle.compare(ref, ref, name_map="jax")


def test_candidate_without_batch_axis_is_compared_as_batch_one():
    model = random_model(CFG, 5)
    ref = golden.make(model, TOKENS[:1])
    cand = {k: v[0] for k, v in golden.compute(model, TOKENS[:1]).items()}
    report = oracle.compare(ref, cand, profile="float64")
    assert report.ok and "no batch axis" in report["blocks.0.hook_resid_pre"].notes[0]


def test_forward_order_is_the_order_the_forward_pass_computes():
    model = random_model(CFG, 0)
    names = golden.golden_names(model)
    assert forward_order(reversed(names)) == names
    hooks = [n for n in names if n in model.hook_names]
    assert hooks == model.hook_names  # the model's own hook order
    assert names.index("blocks.0.ln1.out") == names.index("blocks.0.ln1.hook_normalized") + 1
    assert names[0] == "tokens" and names[-3:] == ["log_probs", "targets", "loss"]


# ---- the docs' worked example ---------------------------------------------------------------------


def test_docs_example_erf_gelu_is_named_at_the_first_mlp_post_and_eps_at_the_first_scale(tmp_path):
    reports = example.run(tmp_path)
    erf = reports["erf_gelu"].first_divergence
    assert erf.name == "blocks.0.mlp.hook_post" and reports["erf_gelu"].tolerance["profile"] == "float32"
    eps = reports["eps_outside_sqrt"].first_divergence
    assert eps.name == "blocks.0.ln1.hook_scale" and reports["eps_outside_sqrt"].tolerance["profile"] == "float64"
    assert all(t.ok for t in reports["erf_gelu"].tensors[: reports["erf_gelu"].tensors.index(erf)])


def test_docs_claim_eps_outside_sqrt_is_within_float32_elementwise_but_caught_by_its_bias():
    """docs/oracle.md: in a float32 port, σ = √var + ε moves each σ by less than the elementwise
    float32 tolerance, but every σ the same way: the bias bound names it at ln1.hook_scale."""
    port = Model(example.CFG, example.realistic_params(), dtype="float32")
    eps = example.CFG.eps
    cand = golden.compute(port, example.TOKENS, fwd_hooks=[
        (lambda n: n.endswith("hook_scale"), lambda s, n: (np.sqrt(s * s - eps) + eps).astype(np.float32))])
    report = oracle.compare(example.reference(), cand)
    first = report.first_divergence
    assert first.name == "blocks.0.ln1.hook_scale" and first.status == "systematic error"
    assert first.max_over_tol < 1 and first.frac_out == 0


# ---- name maps ------------------------------------------------------------------------------------


def test_hf_hidden_states_index_i_is_resid_pre_of_block_i_and_the_last_is_after_ln_f():
    assert [hf_hidden_state_name(i, 3) for i in range(4)] == [
        "blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre", "blocks.2.hook_resid_pre", "ln_final.out"]
    with pytest.raises(RefGPTError, match="outside 0..3"):
        hf_hidden_state_name(4, 3)
    stacked = np.zeros((4, 1, 2, 8))
    mapped, _ = to_refgpt({"hidden_states": stacked, "loss": np.float64(1.0)}, "hf", ModelShape(3, 2, 10))
    assert sorted(mapped) == sorted(["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre",
                                     "blocks.2.hook_resid_pre", "ln_final.out", "loss_mean"])


def test_llmc_map_splits_qkv_inverts_rstd_and_cuts_the_padded_vocabulary(setup):
    params, ref, m32 = setup
    g = ref.tensors
    B, T = TOKENS.shape
    qkv = np.concatenate([g[f"blocks.{l}.attn.hook_{x}"].reshape(B, T, -1)[None] for l in range(1) for x in "qkv"], -1)
    llmc = {"qkv": np.concatenate([qkv] * 3), "ln1_rstd": np.stack([1 / g[f"blocks.{l}.ln1.hook_scale"][..., 0] for l in range(3)]),
            "logits": np.concatenate([g["logits"], np.zeros((B, T, 108))], -1),
            "losses": np.concatenate([g["loss"], np.zeros((B, 1))], -1)}
    mapped, notes = to_refgpt(llmc, "llmc", ModelShape(3, 2, 20))
    assert np.array_equal(mapped["blocks.0.attn.hook_k"], g["blocks.0.attn.hook_k"])
    assert np.allclose(mapped["blocks.2.ln1.hook_scale"], g["blocks.2.ln1.hook_scale"], rtol=1e-15, atol=0)
    assert mapped["logits"].shape == (B, T, 20) and mapped["loss"].shape == (B, T)  # compare drops the last
    assert any("padded vocabulary 128 cut to 20" in n for n in notes)


def _peers():
    torch = pytest.importorskip("torch", reason="HF/TL name-map tests need the 'peers' extra (torch)")
    pytest.importorskip("transformers", reason="HF name-map tests need the 'peers' extra (transformers)")
    import peers

    return torch, peers


def _hf_setup(tmp_path, peers, seed=11):
    cfg = peers.random_hf_config(seed, n_layer=2, n_positions=16, tie_word_embeddings=True,
                                 reorder_and_upcast_attn=False, activation_function="gelu_new")
    hf = peers.random_hf_model(cfg, seed, dtype="float64", f32_exact=True)
    peers.save_hf_layout(hf, tmp_path, dtype="F64")  # HF holds float64 LayerNorm gains 1 + x
    tokens = np.random.default_rng(seed).integers(0, cfg.vocab_size, size=(2, 9))
    return cfg, hf, tokens


@pytest.mark.peer
def test_hf_hidden_states_from_a_real_hf_model_match_the_golden_file(tmp_path):
    torch, peers = _peers()
    dump = load_script(ROOT / "benchmarks" / "dump_hf_tl.py")
    cfg, hf, tokens = _hf_setup(tmp_path, peers)
    import refgpt

    ref = golden.make(refgpt.load(tmp_path), tokens)
    cand = dump.hf_candidate(hf, tokens)  # float64
    report = oracle.compare(ref, cand, name_map="hf")
    assert report.tolerance["profile"] == "float64"
    assert report.ok, report.table()
    compared = {t.name for t in report.tensors}
    assert {"blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre", "ln_final.out", "blocks.1.attn.hook_pattern",
            "logits"} <= compared
    cand32 = dump.hf_candidate(peers.as_dtype(hf, "float32"), tokens)
    assert oracle.compare(ref, cand32, name_map="hf").ok
    # Off by one — the classic misreading of hidden_states — is caught at the first block.
    shifted = {f"hidden_states.{i}": cand[f"hidden_states.{i + 1}"] for i in range(cfg.n_layer)}
    report = oracle.compare(ref, shifted, name_map="hf")
    assert report.first_divergence.name == "blocks.0.hook_resid_pre"


@pytest.mark.peer
def test_transformer_lens_cache_matches_the_golden_file_under_the_tl_map(tmp_path):
    torch, peers = _peers()
    pytest.importorskip("transformer_lens", reason="TL name-map test needs the 'peers' extra (transformer_lens)")
    dump = load_script(ROOT / "benchmarks" / "dump_hf_tl.py")
    cfg, hf, tokens = _hf_setup(tmp_path, peers, seed=12)
    import refgpt

    ref = golden.make(refgpt.load(tmp_path), tokens)
    tl = peers.tl_model_from_hf(hf, "float64")
    report = oracle.compare(ref, dump.tl_candidate(tl, tokens), name_map="tl")
    assert report.ok, report.table()
    names = {t.name for t in report.tensors}
    assert "ln_final.out" in names and "blocks.1.attn.hook_attn_scores" in names  # unembed.hook_in, −∞ masked
    assert not report.unexpected
