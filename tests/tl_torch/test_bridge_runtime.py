"""TransformerLens 4's TransformerBridge as a candidate: ``refgpt compare GOLDEN HF_DIR --runtime
transformer-lens`` boots the bridge on the HF directory, runs it on the golden's tokens with
compatibility mode's aliases on (no weight processing) and judges every hook it caches, its own
names and TransformerLens 3's (refgpt/runtimes/tl_bridge.py).

TransformerLens 4 cannot share this environment with TransformerLens 3.9, so it comes from the
overlay directory tests/tl_torch/tl4.py makes (``REFGPT_TL4_DIR``) and the bridge runs in a
subprocess, as a user with both would run it. A correct bridge passes with no false alarm at GPT-2
small's shape (12 layers, random weights, LayerNorm gains and biases perturbed) and on the trained
embedded model, in float32 (TL 4's default) and in float64; a hook aliased to the wrong tensor in
the bridge's own hook map (TransformerLens #1639) is named at its op and layer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import peers as P

P.require_peers()

import refgpt  # noqa: E402
import tl4  # noqa: E402
from random_models import GPT2_SMALL, saved  # noqa: E402
from refgpt.files.default_model import default_model_path  # noqa: E402
from refgpt.gpt2.config import Config  # noqa: E402
from refgpt.oracle import golden  # noqa: E402
from refgpt.oracle.comparison import compare_groups  # noqa: E402
from refgpt.runtimes import tl_bridge  # noqa: E402

HERE = Path(__file__).resolve().parent
SMALL = Config(d_model=32, n_layers=4, n_heads=4, d_mlp=128, d_vocab=50, n_ctx=16)


@pytest.fixture
def with_tl4(tl4_dir, monkeypatch):
    """REFGPT_TL4_DIR set to the overlay, as a user beside TransformerLens 3 sets it."""
    monkeypatch.setenv(tl_bridge.TL4_DIR, str(tl4_dir))
    return tl4_dir


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(golden file, HF directory) of a 4-layer random GPT-2 (weights of scale 0.3) on 2 × 16 tokens."""
    return saved(tmp_path_factory, SMALL, "bridge_small", 0.3, 16)


def _judged(refgpt_cli, golden_path, directory, *more):
    result = refgpt_cli.in_process("compare", golden_path, directory, "--runtime", "transformer-lens", "--json", *more)
    assert result.stderr == "", result.stderr
    return result.returncode, json.loads(result.stdout)


def _every_hook_judged(report, n_layers):
    names = [t["name"] for t in report["tensors"]]
    for layer in range(n_layers):
        for hook in ("ln1.hook_scale", "ln1.hook_normalized", "ln1.out", "attn.hook_q", "attn.hook_k", "attn.hook_v",
                     "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z", "hook_attn_out", "hook_resid_mid",
                     "ln2.hook_scale", "ln2.hook_normalized", "ln2.out", "mlp.hook_pre", "mlp.hook_post",
                     "hook_mlp_out", "hook_resid_post"):
            assert f"blocks.{layer}.{hook}" in names
    # every alias judged too: hook_attn_out is cached under four names (TL 3's, attn.hook_out, attn.o.hook_out,
    # attn.hook_hidden_states), ln1.out under five (ln1.hook_out and the inputs of attn, q, k, v)
    assert names.count("blocks.0.hook_attn_out") == 4 and names.count("blocks.0.ln1.out") == 5
    assert len(names) == 40 * n_layers + 13  # 40 names per block, 13 outside the blocks (the returned logits too)
    # unjudged: LayerNorm's mean (the bridge caches none) and the loss (run_with_cache on tokens computes none)
    assert sorted(report["missing"]) == sorted([f"blocks.{layer}.ln{i}.hook_mean" for layer in range(n_layers)
                                                for i in (1, 2)] + ["ln_final.hook_mean", "targets", "loss"])


