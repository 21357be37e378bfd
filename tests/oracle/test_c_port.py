"""A float32 GPT-2 in sequential C loops (tests/oracle/c_port/gpt2_port.c) against refgpt's goldens.

Issue 25: the oracle must not cry wolf on a correct port, whatever order it adds in. The port is
compiled at -O3 in three accumulation orders (index order, reversed, 8 interleaved partial sums),
at -Ofast (reassociated and vectorised sums, fast exp and tanh, subnormals flushed) and with fused
multiply-adds; each must pass forward and backward on the trained embedded model — on random
tokens too, where its predictions are flat and the vocabulary softmax sums 8,192 similar terms, the
batch on which the old error model failed ``grad.ln_final.w`` — and at GPT-2 small's shape (d_model
768, 12 heads, the 50,257-token vocabulary; one layer, 16 positions, for time: the vocabulary and
the width are what make sums long, and every layer is judged alike). The bugs planted in its C are
still named first, at their own ops. Without a C compiler these tests skip; .ci/run installs one.
"""

from __future__ import annotations

import os

import pytest

import c_port
import port_cases
from refgpt.oracle import comparison as oracle

pytestmark = [pytest.mark.skipif(c_port.compiler() is None, reason="no C compiler (cc, gcc or clang)"),
              pytest.mark.slow]  # each test compiles and runs the port: seconds to a minute


@pytest.fixture(scope="module")
def goldens(tmp_path_factory):
    """name → (golden, the port's inputs, directory, model), the port's inputs written once per module."""
    inputs = {}

    def get(name):
        g, model, x, y = port_cases.golden_of(name)
        if name not in inputs:
            d = tmp_path_factory.mktemp("c_port")
            inputs[name] = (c_port.write_inputs(d, model, x, y), d)
        return (g, *inputs[name], model)

    return get


def run(goldens, name, build, defines=()):
    g, inputs, d, model = goldens(name)
    flags, build_defines = c_port.BUILDS[build]
    exe = c_port.build(flags, (*build_defines, *defines))
    return g, oracle.compare(g, c_port.run_port(exe, inputs, d, f"{build}{'-'.join(('',) + tuple(defines))}"),
                             name_map="llmc"), model


LONG = os.environ.get("REFGPT_CALIBRATION") == "long"  # every build on every batch, every bug at both shapes
long_only = pytest.mark.skipif(not LONG, reason="set REFGPT_CALIBRATION=long")


@pytest.mark.parametrize("name, build", [("trained, random tokens", b) for b in c_port.BUILDS]
                         + [("trained, text", "O3"), ("GPT-2 small's shape", "O3"), ("GPT-2 small's shape", "Ofast")]
                         + [pytest.param(n, b, marks=long_only) for n, b in (
                             ("trained, text", "Ofast"), ("trained, text", "O3-fma"), ("GPT-2 small's shape", "O3-fma"),
                             ("GPT-2 small's shape", "O3-reversed"), ("GPT-2 small's shape", "O3-8-lanes"))])
def test_a_correct_float32_port_passes_forward_and_backward(goldens, name, build):
    g, report, _ = run(goldens, name, build)
    assert report.ok, report.table(after_first=3)
    judged = {t.name for t in report.tensors}
    L = g.config.n_layers - 1
    assert {"probs", "loss", "loss_mean", f"blocks.{L}.attn.hook_pattern", f"blocks.{L}.mlp.hook_post", "grad.logits",
            "grad.ln_final.w", "grad.tied_W_E", "grad.blocks.0.attn.W_Q", "grad.blocks.0.ln1.w"} <= judged
    probs = report["probs"]
    assert probs.row is not None and probs.row.kind == "factor" and probs.row.largest > 0  # a softmax row's one sum
    assert "judged up to a factor per row" in " ".join(probs.notes)


@pytest.mark.parametrize("bug, name, expected", [
    ("BUG_GELU_PI", "trained, random tokens", "blocks.0.mlp.hook_post"),
    ("BUG_GELU_BACKWARD", "trained, random tokens", "grad.blocks.3.mlp.hook_pre"),
    ("BUG_LN_BACKWARD_MEAN", "trained, random tokens", "grad.blocks.3.hook_resid_post"),
    ("BUG_GELU_PI", "GPT-2 small's shape", "blocks.0.mlp.hook_post"),
    pytest.param("BUG_GELU_BACKWARD", "GPT-2 small's shape", "grad.blocks.0.mlp.hook_pre", marks=long_only),
    pytest.param("BUG_LN_BACKWARD_MEAN", "GPT-2 small's shape", "grad.blocks.0.hook_resid_post", marks=long_only),
    ("BUG_SOFTMAX_PADDED", "GPT-2 small's shape", "probs"),
])
def test_a_bug_planted_in_the_port_is_named_first_at_its_op(goldens, bug, name, expected):
    g, report, _ = run(goldens, name, "O3", (bug,))
    first = report.first_divergence
    assert first is not None and first.name == expected, report.table(after_first=2)
    assert all(t.ok for t in report.tensors[: report.tensors.index(first)])
