"""Quantization error vs implementation error (refgpt/oracle/quantized.py), on a NumPy port that
computes as ggml does (tests/quantized_port.py): correct at Q8_0 and Q4_0 it passes every product's
local bound while its quantization error is reported per tensor; each planted kernel bug is named
at its op and layer as an implementation error, never as quantization."""

from __future__ import annotations

import json

import numpy as np
import pytest

import refgpt
from quantized_port import QuantizedPort, flash_attention
from random_models import tied_model
from refgpt import Config
from refgpt.oracle import golden
from hypothesis import given, settings
from hypothesis import strategies as st

from refgpt.oracle.quantized import attention_bound, format_split, linear_bound, nmse, split

CFG = Config(d_model=64, n_layers=2, n_heads=4, d_mlp=128, d_vocab=96, n_ctx=16)
TOKENS = np.array([3, 17, 42, 5, 88, 1, 60, 9])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quantized")
    model = tied_model(CFG, 11)
    float_golden = golden.make(model, TOKENS[None], command=["test"])
    files = {}
    for kind in ("Q8_0", "Q4_0"):
        path = refgpt.save(model, tmp / f"m.{kind}.gguf", type=kind)
        quantized = refgpt.load(path)
        files[kind] = (path, quantized, golden.make(quantized, TOKENS[None], command=["test"]))
    return float_golden, files


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0"])
def test_a_correct_port_passes_and_its_quantization_error_is_reported(setup, kind):
    float_golden, files = setup
    path, model, quantized_golden = files[kind]
    assert json.loads(quantized_golden.metadata["quantization"])["blk.0.ffn_up.weight"] == kind
    report = split(float_golden, quantized_golden, QuantizedPort(path).run(TOKENS), model)
    assert report.ok, format_split(report)
    assert len(report.ops) == 9 * CFG.n_layers + 2  # every product, LayerNorm, attention, GELU and residual add after the MLP
    logits = next(t for t in report.tensors if t.name == "logits")
    assert logits.quantization_nmse > 0 and logits.implementation_nmse > 0
    # the port's own error (activations rounded to 8 bits, float32) is below the file's quantization
    # at Q4_0; at Q8_0 both are 8-bit roundings of comparable size: each reported, neither judged here
    if kind == "Q4_0":
        assert logits.implementation_nmse < logits.quantization_nmse, format_split(report)
    text = format_split(report)
    assert "every product within its bound" in text and "blocks.1.mlp.hook_pre" in text


@pytest.mark.parametrize("kind, bug", [("Q4_0", "nibble_order"), ("Q8_0", "misaligned_block"), ("Q4_0", "misaligned_block"),
                                       ("Q8_0", "scale_rounded_twice"), ("Q4_0", "scale_rounded_twice")])
def test_planted_kernel_bugs_are_named_at_their_op_as_implementation_errors(setup, kind, bug):
    float_golden, files = setup
    path, model, quantized_golden = files[kind]
    report = split(float_golden, quantized_golden, QuantizedPort(path, bugs=[bug]).run(TOKENS), model)
    first = report.first_failure
    assert first is not None, format_split(report)
    assert (first.op, first.weight) == ("blocks.0.attn.hook_qkv", "blk.0.attn_qkv.weight"), format_split(report)
    assert "implementation error at blocks.0.attn.hook_qkv" in format_split(report)
    failing = {op.op for op in report.ops if not op.ok}
    assert len(failing) >= 4 * CFG.n_layers, failing  # every quantized product is wrong, each judged on its own input


@pytest.mark.parametrize("bug", ["attention_scale", "key_dropped"])
def test_a_planted_attention_bug_is_named_at_z(setup, bug):
    """z is judged on the port's own q, k, v (attention_bound): a wrong scale or a dropped key is out of
    its bound at layer 0's z, while the product before it (q, k, v) is within its own."""
    float_golden, files = setup
    path, model, quantized_golden = files["Q8_0"]
    report = split(float_golden, quantized_golden, QuantizedPort(path, bugs=[bug]).run(TOKENS), model)
    first = report.first_failure
    assert first is not None and (first.op, first.weight) == ("blocks.0.attn.hook_z", "(attention)"), format_split(report)
    assert "implementation error at blocks.0.attn.hook_z (attention)" in format_split(report)
    assert {op.op for op in report.ops if op.weight == "(attention)" and not op.ok} == {
        f"blocks.{L}.attn.hook_z" for L in range(CFG.n_layers)}
    assert min(op.worst for op in report.ops if not op.ok) > 100  # docs/oracle.md


