"""An ONNX GPT-2 as a candidate: ``refgpt compare GOLDEN model.onnx`` runs it on ONNX Runtime.

The graph is torch.onnx's own export (``onnx_model.export``) of the HF directory refgpt saves; the
golden is refgpt's float64 pass on the same weights. A correct graph must pass with no false alarm,
at GPT-2 small's shape (12 layers, random weights) and on the trained embedded model; a bug planted
in the graph itself — one LayerNormalization's epsilon ×100, one block's GELU in erf form instead of
tanh — must be named at its op and layer.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("onnxruntime", reason="the onnx extra (onnx, onnxscript, onnxruntime) is not installed")
pytest.importorskip("onnxscript", reason="the onnx extra (onnx, onnxscript, onnxruntime) is not installed")
pytest.importorskip("transformers", reason="exporting needs transformers (the peers extra)")
import onnx  # noqa: E402

import refgpt  # noqa: E402
from onnx_graphs import epsilon_times_100, gelu_in_erf_form  # noqa: E402
from refgpt.files.default_model import default_model_path  # noqa: E402
from refgpt.oracle import golden  # noqa: E402
from refgpt.runtimes import onnx_model  # noqa: E402


def _judged(golden_path, onnx_path, refgpt_cli, *more):
    result = refgpt_cli.in_process("compare", golden_path, onnx_path, "--json", *more)
    assert result.stderr == "", result.stderr
    return result.returncode, json.loads(result.stdout)


def _every_block_tensor_judged(report, n_layers):
    judged = {t["name"] for t in report["tensors"]}
    for layer in range(n_layers):
        for hook in ("ln1.hook_mean", "ln1.hook_scale", "ln1.out", "attn.hook_q", "attn.hook_k", "attn.hook_v",
                     "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z", "hook_attn_out",
                     "hook_resid_mid", "ln2.hook_mean", "ln2.hook_scale", "mlp.hook_pre", "mlp.hook_post",
                     "hook_mlp_out", "hook_resid_post"):
            assert f"blocks.{layer}.{hook}" in judged
    assert {"hook_embed", "hook_pos_embed", "ln_final.hook_scale", "logits"} <= judged
    # unjudged: x̂ (LayerNormalization never exposes it) and the loss (the graph computes none)
    assert [m for m in report["missing"] if not m.endswith("hook_normalized")] == ["targets", "loss"]


def test_a_correct_graph_passes_at_gpt2_small_shape(gpt2_small, refgpt_cli):
    code, report = _judged(*gpt2_small, refgpt_cli)
    assert code == 0 and report["ok"], report["first_divergence"]
    _every_block_tensor_judged(report, 12)
    assert report["tolerance"]["profile"] == "float32"


def test_a_correct_graph_of_the_embedded_model_passes(tmp_path, refgpt_cli):
    path = onnx_model.export(default_model_path(), tmp_path / "default.onnx")
    assert refgpt_cli.in_process("golden", "--bos", "To be, or not to be", "-o", tmp_path / "g.safetensors").returncode == 0
    code, report = _judged(tmp_path / "g.safetensors", path, refgpt_cli)
    assert code == 0 and report["ok"], report["first_divergence"]
    _every_block_tensor_judged(report, refgpt.load(default_model_path()).cfg.n_layers)


def test_save_keeps_the_captured_tensors_under_refgpt_names(small, tmp_path, refgpt_cli):
    code, report = _judged(*small, refgpt_cli, "--save", tmp_path / "captured.safetensors")
    assert code == 0
    code_again, again = _judged(small[0], tmp_path / "captured.safetensors", refgpt_cli)
    assert code_again == 0 and [t["max_abs"] for t in again["tensors"]] == [t["max_abs"] for t in report["tensors"]]
    saved = golden.read(tmp_path / "captured.safetensors")
    assert saved.metadata["runtime"] == "onnxruntime" and "blocks.3.ln2.hook_scale" in saved.tensors


def test_a_layernorm_epsilon_times_100_is_named_at_its_layernorm(small, tmp_path, refgpt_cli):
    # LayerNormalization nodes in order: ln1, ln2 of each block, then ln_final; index 5 = blocks.2.ln2
    bad = epsilon_times_100(small[1], tmp_path / "eps.onnx", 5)
    code, report = _judged(small[0], bad, refgpt_cli)
    assert code == 1
    assert report["first_divergence"]["name"] == "blocks.2.ln2.hook_scale"


def test_gelu_in_erf_form_is_named_at_its_activation(small, tmp_path, refgpt_cli):
    bad = gelu_in_erf_form(small[1], tmp_path / "erf.onnx", 1)
    code, report = _judged(small[0], bad, refgpt_cli)
    assert code == 1
    assert report["first_divergence"]["name"] == "blocks.1.mlp.hook_post"


def test_a_missing_runtime_is_one_line_naming_its_extra(small, refgpt_cli, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "tinygrad", None)  # as if not installed
    result = refgpt_cli.in_process("compare", *small, "--runtime", "tinygrad")
    assert result.returncode == 1
    assert result.stderr.strip() == ("refgpt: error: running an .onnx candidate on tinygrad needs the tinygrad "
                                     "extra: pip install 'refgpt[tinygrad]' (tinygrad is not installed)")


def test_options_for_a_model_are_refused_for_a_dump(small, refgpt_cli):
    result = refgpt_cli.in_process("compare", small[0], small[0], "--runtime", "onnxruntime")
    assert result.returncode == 2 and "for a model CANDIDATE" in result.stderr


def test_a_graph_of_another_depth_is_refused_naming_its_layernorms(small):
    graph = onnx.load(str(small[1])).graph
    with pytest.raises(refgpt.RefGPTError, match="has 9 LayerNormalization nodes; a GPT-2 of 3 layers"):
        onnx_model.tensor_names(graph, 3)


@pytest.mark.slow
def test_local_verdicts_on_the_graph_name_the_op_and_what_onnx_hides(small, tmp_path, refgpt_cli):
    golden_path, onnx_path = small
    weights = onnx_path.parent / "model"
    result = refgpt_cli.in_process("compare", golden_path, onnx_path, "--local", "--local-model", weights)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "OK: no op introduced an error beyond its bound" in result.stdout
    n = 2 * 4 + 1  # LayerNormalization never exposes x̂: every LayerNorm's normalized is skipped
    assert f"local verdicts: {n} ops skipped, their output or inputs hidden by the runtime: ln normalized ×{n}" \
        in result.stdout
    bad = epsilon_times_100(onnx_path, tmp_path / "eps.onnx", 5)  # blocks.2.ln2
    result = refgpt_cli.in_process("compare", golden_path, bad, "--local", "--local-model", weights, "--json")
    assert result.returncode == 1
    first = json.loads(result.stdout)["local_first"]
    assert (first["op"], first["name"]) == ("ln scale", "blocks.2.ln2.hook_scale")
