"""Polygraphy both ways: its RunResults JSON is a candidate (``--map onnx --onnx model.onnx``), and
``refgpt golden --format polygraphy --onnx model.onnx`` writes a golden Polygraphy loads itself.

Polygraphy is run as its users run it, ``polygraphy run model.onnx --onnxrt --onnx-outputs mark all``,
with the golden's tokens fed through its own ``--load-inputs`` file; the graph is torch.onnx's
export of a random GPT-2 that refgpt saved (tests/runtimes/test_onnx_model.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("polygraphy", reason="the polygraphy extra is not installed")
pytest.importorskip("onnxruntime", reason="the onnx extra (onnx, onnxscript, onnxruntime) is not installed")
pytest.importorskip("onnxscript", reason="the onnx extra (onnx, onnxscript, onnxruntime) is not installed")
from polygraphy.comparator import RunResults  # noqa: E402
from polygraphy.json import save_json  # noqa: E402

from refgpt.oracle import golden  # noqa: E402
from refgpt.runtimes import onnx_model, polygraphy_json  # noqa: E402
from onnx_graphs import SMALL, gelu_in_erf_form  # noqa: E402

POLYGRAPHY = [sys.executable, "-m", "polygraphy"] if shutil.which("polygraphy") is None else ["polygraphy"]


def _polygraphy_run(onnx_path, golden_path, tmp_path, *more):
    feeds = tmp_path / "inputs.json"
    save_json([{"input_ids": np.asarray(golden.read(golden_path).tensors["tokens"], np.int64)}], str(feeds))
    return subprocess.run([*POLYGRAPHY, "run", str(onnx_path), "--onnxrt", "--onnx-outputs", "mark", "all",
                           "--load-inputs", str(feeds), *more], capture_output=True, text=True, timeout=300)


def _compare(refgpt_cli, golden_path, run_json, onnx_path):
    result = refgpt_cli.in_process("compare", golden_path, run_json, "--map", "onnx", "--onnx", onnx_path, "--json")
    assert result.stderr == "", result.stderr
    return result.returncode, json.loads(result.stdout)


def _run_and_compare(refgpt_cli, golden_path, onnx_path, tmp_path):
    """Polygraphy's run of ``onnx_path`` on the golden's tokens, saved and judged by compare: (code, report)."""
    run = _polygraphy_run(onnx_path, golden_path, tmp_path, "--save-outputs", str(tmp_path / "run.json"))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return _compare(refgpt_cli, golden_path, tmp_path / "run.json", onnx_path)


@pytest.mark.parametrize("graph, last", [("small", 3), pytest.param("gpt2_small", 11, marks=pytest.mark.slow)])
def test_a_polygraphy_run_of_a_correct_graph_passes(graph, last, request, tmp_path, refgpt_cli):
    """A 4-layer random GPT-2, and GPT-2 small's shape (the session's export shared with test_onnx_model)."""
    golden_path, onnx_path = request.getfixturevalue(graph)
    code, report = _run_and_compare(refgpt_cli, golden_path, onnx_path, tmp_path)
    assert code == 0 and report["ok"], report["first_divergence"]
    judged = {t["name"] for t in report["tensors"]}
    assert {f"blocks.{last}.mlp.hook_post", f"blocks.{last}.attn.hook_pattern", "blocks.0.ln1.out", "logits"} <= judged
    # Polygraphy marks the graph's tensors; the LayerNorm statistics are not among them (unjudged)
    assert "blocks.0.ln1.hook_scale" in report["missing"]


@pytest.mark.slow
def test_a_polygraphy_run_of_the_embedded_model_passes(tmp_path, refgpt_cli):
    from refgpt import default_model_path

    onnx_path = onnx_model.export(default_model_path(), tmp_path / "default.onnx")
    golden_path = tmp_path / "g.safetensors"
    assert refgpt_cli.in_process("golden", "--bos", "To be, or not to be", "-o", golden_path).returncode == 0
    code, report = _run_and_compare(refgpt_cli, golden_path, onnx_path, tmp_path)
    assert code == 0 and report["ok"], report["first_divergence"]
    assert {"blocks.3.mlp.hook_post", "logits"} <= {t["name"] for t in report["tensors"]}


def test_a_polygraphy_run_of_a_planted_bug_is_named_at_its_op(small, tmp_path, refgpt_cli):
    golden_path, onnx_path = small
    bad = gelu_in_erf_form(onnx_path, tmp_path / "erf.onnx", 2)
    code, report = _run_and_compare(refgpt_cli, golden_path, bad, tmp_path)
    assert code == 1 and report["first_divergence"]["name"] == "blocks.2.mlp.hook_post"


def test_polygraphy_loads_refgpt_s_golden_under_the_graph_s_names(small, tmp_path, refgpt_cli):
    golden_path, onnx_path = small
    np.save(tmp_path / "tokens.npy", np.asarray(golden.read(golden_path).tensors["tokens"]))
    made = refgpt_cli.in_process("golden", "--model", onnx_path.parent / "model", "--tokens", tmp_path / "tokens.npy",
                                 "--format", "polygraphy", "--onnx", onnx_path, "-o", tmp_path / "golden.json")
    assert made.returncode == 0, made.stderr
    loaded = RunResults.load(str(tmp_path / "golden.json"))  # Polygraphy's own reader
    ((runner, iterations),) = loaded.items()
    outputs = iterations[0]
    mine = golden.read(golden_path).tensors
    names, _ = onnx_model.tensor_names(onnx_model.load(onnx_path).graph, SMALL.n_layers)
    assert runner == polygraphy_json.RUNNER
    assert np.array_equal(outputs[names["blocks.2.mlp.hook_post"]], mine["blocks.2.mlp.hook_post"])
    assert np.array_equal(outputs[names["logits"]], mine["logits"])
    assert names["blocks.0.attn.hook_attn_scores"] not in outputs  # −∞ masked part: left out (onnx_model)
    # and polygraphy run compares its own run with every one of them
    run = _polygraphy_run(onnx_path, golden_path, tmp_path, "--load-outputs", str(tmp_path / "golden.json"))
    compared = {line.split("Comparing Output: '")[1].split("'")[0] for line in run.stdout.splitlines()
                if "Comparing Output: '" in line}
    assert compared == set(outputs.keys()), run.stdout[-3000:]


def test_a_file_that_is_not_run_results_is_refused_in_one_line(small, tmp_path, refgpt_cli):
    (tmp_path / "other.json").write_text('{"lst": [], "polygraphy_class": "AccuracyResult"}')
    result = refgpt_cli.in_process("compare", small[0], tmp_path / "other.json", "--map", "onnx", "--onnx", small[1])
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "not a Polygraphy RunResults file" in result.stderr
    pickled = {"lst": [["r", [{"outputs": {"x": {"array": "gASVAAAAAAAAAAA=", "polygraphy_class": "ndarray"}}}]]],
               "polygraphy_class": "RunResults"}
    (tmp_path / "pickle.json").write_text(json.dumps(pickled))
    result = refgpt_cli.in_process("compare", small[0], tmp_path / "pickle.json", "--map", "onnx", "--onnx", small[1])
    assert result.returncode == 1 and "not a readable .npy array" in result.stderr


def test_polygraphy_format_refuses_rows_of_different_lengths_in_one_line(refgpt_cli, tmp_path):
    """NumPy 2 refuses a ragged array, so the check comes before it (review: it was an internal error)."""
    (tmp_path / "m.onnx").write_bytes(b"")
    status, _, err = refgpt_cli.in_process("golden", "To be", "or not to be", "--format", "polygraphy",
                                           "--onnx", tmp_path / "m.onnx", "-o", tmp_path / "p.json")
    assert status == 1 and err.count("\n") == 1 and "rows of one length" in err