def _softmax_f16_product(q, k, v):
    """ggml without flash attention: f16 K and V, q rounded to f16 for the f16 dot, float32 scores and
    softmax (its sum in double), the probabilities rounded to f16 and multiplied by v̂ in float32."""
    T, H, e = q.shape
    q16, k16, v16 = (t.astype(np.float16).astype(np.float32) for t in (q, k, v))
    s = (np.einsum("qhe,khe->hqk", q16, k16) * np.float32(1 / np.sqrt(np.float32(e)))).astype(np.float32)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf).astype(np.float32)
    w = np.exp(s - s.max(-1, keepdims=True)).astype(np.float32)
    p = (w * np.float32(1 / w.sum(-1, keepdims=True, dtype=np.float64))).astype(np.float16).astype(np.float32)
    return np.einsum("hqk,khe->qhe", p, v16).astype(np.float32)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), T=st.integers(1, 24), H=st.integers(1, 3), e=st.sampled_from([8, 16, 64]),
       size=st.floats(0.01, 6))
def test_ggmls_attention_is_within_the_attention_bound(seed, T, H, e, size):
    """Both of ggml-cpu's attentions (flash attention's f16 online softmax; softmax then an f16
    product) on random q, k, v land within attention_bound."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((T, H, e)).astype(np.float32) * size for _ in range(3))
    reference, bound = attention_bound(q, k, v)
    for z in (flash_attention(q, k, v), _softmax_f16_product(q, k, v)):
        assert np.all(np.abs(z - reference) <= bound), float(np.max(np.abs(z - reference) / bound))


@pytest.mark.parametrize("seed", range(10))
def test_a_wrong_scale_or_a_dropped_key_is_out_of_the_attention_bound(seed):
    """On q, k, v of unit size (scores of unit spread: no key's weight negligible — with scores
    spread by tens a dropped key of weight 10⁻¹¹ changes nothing to find), each bug is out of bounds."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((8, 2, 16)).astype(np.float32) for _ in range(3))
    reference, bound = attention_bound(q, k, v)
    for bug in ("attention_scale", "key_dropped"):
        assert np.max(np.abs(flash_attention(q, k, v, [bug]) - reference) / bound) > 10, bug


def test_the_bound_holds_for_ggml_rounding_and_is_tight(setup):
    """On random rows the product of the rounded activations lands within the bound, and the bound
    is far below the activation rounding itself (so rounding the activations wrongly is caught)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 128)).astype(np.float32)  # [rows, d_in]
    W = rng.standard_normal((128, 32))  # [d_in, d_out]
    reference, bound = linear_bound(x, W, None, "Q8_0")
    plain = x.astype(np.float64) @ W  # [rows, d_out]: the product without ggml's rounding of x
    assert np.all(np.abs(plain - reference) > 0)
    assert np.median(np.abs(plain - reference) / bound) > 100
    assert nmse(reference, plain) > 0


def test_compare_on_the_command_line_splits_the_two_errors(setup, tmp_path, capsys):
    from refgpt.cli import main

    float_golden, files = setup
    path, model, quantized_golden = files["Q4_0"]
    golden.write(tmp_path / "float.safetensors", float_golden)
    golden.write(tmp_path / "q.safetensors", quantized_golden)
    for bugs, status in (([], 0), (["nibble_order"], 1)):
        np.savez(tmp_path / "port.npz", **QuantizedPort(path, bugs=bugs).run(TOKENS))
        argv = ["compare", str(tmp_path / "q.safetensors"), str(tmp_path / "port.npz"),
                "--float-golden", str(tmp_path / "float.safetensors"), "--gguf", str(path)]
        assert main(argv) == status
        out = capsys.readouterr().out
        assert ("every product within its bound" in out) == (status == 0)
        assert main(argv + ["--json"]) == status
        report = json.loads(capsys.readouterr().out)
        assert report["ok"] == (status == 0) and report["quantization"]["blk.0.attn_qkv.weight"] == "Q4_0"
    with pytest.raises(SystemExit) as usage:
        main(["compare", str(tmp_path / "q.safetensors"), str(tmp_path / "port.npz"), "--gguf", str(path)])
    assert usage.value.code == 2 and "--float-golden and --gguf go together" in capsys.readouterr().err


def test_llama_cpp_names_map_to_refgpts(setup):
    """llama.cpp's graph names, as its eval callback sees them ([pos, width]), → refgpt's: the port's
    own tensors renamed to llama.cpp's come back unchanged, and the products judge the same."""
    from refgpt.oracle.quantized import LLAMA_CPP_NAMES, from_llama_cpp, judge_products

    _, files = setup
    path, model, _ = files["Q8_0"]
    ours = QuantizedPort(path).run(TOKENS)
    back = {v: k for k, v in LLAMA_CPP_NAMES.items()}
    captured = {"result_norm": ours["ln_final.out"][0], "result_output": ours["logits"][0],
                "embd": ours["hook_embed"][0], "pos_embd": ours["hook_pos_embed"][0], "inpL": ours["blocks.0.hook_resid_pre"][0]}
    for L in range(CFG.n_layers):
        a = f"blocks.{L}."
        captured[f"wqkv_b-{L}"] = np.concatenate([ours[a + f"attn.hook_{x}"][0].reshape(len(TOKENS), -1) for x in "qkv"], 1)
        for refgpt_name, llama_name in back.items():
            captured[f"{llama_name}-{L}"] = ours[a + refgpt_name][0].reshape(len(TOKENS), -1)
    mapped = from_llama_cpp(captured, CFG)
    for name, value in mapped.items():
        assert np.array_equal(value, ours[name]), name
    verdicts = judge_products(model, mapped, model.quantization)
    # llama.cpp names no tensor after W_O and b_O: W_O's product is judged as the span ending at resid_mid
    expected = [v.op.replace("hook_attn_out", "hook_resid_mid") for v in judge_products(model, ours, model.quantization)]
    assert [v.op for v in verdicts] == expected and len(expected) == 9 * CFG.n_layers + 2
    assert all(v.ok for v in verdicts), [(v.op, v.worst) for v in verdicts]
    # a wrong attention output (a thousandth of b_O missing) is named at the span
    wrong = dict(mapped)
    wrong["blocks.1.hook_resid_mid"] = mapped["blocks.1.hook_resid_mid"] - 1e-3 * model.params["blocks.1.attn.b_O"]
    first = next(v for v in judge_products(model, wrong, model.quantization) if not v.ok)
    assert (first.op, first.weight) == ("blocks.1.hook_resid_mid", "blk.1.attn_output.weight")


