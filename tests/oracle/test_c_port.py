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

import numpy as np
import pytest

import c_port
from refgpt import Config, Model, load_default
from refgpt.gpt2.params import param_shapes
from refgpt.oracle import comparison as oracle
from refgpt.oracle import golden

pytestmark = pytest.mark.skipif(c_port.compiler() is None, reason="no C compiler (cc, gcc or clang)")


def trained_model() -> Model:
    m = load_default()
    return Model(m.cfg, {k: np.asarray(v, np.float32).astype(np.float64) for k, v in m.params.items()})


def gpt2_init(cfg: Config, seed: int) -> dict:
    """GPT-2's initialisation (N(0, 0.02²), the residual projections 0.02/√(2L)), with biases and
    LayerNorms moved off 0 and 1 (which would hide bugs), float32-exact, W_U tied."""
    rng = np.random.default_rng(seed)
    p = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(".w"):
            a = 1 + 0.1 * rng.standard_normal(shape)
        elif name.rsplit(".", 1)[-1].startswith("b"):
            a = 0.02 * rng.standard_normal(shape)
        else:
            a = (0.02 / np.sqrt(2 * cfg.n_layers) if name.endswith(("W_O", "W_out")) else 0.02) * rng.standard_normal(shape)
        p[name] = a.astype(np.float32).astype(np.float64)
    p["unembed.W_U"] = p["embed.W_E"].T
    return p


GPT2_SMALL_SHAPE = Config(d_model=768, n_layers=1, n_heads=12, d_mlp=3072, d_vocab=50257, n_ctx=1024)


def case(name):
    """(model, x, y) of a named batch."""
    rng = np.random.default_rng(0)
    if name == "trained, random tokens":
        model = trained_model()
        x, y = (rng.integers(0, model.cfg.d_vocab, (4, 64)) for _ in range(2))
    elif name == "trained, text":
        model = trained_model()
        ids = np.array(load_default().tokenizer.encode(open(__file__, encoding="utf-8").read()))[: 2 * 65]
        x, y = ids.reshape(2, 65)[:, :-1], ids.reshape(2, 65)[:, 1:]
    else:
        model = Model(GPT2_SMALL_SHAPE, gpt2_init(GPT2_SMALL_SHAPE, 0))
        x, y = (rng.integers(0, GPT2_SMALL_SHAPE.d_vocab, (1, 16)) for _ in range(2))
    return model, x, y


@pytest.fixture(scope="module")
def goldens(tmp_path_factory):
    """name → (golden, the port's inputs, directory), made once per module."""
    made = {}

    def get(name):
        if name not in made:
            model, x, y = case(name)
            d = tmp_path_factory.mktemp("c_port")
            made[name] = (golden.make(model, x, targets=y, backward=True), c_port.write_inputs(d, model, x, y), d, model)
        return made[name]

    return get


def run(goldens, name, build, defines=()):
    g, inputs, d, model = goldens(name)
    flags, build_defines = c_port.BUILDS[build]
    exe = c_port.build(flags, (*build_defines, *defines))
    return g, oracle.compare(g, c_port.run_port(exe, inputs, d, f"{build}{'-'.join(('',) + tuple(defines))}"),
                             name_map="llmc"), model


@pytest.mark.parametrize("name, build", [("trained, random tokens", b) for b in c_port.BUILDS]
                         + [("trained, text", "O3"), ("trained, text", "Ofast"),
                            ("GPT-2 small's shape", "O3"), ("GPT-2 small's shape", "Ofast")])
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
    ("BUG_GELU_BACKWARD", "GPT-2 small's shape", "grad.blocks.0.mlp.hook_pre"),
    ("BUG_SOFTMAX_PADDED", "GPT-2 small's shape", "probs"),
])
def test_a_bug_planted_in_the_port_is_named_first_at_its_op(goldens, bug, name, expected):
    g, report, _ = run(goldens, name, "O3", (bug,))
    first = report.first_divergence
    assert first is not None and first.name == expected, report.table(after_first=2)
    assert all(t.ok for t in report.tensors[: report.tensors.index(first)])
