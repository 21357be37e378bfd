"""mlx-lm's GPT-2 as a candidate (``refgpt compare GOLDEN hf_dir/ --runtime mlx``): the model mlx-lm's
own loader makes from an HF directory, its modules wrapped to keep their tensors. A correct model
passes with no false alarm (a random 4-layer model and the embedded model); one block's attention
scale planted wrong in mlx-lm's loaded model is named at that block's attention output (MLX runs
attention as one fused kernel: scores and pattern are not exposed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("mlx.core", reason="the mlx extra is not installed")
pytest.importorskip("mlx_lm", reason="the mlx extra is not installed")

import refgpt  # noqa: E402
from onnx_graphs import SMALL  # noqa: E402
from random_models import hf_tensors, random_model, random_tokens, save_checkpoint  # noqa: E402
from refgpt.files.default_model import default_model_path  # noqa: E402
from refgpt.oracle import compare, golden  # noqa: E402
from refgpt.runtimes import mlx_model  # noqa: E402


def _hub_layout(model, directory):
    """``model`` saved as the hub's gpt2 is (keys without ``transformer.``), which mlx-lm's GPT-2 reads;
    refgpt.save's GPT2LMHeadModel keys (``transformer.h.0…``) it refuses."""
    tensors = {k: v.astype(np.float32) for k, v in hf_tensors(model, prefix="").items()}
    return save_checkpoint(model, directory, tensors=tensors, config=model.cfg.to_hf())


@pytest.fixture(scope="module")
def small_mlx(tmp_path_factory):
    where = tmp_path_factory.mktemp("mlx")
    model = refgpt.load(save_checkpoint(random_model(SMALL, seed=1, scale=0.3), where / "refgpt"))
    tokens = random_tokens(SMALL, 16, batch=2, seed=2)
    return golden.write(where / "golden.safetensors", golden.make(model, tokens)), _hub_layout(model, where / "hub")


def test_a_correct_mlx_model_passes(small_mlx, refgpt_cli):
    result = refgpt_cli.in_process("compare", *small_mlx, "--runtime", "mlx", "--json")
    assert result.stderr == "", result.stderr
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], report["first_divergence"]
    judged = {t["name"] for t in report["tensors"]}
    assert {"hook_embed", "blocks.3.ln2.out", "blocks.3.mlp.hook_post", "blocks.3.hook_attn_out", "logits"} <= judged


def test_the_embedded_model_in_mlx_passes(tmp_path, refgpt_cli):
    _hub_layout(refgpt.load(default_model_path()), tmp_path / "hub")
    assert refgpt_cli.in_process("golden", "--bos", "To be, or not to be", "-o", tmp_path / "g.safetensors").returncode == 0
    result = refgpt_cli.in_process("compare", tmp_path / "g.safetensors", tmp_path / "hub", "--runtime", "mlx", "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], report["first_divergence"]


@pytest.mark.slow
def test_a_random_model_of_gpt2_small_shape_in_mlx_passes(gpt2_small_saved, tmp_path, refgpt_cli):
    golden_path, directory = gpt2_small_saved
    _hub_layout(refgpt.load(directory), tmp_path / "hub")
    result = refgpt_cli.in_process("compare", golden_path, tmp_path / "hub", "--runtime", "mlx", "--json")
    assert result.stderr == "", result.stderr
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], report["first_divergence"]
    assert {"blocks.11.ln2.out", "blocks.11.mlp.hook_post", "blocks.11.hook_attn_out"} <= {t["name"] for t in report["tensors"]}


def test_one_block_s_attention_scale_is_named_at_that_block_s_attention(small_mlx):
    golden_path, directory = small_mlx
    g = golden.read(golden_path)
    model = mlx_model.load(directory)
    model.model.h[2].attn.scale = 1 / 8  # 1/d_head instead of 1/√d_head (d_head = 8)
    captured, _ = mlx_model.capture(model, g.tensors["tokens"], SMALL.n_layers)
    report = compare(g, captured)
    assert not report.ok and report.first_divergence.name == "blocks.2.hook_attn_out"


@pytest.mark.slow
def test_local_verdicts_judge_what_mlx_exposes_and_name_what_it_hides(small_mlx, refgpt_cli):
    golden_path, directory = small_mlx
    result = refgpt_cli.in_process("compare", golden_path, directory, "--runtime", "mlx", "--local", "--local-model",
                                   golden_path.parent / "refgpt")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "OK: no op introduced an error beyond its bound" in result.stdout
    hidden = next(line for line in result.stdout.splitlines() if line.startswith("local verdicts: "))
    for op in ("q", "k", "v", "scores", "pattern", "z", "ln mean", "ln scale", "ln normalized"):
        assert f" {op} ×" in hidden, hidden


def test_refgpt_s_saved_layout_is_refused_by_mlx_lm_in_one_line(small_mlx, tmp_path, refgpt_cli):
    golden_path, _ = small_mlx
    saved = golden_path.parent / "refgpt"  # refgpt.save's keys: transformer.h.0…
    result = refgpt_cli.in_process("compare", golden_path, saved, "--runtime", "mlx")
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "mlx-lm cannot load it" in result.stderr
