"""Issue 38's "no false alarm" at GPT-2 small's shape with all 12 layers (refgpt/oracle/local.py):
correct ports of a GPT-2-small-shaped model — d_model 768, 12 heads, 12 layers, the 50,257-token
vocabulary (llm.c pads it to 50,304), GPT-2's initialisation with its biases and LayerNorms moved off
0 and 1 (tests/port_cases.py) — have no locally flagged op:

* the C port (tests/oracle/c_port/gpt2_port.c, llm.c's loops: one float accumulator per sum) in its
  five builds (tests/c_port.py: three summation orders at -O3, -Ofast, -O3 -march=native), forward and
  backward with targets, 32 positions: every op of both judged, its probs and per-position loss too;
* HF transformers' GPT2LMHeadModel in float32, bfloat16 and float16 (torch's CPU kernels: float32
  accumulation), loaded by ``from_pretrained`` from the same model saved as a float32 checkpoint,
  dumped through its own modules (tests/hf_port.py), 48 tokens, its LayerNorms judged by L16
  (``layer_norm="any"``: torch's Welford kernel).

A build costs about a minute here (the judgement of the backward at 12 layers is most of it), five
of them too long for CI's default run: every C build runs with REFGPT_CALIBRATION=long. HF's
bfloat16 runs by default (about half a minute), float32 and float16 with the switch. TransformerLens
in float32 and bfloat16 at this shape: tests/oracle/test_local_backward.py (forward and backward) and
test_local.py. ``benchmarks/local_small_ports.py`` runs them all and prints the worst ratio per op
kind and the times (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import os

import pytest

import c_port
import port_cases
from refgpt.oracle import local

pytestmark = pytest.mark.slow  # a 124M-parameter model, 12 layers judged op by op

LONG = os.environ.get("REFGPT_CALIBRATION") == "long"
long_only = pytest.mark.skipif(not LONG, reason="set REFGPT_CALIBRATION=long (about a minute each)")
C_POSITIONS, HF_POSITIONS = 32, 48
#: Judged ops of a C build, measured: 16 per block and 7 more in the forward (llm.c dumps no x̂ and no
#: embeddings; its LayerNorms as mean, rstd and output; then the logits, probs and per-position loss),
#: 32 per block and 3 more in the backward — test_local.py's 54 and test_local_backward.py's 99 at
#: 3 layers, the loss left out there.
C_OPS = 16 * 12 + 7 + 32 * 12 + 3
HF_OPS = 2 + 15 * 12 + 2  # the embeddings, 15 per block, ln_final input to output, logits


@pytest.fixture(scope="module")
def small():
    """GPT-2 small's shape, 12 layers, seed 0 (float32-exact weights, W_U tied to W_E as llm.c's)."""
    return port_cases.gpt2_small_shape(12)


def c_small(build, model, directory, defines=()):
    """(x, y [1, 32], the C build's forward and backward under a golden's names) on ``model``."""
    x, y = port_cases.random_batch(model, 1, C_POSITIONS)
    return x, y, c_port.port_acts(build, model, x, y, directory, defines, gradients=True)


def hf_small(store, model, directory):
    """(x [1, 48], HF's activations in ``store``) on ``model``, loaded as HF loads a checkpoint."""
    import peers
    from hf_port import hf_of, hf_port_acts
    peers.require_peers()
    x, _ = port_cases.random_batch(model, 1, HF_POSITIONS)
    return x, hf_port_acts(peers.as_dtype(hf_of(model, directory / "hf"), store), x)


def judged(report):
    return [v for v in report.ops if v.skipped is None]


@long_only
@pytest.mark.skipif(c_port.compiler() is None, reason="no C compiler")
@pytest.mark.parametrize("build", list(c_port.BUILDS))
def test_the_c_ports_five_builds_at_gpt2_smalls_shape_have_no_local_flag(build, small, tmp_path):
    x, y, acts = c_small(build, small, tmp_path)
    report = local.judge(small.params, small.cfg, x, acts, "float32", targets=y)
    assert report.first is None, local.format_local(report)
    ops = judged(report)
    assert len(ops) == C_OPS, [(v.name, v.skipped) for v in report.ops if v.skipped]
    by_name = {v.name: v for v in ops}
    assert by_name["probs"].kind.startswith("probabilistic") and by_name["loss"].op == "loss"
    assert {"grad.blocks.11.attn.hook_k", "grad.blocks.0.ln1.w", "grad.blocks.0.hook_resid_pre"} <= set(by_name)


@pytest.mark.peer
@pytest.mark.parametrize("store", [pytest.param("float32", marks=long_only), "bfloat16",
                                   pytest.param("float16", marks=long_only)])
def test_hf_at_gpt2_smalls_shape_has_no_local_flag(store, small, tmp_path):
    x, acts = hf_small(store, small, tmp_path)
    report = local.judge(small.params, small.cfg, x, acts, store, layer_norm="any")
    assert report.first is None, local.format_local(report)
    ops = judged(report)
    assert len(ops) == HF_OPS and {v.op for v in ops} >= {"ln", "scores", "pattern", "z", "gelu_new", "logits"}
