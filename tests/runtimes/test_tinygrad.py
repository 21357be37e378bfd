"""tinygrad runs the same ONNX graph (``refgpt compare GOLDEN model.onnx --runtime tinygrad``): a
correct graph passes, and a LayerNormalization epsilon ×100 is named at its LayerNorm.

tinygrad's CPU backend compiles each kernel with clang (.ci/run installs Debian's): measured 167 s
for the correct 4-layer graph and 104 s more for the planted bug on two shared cores, and 2,197 s for
a correct graph of GPT-2 small's shape (12 layers, d_model 768, random weights; the machine loaded
with other jobs, load average 15–17: about 6 minutes of CPU), so the default run checks the correct
4-layer graph and ``REFGPT_RUNTIMES=long`` adds the planted bug and GPT-2 small's shape (the same
bug is named on ONNX Runtime in every run, tests/runtimes/test_onnx_model.py, and GPT-2 small's
shape passes there).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

pytest.importorskip("tinygrad", reason="the tinygrad extra is not installed")
if shutil.which("clang") is None:
    pytest.skip("tinygrad's CPU backend compiles with clang, which is not installed", allow_module_level=True)

from onnx_graphs import epsilon_times_100  # noqa: E402


def _judged(refgpt_cli, golden_path, onnx_path):
    result = refgpt_cli.in_process("compare", golden_path, onnx_path, "--runtime", "tinygrad", "--json")
    assert result.stderr == "", result.stderr
    return result.returncode, json.loads(result.stdout)


def test_tinygrad_runs_a_correct_graph_within_tolerance(small, refgpt_cli):
    code, report = _judged(refgpt_cli, *small)
    assert code == 0 and report["ok"], report["first_divergence"]
    assert {"blocks.3.ln2.hook_scale", "blocks.3.attn.hook_pattern", "logits"} <= {t["name"] for t in report["tensors"]}


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("REFGPT_RUNTIMES") != "long", reason="GPT-2 small's shape on tinygrad: 37 minutes "
                    "on the shared machine (6 of CPU): REFGPT_RUNTIMES=long")
def test_tinygrad_runs_a_correct_graph_of_gpt2_small_shape_within_tolerance(gpt2_small, refgpt_cli):
    code, report = _judged(refgpt_cli, *gpt2_small)
    assert code == 0 and report["ok"], report["first_divergence"]
    assert {"blocks.11.ln2.hook_scale", "blocks.11.attn.hook_pattern", "logits"} <= {t["name"] for t in report["tensors"]}


@pytest.mark.skipif(os.environ.get("REFGPT_RUNTIMES") != "long", reason="minutes of kernel compiling: REFGPT_RUNTIMES=long")
def test_tinygrad_on_a_graph_with_layernorm_epsilon_times_100_names_that_layernorm(small, tmp_path, refgpt_cli):
    bad = epsilon_times_100(small[1], tmp_path / "eps.onnx", 5)  # blocks.2.ln2
    code, report = _judged(refgpt_cli, small[0], bad)
    assert code == 1 and report["first_divergence"]["name"] == "blocks.2.ln2.hook_scale"
