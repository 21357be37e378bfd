"""An ONNX GPT-2 as a candidate: ``refgpt compare GOLDEN model.onnx`` runs it on ONNX Runtime.

The graph is torch.onnx's own export (``onnx_model.export``) of the HF directory refgpt saves; the
golden is refgpt's float64 pass on the same weights. A correct graph must pass with no false alarm,
at GPT-2 small's shape (12 layers, random weights) and on the trained embedded model; a bug planted
in the graph itself — one LayerNormalization's epsilon ×100, one block's GELU in erf form instead of
tanh — must be named at its op and layer.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the onnx extra (onnx, onnxscript, onnxruntime) is not installed")
pytest.importorskip("onnxscript", reason="the onnx extra (onnx, onnxscript, onnxruntime) is not installed")
pytest.importorskip("transformers", reason="exporting needs transformers (the peers extra)")
import onnx  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

import refgpt  # noqa: E402
from random_models import random_model, random_tokens, save_checkpoint  # noqa: E402
from refgpt.files.default_model import default_model_path  # noqa: E402
from refgpt.gpt2.config import Config  # noqa: E402
from refgpt.oracle import compare, golden  # noqa: E402
from refgpt.runtimes import onnx_model  # noqa: E402

GPT2_SMALL = Config(d_model=768, n_layers=12, n_heads=12, d_mlp=3072, d_vocab=50257, n_ctx=1024)
SMALL = Config(d_model=32, n_layers=4, n_heads=4, d_mlp=128, d_vocab=50, n_ctx=16)
# 2 × 16 positions: each LayerNorm's scale has 32 elements, enough for the bias check (≥ 16), which
# is what sees epsilon ×100 — a shift of ε·99/(2·scale) in every element, far below the elementwise
# tolerance when the stream's scale is large (random weights of scale 0.3), but all of one sign.
SMALL_POS = 16


def _exported(tmp_path_factory, cfg, name, scale, pos):
    """(the golden file, the exported .onnx) of a random model with ``cfg`` on 2 × ``pos`` tokens."""
    where = tmp_path_factory.mktemp(name)
    model = refgpt.load(save_checkpoint(random_model(cfg, seed=1, scale=scale), where / "model"))
    tokens = random_tokens(cfg, pos, batch=2, seed=2)
    path = onnx_model.export(where / "model", where / "model.onnx")
    return golden.write(where / "golden.safetensors", golden.make(model, tokens)), path


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return _exported(tmp_path_factory, SMALL, "small", 0.3, SMALL_POS)


@pytest.fixture(scope="module")
def gpt2_small(tmp_path_factory):
    # GPT-2's own initialisation scale (0.02), LayerNorm gains 1 + N(0, 0.02²), biases N(0, 0.02²)
    return _exported(tmp_path_factory, GPT2_SMALL, "gpt2_small", 0.02, 4)


def _judged(golden_path, onnx_path, refgpt_cli, *more):
    result = refgpt_cli.in_process("compare", golden_path, onnx_path, "--json", *more)
    assert result.stderr == "", result.stderr
    import json
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
    assert [m for m in report["missing"] if not m.endswith("hook_normalized")] == []


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


def _epsilon_times_100(path, out, ln_index):
    model = onnx.load(str(path))
    ln = [n for n in model.graph.node if n.op_type == "LayerNormalization"][ln_index]
    for a in ln.attribute:
        if a.name == "epsilon":
            a.f *= 100
    onnx.save(model, str(out))
    return out


def _gelu_in_erf_form(path, out, layer):
    """Replace block ``layer``'s GELU (tanh form, as the exporter wrote it) by x·½(1 + erf(x/√2))."""
    model = onnx.load(str(path))
    graph = model.graph
    names, _ = onnx_model.tensor_names(onnx.load(str(path)).graph, SMALL.n_layers)
    pre, post = names[f"blocks.{layer}.mlp.hook_pre"], names[f"blocks.{layer}.mlp.hook_post"]
    below = {pre}  # hook_pre and the tensors computed from it
    for node in graph.node:
        if below & set(node.input):
            below |= set(node.output)
    below.remove(pre)
    above, inside = {post}, []  # tensors hook_post is computed from
    for node in reversed(graph.node):
        if above & set(node.output):
            above |= set(node.input)
            if set(node.output) & below:
                inside.append(node)
    at = min(list(graph.node).index(n) for n in inside)
    for node in inside:
        graph.node.remove(node)
    graph.initializer.extend([numpy_helper.from_array(np.array(v, np.float32), f"planted.{k}")
                              for k, v in (("inv_sqrt2", 1 / np.sqrt(2)), ("one", 1.0), ("half", 0.5))])
    new = [helper.make_node("Mul", [pre, "planted.inv_sqrt2"], ["planted.a"]),
           helper.make_node("Erf", ["planted.a"], ["planted.b"]),
           helper.make_node("Add", ["planted.b", "planted.one"], ["planted.c"]),
           helper.make_node("Mul", [pre, "planted.c"], ["planted.d"]),
           helper.make_node("Mul", ["planted.d", "planted.half"], [post])]
    for i, node in enumerate(new):
        graph.node.insert(at + i, node)
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    return out


def test_a_layernorm_epsilon_times_100_is_named_at_its_layernorm(small, tmp_path, refgpt_cli):
    # LayerNormalization nodes in order: ln1, ln2 of each block, then ln_final; index 5 = blocks.2.ln2
    bad = _epsilon_times_100(small[1], tmp_path / "eps.onnx", 5)
    code, report = _judged(small[0], bad, refgpt_cli)
    assert code == 1
    assert report["first_divergence"]["name"] == "blocks.2.ln2.hook_scale"


def test_gelu_in_erf_form_is_named_at_its_activation(small, tmp_path, refgpt_cli):
    bad = _gelu_in_erf_form(small[1], tmp_path / "erf.onnx", 1)
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
