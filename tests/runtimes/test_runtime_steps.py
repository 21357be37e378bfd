"""Decode and padded goldens for model candidates (refgpt/runtimes/steps.py): a decode golden's
steps are run as passes over the sequence so far, each step's new positions judged; a padded
golden's rows need a graph fed their attention_mask and position_ids (``onnx_model.export(…,
padded=True)``), and any other model candidate is refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the onnx extra (onnx, onnxscript, onnxruntime) is not installed")
pytest.importorskip("onnxscript", reason="the onnx extra (onnx, onnxscript, onnxruntime) is not installed")
pytest.importorskip("transformers", reason="exporting needs transformers (the peers extra)")

import refgpt  # noqa: E402
from onnx_graphs import SMALL, gelu_in_erf_form  # noqa: E402
from random_models import random_tokens  # noqa: E402
from refgpt.oracle import decode, golden  # noqa: E402
from refgpt.runtimes import onnx_model  # noqa: E402

STEPS = 3


@pytest.fixture(scope="module")
def decoded(small, tmp_path_factory):
    """(decode golden of 3 greedy steps after a 2 × 6 prompt, the small model's graph, its directory)."""
    golden_path, onnx_path = small
    directory = onnx_path.parent / "model"
    model = refgpt.load(directory)
    path = tmp_path_factory.mktemp("decode") / "decode.safetensors"
    golden.write(path, decode.make(model, random_tokens(SMALL, 6, batch=2, seed=3), STEPS))
    return path, onnx_path, directory


def _padded_golden(directory, path):
    mask = np.array([[0, 0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]])  # row 0 left-padded
    tokens = random_tokens(SMALL, 8, batch=2, seed=4)
    return golden.write(path, golden.make(refgpt.load(directory), tokens, attention_mask=mask))


def _judged(refgpt_cli, *args):
    result = refgpt_cli.in_process("compare", *args, "--json")
    assert result.stderr == "", result.stderr
    return result.returncode, json.loads(result.stdout)


@pytest.mark.slow
def test_a_decode_golden_is_judged_step_by_step_on_onnx_runtime(decoded, refgpt_cli):
    golden_path, onnx_path, _ = decoded
    code, report = _judged(refgpt_cli, golden_path, onnx_path)
    assert code == 0 and report["ok"], report["first_divergence"]
    judged = {t["name"] for t in report["tensors"]}
    for step in range(STEPS):
        assert {f"step.{step}.blocks.3.mlp.hook_post", f"step.{step}.blocks.3.attn.hook_pattern",
                f"step.{step}.logits", f"step.{step}.chosen"} <= judged
    assert "step.1.blocks.0.attn.cache_k" in report["missing"]  # a pass without a cache has none
    assert any("passes over the sequence so far" in n for n in report["notes"])


@pytest.mark.slow
def test_a_bug_planted_in_the_graph_is_named_at_its_step_and_op(decoded, tmp_path, refgpt_cli):
    golden_path, onnx_path, _ = decoded
    bad = gelu_in_erf_form(onnx_path, tmp_path / "erf.onnx", 1)
    code, report = _judged(refgpt_cli, golden_path, bad)
    assert code == 1 and report["first_divergence"]["name"] == "step.0.blocks.1.mlp.hook_post"


@pytest.mark.slow
def test_a_padded_golden_runs_on_a_graph_fed_the_mask_and_positions(small, tmp_path, refgpt_cli):
    directory = small[1].parent / "model"
    padded = _padded_golden(directory, tmp_path / "padded.safetensors")
    graph = onnx_model.export(directory, tmp_path / "padded.onnx", padded=True)
    code, report = _judged(refgpt_cli, padded, graph)
    assert code == 0 and report["ok"], report["first_divergence"]
    assert {"hook_embed", "hook_pos_embed", "blocks.3.ln2.hook_scale", "blocks.3.attn.hook_pattern",
            "logits"} <= {t["name"] for t in report["tensors"]}


def test_a_padded_golden_without_the_inputs_it_needs_is_refused_in_one_line(small, tmp_path, refgpt_cli):
    directory = small[1].parent / "model"
    padded = _padded_golden(directory, tmp_path / "padded.safetensors")
    result = refgpt_cli.in_process("compare", padded, small[1])  # the graph takes input_ids alone
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "the ONNX graph has no attention_mask input" in result.stderr
    result = refgpt_cli.in_process("compare", padded, directory, "--runtime", "mlx")
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "--runtime mlx is fed the token ids alone" in result.stderr
