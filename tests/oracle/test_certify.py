"""A golden that states its own error: ``--certify`` measures every tensor against np.longdouble, and
compare prints it beside the candidate's error."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from random_models import random_params
from refgpt import Config, Model
from refgpt.dtypes import EXTENDED_DTYPE
from refgpt.oracle import certify, golden
from refgpt.oracle import comparison as oracle

pytestmark = pytest.mark.skipif(EXTENDED_DTYPE is None, reason="np.longdouble is no wider than float64 here")

CFG = Config(d_model=16, n_layers=2, n_heads=2, d_mlp=64, d_vocab=40, n_ctx=10)
TOKENS = np.random.default_rng(2).integers(0, CFG.d_vocab, size=(2, 7))


def model():
    return Model(CFG, {k: v.astype(np.float32).astype(np.float64) for k, v in random_params(CFG, 6, 0.5).items()})


def test_extended_precision_is_wider_than_float64():
    assert np.finfo(EXTENDED_DTYPE).nmant >= 63 and "64-bit significand" in certify.extended_precision()


def test_certificate_measures_the_golden_error_of_every_tensor_forward_and_backward():
    m = model()
    g = certify.add_certificate(golden.make(m, TOKENS, backward=True), m, TOKENS)
    rel = json.loads(g.metadata["golden_error"])
    floats = [n for n, a in g.tensors.items() if np.asarray(a).dtype.kind == "f"]
    assert set(rel) == set(floats)
    nonzero = {n: e for n, e in rel.items() if e <= certify.ZERO_IN_EXACT_ARITHMETIC}
    assert len(nonzero) >= len(rel) - 2 * CFG.n_layers  # only ∂b_K is 0 in exact arithmetic
    assert max(nonzero.values()) < 1e-13 and max(nonzero.values()) > 0  # float64 rounding, measured
    assert rel["hook_embed"] == 0.0  # a gather is exact
    # it measures: an error put into the golden is found, at its size
    g.tensors["blocks.0.hook_resid_mid"] = g.tensors["blocks.0.hook_resid_mid"] + 1e-9
    again, _ = certify.measure(g.tensors, m, TOKENS)
    scale = max(1.0, np.abs(g.tensors["blocks.0.hook_resid_mid"]).max())
    assert again["blocks.0.hook_resid_mid"] == pytest.approx(1e-9 / scale, rel=1e-3)


def test_compare_prints_the_golden_error_beside_the_candidates(tmp_path):
    m = model()
    g = certify.add_certificate(golden.make(m, TOKENS), m, TOKENS)
    cand = golden.compute(Model(CFG, dict(m.params), dtype="float32"), TOKENS)
    report = oracle.compare(g, cand)
    assert report.ok and report["logits"].golden_error is not None
    assert "golden err" in report.table() and "the golden is certified" in report.table()
    cand["blocks.1.mlp.hook_post"] = cand["blocks.1.mlp.hook_post"] * 1.01
    text = oracle.compare(g, cand).table()
    assert "The golden's own error at blocks.1.mlp.hook_post is ≤" in text and "yours is" in text


@pytest.mark.slow
def test_golden_cli_certify(tmp_path):
    from refgpt.oracle import llmc

    m = model()
    llmc.write_model(tmp_path / "m.bin", Model(CFG, {**dict(m.params), "unembed.W_U": m.params["embed.W_E"].T}))
    (tmp_path / "ids.txt").write_text("1 2 3 4 5\n")
    r = subprocess.run([sys.executable, "-m", "refgpt", "golden", "--model", tmp_path / "m.bin", "--tokens",
                        tmp_path / "ids.txt", "--backward", "--certify", "-o", tmp_path / "g.safetensors"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "certified against np.longdouble" in r.stdout and "relative to its scale" in r.stdout
    assert golden.read(tmp_path / "g.safetensors").golden_error
