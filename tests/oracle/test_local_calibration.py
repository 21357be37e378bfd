"""The local verdicts' false-alarm calibration (benchmarks/local_calibration.py): no flagged op for
correct ports of random models — refgpt's float32 pass, the NumPy port at three precisions and the C
port's five builds (forward and backward); each model's decode (refgpt's float32 decode, the NumPy
port's at bfloat16 and float16) and padded batch (the NumPy port at three precisions) — a small draw here, 1,000 models with
REFGPT_CALIBRATION=long (benchmarks/RESULTS.md records the run), and of the trained embedded model
at every precision."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from doc_pages import load_script
from local_ports import port_forward
from refgpt.oracle import local

pytestmark = pytest.mark.slow  # a few seconds each: the trained model's 8,192-token vocabulary

LONG = os.environ.get("REFGPT_CALIBRATION") == "long"
calibration = load_script(Path(__file__).resolve().parents[2] / "benchmarks" / "local_calibration.py")


def test_correct_ports_of_random_models_have_no_local_flag():
    stats = calibration.calibrate(1000 if LONG else 4)
    assert not stats.flagged, calibration.table(stats)
    assert stats.judgments >= 3 * stats.models
    assert all(stats.per_port[p][0] >= 1 for p in calibration.STEP_PORTS), calibration.table(stats)  # each judged
    assert stats.worst["kv cache"][1] is not None and stats.worst["pattern"][1] is not None
    import c_port
    if c_port.compiler():  # every C build judged on every model, its backward too
        assert all(stats.per_port[p][:2] == [stats.models, 0] for p in calibration.C_PORTS), calibration.table(stats)
        assert stats.worst["ln backward"][1] is not None
    if LONG:
        print(calibration.table(stats))


@pytest.fixture(scope="module")
def trained():
    import refgpt
    model = refgpt.load(refgpt.default_model_path(), dtype="float64")
    text = "The quick brown fox jumps over the lazy dog. To be, or not to be: that is the question."
    tokens = np.atleast_2d(model.to_tokens(text))
    return model, tokens


@pytest.mark.parametrize("port", calibration.PORTS)
def test_the_trained_model_at_every_precision_has_no_local_flag(trained, port):
    model, tokens = trained
    acts = calibration.port_acts(port, model.cfg, model.params, tokens)
    report = local.judge(model.params, model.cfg, tokens, acts, port.split()[1])
    assert report.first is None, local.format_local(report)
    assert sum(v.skipped is None for v in report.ops) >= 2 + 17 * model.cfg.n_layers + 3


@pytest.mark.parametrize("build", calibration.C_PORTS)
def test_the_trained_model_run_by_the_c_port_has_no_local_flag_forward_or_backward(trained, build, tmp_path):
    """The embedded model is llm.c-shaped (tied, ε = 1e-5, d_mlp = 4·d_model): each build's training
    step on its text, the next tokens as targets, judged op by op (2026-12-06: 201 ops, 130 of them the
    backward's; worst ratio 0.56–0.69, gelu_new's backward, in every build)."""
    import c_port
    model, tokens = trained
    x, y = tokens[:, :-1], tokens[:, 1:]  # [batch, pos]: llm.c's x and y
    acts = c_port.port_acts(build.split()[1], model, x, y, tmp_path, gradients=True, losses=False)
    report = local.judge(model.params, model.cfg, x, acts, "float32", targets=y)
    assert report.first is None, local.format_local(report)
    judged = [v for v in report.ops if v.skipped is None]  # as test_local.py's and test_local_backward.py's C ports
    assert (len(judged), sum(v.name.startswith("grad.") for v in judged)) == (48 * model.cfg.n_layers + 9,
                                                                              31 * model.cfg.n_layers + 6)


@pytest.mark.peer
@pytest.mark.parametrize("store", ["float32", "bfloat16", "float16"])
def test_the_trained_model_run_by_hf_at_every_precision_has_no_local_flag(trained, store):
    peers = pytest.importorskip("peers")
    peers.require_peers()
    import refgpt
    from hf_port import hf_port_acts
    from transformers import GPT2LMHeadModel
    model, tokens = trained
    hf = GPT2LMHeadModel.from_pretrained(refgpt.default_model_path(), attn_implementation="eager",
                                         torch_dtype=peers.torch_dtype(store)).eval()
    report = local.judge(model.params, model.cfg, tokens, hf_port_acts(hf, tokens), store, layer_norm="any")
    assert report.first is None, local.format_local(report)
    assert sum(v.skipped is None for v in report.ops) == 2 + 15 * model.cfg.n_layers + 2


def test_a_local_port_of_the_trained_model_with_a_bug_is_flagged(trained):
    """The calibration's ports are the planted ports without the plant: the same code finds a bug."""
    model, tokens = trained
    acts = port_forward(model.params, model.cfg, tokens, "bfloat16", plant="W_O_head_1pct", layer=1, head=2)
    assert local.judge(model.params, model.cfg, tokens, acts, "bfloat16").first.name == "blocks.1.hook_attn_out"