def test_ggmls_gelu_table_is_within_the_gelu_bound_and_a_wrong_coefficient_is_not():
    """ggml's F32 GELU (x rounded to float16, a float16 table of its float32 formula, clamped at
    ±10), emulated bit for bit in NumPy on a fine grid, lies within gelu_bound; with llama.cpp's
    constant 0.044715 mistyped as 0.0044715 (the long run's planted bug) it does not."""
    from refgpt.oracle.quantized import gelu_bound

    x = np.linspace(-12, 12, 48_001).astype(np.float32).astype(np.float64)
    reference, bound = gelu_bound(x)

    def ggml_gelu(coefficient):
        x16 = x.astype(np.float32).astype(np.float16).astype(np.float32)
        c = np.float32(0.79788456080286535587989211986876)
        table = np.float32(0.5) * x16 * (np.float32(1) + np.tanh(c * x16 * (np.float32(1) + np.float32(coefficient) * x16 * x16)))
        return np.where(x <= -10, 0, np.where(x >= 10, x, table.astype(np.float16).astype(np.float64)))

    assert np.max(np.abs(ggml_gelu(0.044715) - reference) / bound) <= 1
    assert np.mean(np.abs(ggml_gelu(0.0044715) - reference) / bound > 1) > 0.25


def test_goldens_and_candidates_that_do_not_fit_are_refused(setup):
    from refgpt import RefGPTError

    float_golden, files = setup
    path, model, quantized_golden = files["Q8_0"]
    ours = QuantizedPort(path).run(TOKENS)
    with pytest.raises(RefGPTError, match="the candidate ran other tokens"):
        split(float_golden, quantized_golden, {**ours, "tokens": TOKENS[None] + 1}, model)
    with pytest.raises(RefGPTError, match="blocks.0.mlp.hook_pre: the candidate has shape"):
        split(float_golden, quantized_golden, {**ours, "blocks.0.mlp.hook_pre": ours["blocks.0.mlp.hook_pre"][:, :3]}, model)
    with pytest.raises(RefGPTError, match="other tensor types"):
        split(float_golden, quantized_golden, ours, files["Q4_0"][1])


def test_ctranslate2s_int8_product_is_within_its_bound_and_a_saturating_gemm_is_not():
    """CTranslate2's int8 product (activations per row to int8, int32 sums, a float32 epilogue),
    computed as its kernels do (tests/quantized_port.py), is within int8_linear_bound on random
    rows; with the pair sums saturated to int16 (a u8×s8 GEMM without VNNI) it is out of it."""
    from quantized_port import ct2_int8_product
    from refgpt.oracle.quantized import int8_linear_bound, int8_rows, op_verdict

    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 64)).astype(np.float32)  # [rows, d_in]
    W = rng.standard_normal((96, 64))  # [d_out, d_in]
    bias = rng.standard_normal(96).astype(np.float32)  # [d_out]
    w_scale = (np.float32(127) / np.abs(W).max(axis=1).astype(np.float32)).astype(np.float32)  # [d_out]
    W_q = np.rint(W * w_scale[:, None]).astype(np.int8)  # [d_out, d_in]
    q, a = int8_rows(x)
    assert np.abs(q).max() == 127 and np.all(np.abs(q / a[:, None] - x) <= 0.5 / a[:, None] * (1 + 1e-6))
    for b in (None, bias):
        reference, bound = int8_linear_bound(q, a, W_q, w_scale, b)
        assert op_verdict("y", "W", "int8", ct2_int8_product(q, a, W_q, w_scale, b), reference, bound).ok
        wrong = ct2_int8_product(q, a, W_q, w_scale, b, saturate=True)
        assert not op_verdict("y", "W", "int8", wrong, reference, bound).ok