@pytest.mark.slow
def test_a_correct_bridge_passes_at_gpt2_small_shape(with_tl4, tmp_path_factory, refgpt_cli):
    # GPT-2's own initialisation scale (0.02), LayerNorm gains 1 + N(0, 0.02²), biases N(0, 0.02²)
    golden_path, directory = saved(tmp_path_factory, GPT2_SMALL, "bridge_gpt2_small", 0.02, 4)
    code, report = _judged(refgpt_cli, golden_path, directory)
    assert code == 0 and report["ok"], report["first_divergence"]
    assert report["tolerance"]["profile"] == "float32"
    _every_hook_judged(report, 12)


@pytest.mark.slow
def test_a_correct_bridge_of_the_embedded_model_passes(with_tl4, tmp_path, refgpt_cli):
    assert refgpt_cli.in_process("golden", "--bos", "To be, or not to be", "-o", tmp_path / "g.safetensors").returncode == 0
    code, report = _judged(refgpt_cli, tmp_path / "g.safetensors", default_model_path(), "--save",
                           tmp_path / "captured.safetensors")
    assert code == 0 and report["ok"], report["first_divergence"]
    _every_hook_judged(report, refgpt.load(default_model_path()).cfg.n_layers)
    kept = golden.read(tmp_path / "captured.safetensors")
    assert kept.metadata["runtime"] == "transformer-lens"
    assert "blocks.0.hook_attn_out" in kept.tensors  # one tensor per refgpt name, under refgpt's names


@pytest.mark.slow
def test_the_bridge_runs_float64_and_passes_at_float64_s_tolerance(with_tl4, small):
    golden_path, directory = small
    g = golden.read(golden_path)
    grouped, _ = tl_bridge.capture(directory, g.tensors["tokens"], SMALL.n_layers, dtype="float64")
    assert grouped[0]["logits"][1].dtype == np.float64
    report = compare_groups(g, grouped)
    assert report.ok and report.tolerance["profile"] == "float64", report.table(failing=True)


@pytest.mark.slow
def test_a_hook_aliased_to_the_residual_stream_is_named_at_its_op_and_layer(tl4_dir, small, tmp_path):
    golden_path, directory = small
    g = golden.read(golden_path)
    np.save(tmp_path / "tokens.npy", np.asarray(g.tensors["tokens"]))
    done = subprocess.run([sys.executable, str(HERE / "bridge_planted.py"), str(directory), str(tmp_path / "tokens.npy"),
                           str(tmp_path / "cache.npz"), "2"], env=tl4.environment(tl4_dir), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(tmp_path / "cache.npz") as z:
        cache = {name: z[name] for name in z.files}
    report = compare_groups(g, tl_bridge.groups(cache, g.tensors["tokens"], SMALL.n_layers)[0])
    assert not report.ok
    first = report.first_divergence
    assert (first.name, first.layer) == ("blocks.2.hook_attn_out", 2)
    assert {t.name for t in report.tensors if not t.ok} == {"blocks.2.hook_attn_out"}  # the tensors after it are right


@pytest.mark.slow
def test_local_verdicts_judge_every_op_the_bridge_exposes(with_tl4, small, refgpt_cli):
    golden_path, directory = small
    result = refgpt_cli.in_process("compare", golden_path, directory, "--runtime", "transformer-lens", "--local",
                                   "--local-model", directory)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "OK: no op introduced an error beyond its bound" in result.stdout
    # the bridge caches no LayerNorm mean: that op alone is unjudged
    n = 2 * SMALL.n_layers + 1
    assert f"local verdicts: {n} ops skipped, their output or inputs hidden by the runtime: ln mean ×{n}" in result.stdout


def test_without_transformer_lens_4_the_error_says_how_to_get_it(small, refgpt_cli, monkeypatch):
    monkeypatch.delenv(tl_bridge.TL4_DIR, raising=False)  # this environment has TransformerLens 3.9
    result = refgpt_cli.in_process("compare", *small, "--runtime", "transformer-lens")
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "needs transformer-lens ≥ 4 (this environment has 3.9.0)" in result.stderr
    assert "REFGPT_TL4_DIR=DIR" in result.stderr and "pip install 'refgpt[transformer-lens]'" in result.stderr
    monkeypatch.setenv(tl_bridge.TL4_DIR, str(small[1]))  # a directory without it
    result = refgpt_cli.in_process("compare", *small, "--runtime", "transformer-lens")
    assert result.returncode == 1 and "no transformer_lens package in it" in result.stderr
