"""The SAE shipped for the embedded model (weights/default_sae/), its numbers on the pages, and the
command line on it: ``refgpt attribute --sae``, ``refgpt eval-sae`` (which flags a TopK SAE read as
ReLU, SAELens #553, and weights processed otherwise than the SAE's, #405)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import refgpt
from doc_pages import doc_script
from refgpt.files.default_model import default_sae_path
from refgpt.sae import SAE, save_sae
from refgpt.sae.evaluation import activations, token_rows
from refgpt.sae.training import SAESettings, train

REPO = Path(__file__).resolve().parents[2]
MACBETH = REPO / "tests" / "data" / "macbeth_act1.txt"


@pytest.fixture(scope="module")
def short_text(tmp_path_factory):
    """The first 6,000 characters of macbeth_act1.txt (about 13 windows): enough to measure on, fast."""
    path = tmp_path_factory.mktemp("text") / "macbeth.txt"
    path.write_text(MACBETH.read_text(encoding="utf-8")[:6000], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def rows():
    script, page = doc_script("make_sae_numbers.py", "sae.md")
    return script.numbers(), page


@pytest.mark.slow
def test_the_pages_quote_every_number_as_computed(rows):
    numbers, page = rows
    readme = (REPO / "weights" / "README.md").read_text(encoding="utf-8")
    for name, text in numbers.items():
        if name == "S12":  # a measured rounding error: the page states a power of ten above it
            assert float(text) <= 1e-13 and "≤ 1e-13 (S12)" in page
            continue
        assert f"{text} (S{name[1:]})" in " ".join(page.split()), (name, text)
    tags = set(re.findall(r"\((S\d+)\)", page))
    assert tags == set(numbers), tags ^ set(numbers)
    for name in ("S1", "S2", "S3", "S4"):
        assert f"{numbers[name]} ({name})" in " ".join(readme.split()), name


def test_the_shipped_sae_is_what_its_log_says():
    import hashlib

    folder = default_sae_path()
    log = json.loads((folder / "training_log.json").read_text())
    for name, digest in log["sha256"].items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
    readme = " ".join((REPO / "weights" / "README.md").read_text(encoding="utf-8").split())
    held = log["held_out"]
    assert (f"On the three held-out works ({held['positions']:,} positions): L0 {held['l0']:.2f}, explained variance "
            f"{held['explained_variance']:.4f}, no dead feature") in readme and held["dead_features"] == 0
    assert f"float64, seeded, one BLAS thread: {log['seconds']} s on one core" in readme
    sae = refgpt.load_sae(folder)
    assert sae.architecture == "standard" and sae.hook_name == "blocks.2.hook_resid_pre" and sae.sparsity is not None


def test_attribute_with_the_default_sae(refgpt_cli):
    out = refgpt_cli.in_process("attribute", "To be, or not to", "--target", " be", "--sae", "default", "--json")
    assert out.returncode == 0, out
    answer = json.loads(out.stdout)
    assert answer["rel_error"] <= 1e-12
    labels = [row["component"] for row in answer["top"]]
    assert "sae_error" in labels or any(label.startswith("F") for label in labels)
    features = answer["sae"]["features"]
    assert len(features) == answer["sae"]["l0"] > 0 and all(f["activation"] > 0 for f in features)
    text = refgpt_cli.in_process("attribute", "To be, or not to", "--target", " be", "--sae", "default")
    assert "features active here" in text.stdout and "|sum − logit|" in text.stdout


@pytest.mark.slow
def test_sae_eval_says_nothing_wrong_about_the_default_sae(refgpt_cli, short_text):
    out = refgpt_cli.in_process("eval-sae", "default", "--text", short_text, "--json")
    assert out.returncode == 0, out
    answer = json.loads(out.stdout)
    assert answer["warnings"] == [] and answer["explained_variance"] > 0.5


@pytest.mark.slow
def test_sae_eval_flags_processed_weights(refgpt_cli, short_text):
    out = refgpt_cli.in_process("eval-sae", "default", "--text", short_text, "--process", "--json")
    assert out.returncode == 0, out
    assert any("center_writing_weights=False" in w for w in json.loads(out.stdout)["warnings"])
    refused = refgpt_cli.in_process("attribute", "To be", "--target", " be", "--sae", "default", "--process")
    assert refused.returncode == 1 and "center_writing_weights" in refused.stderr


@pytest.mark.slow
def test_sae_eval_flags_a_topk_sae_read_as_relu(refgpt_cli, tmp_path, short_text):
    """SAELens #553: a TopK SAE (trained here, briefly, on the embedded model) saved as "standard"."""
    model = refgpt.load_default()
    cfg = {"d_in": 144, "d_sae": 288, "architecture": "topk", "k": 16, "apply_b_dec_to_input": True,
           "normalize_activations": "none", "reshape_activations": "none",
           "metadata": {"hook_name": "blocks.2.hook_resid_pre", "prepend_bos": True}}
    stub = SAE(cfg, {})
    x, _ = activations(model, stub, token_rows(model, stub, documents=[short_text.read_text("utf-8")]))
    params, _ = train(x, SAESettings(d_sae=288, k=16, steps=150, batch=256))
    save_sae(SAE(cfg, params), tmp_path / "topk")
    save_sae(SAE({**{k: v for k, v in cfg.items() if k != "k"}, "architecture": "standard"}, params), tmp_path / "as_relu")
    right = json.loads(refgpt_cli.in_process("eval-sae", tmp_path / "topk", "--text", short_text, "--json").stdout)
    wrong = json.loads(refgpt_cli.in_process("eval-sae", tmp_path / "as_relu", "--text", short_text, "--json").stdout)
    assert right["warnings"] == [] and right["l0"] == 16
    assert wrong["l0"] > 0.25 * 288 and wrong["explained_variance"] < right["explained_variance"]
    assert any("TopK SAE loaded as ReLU" in w for w in wrong["warnings"]), wrong["warnings"]
    assert right["alternatives"]["read as ReLU"]["explained_variance"] == pytest.approx(wrong["explained_variance"])


def test_an_sae_that_claims_centred_weights_is_measured_both_ways():
    """#405: the cfg says center_writing_weights, the model is raw: the warning, and the measures on
    the stream centred (x − mean(x) along d_model, the stream centred writing weights give)."""
    from refgpt.sae.evaluation import diagnose

    model = refgpt.load_default()
    sae = refgpt.load_sae(default_sae_path())
    sae.cfg["metadata"]["model_from_pretrained_kwargs"] = {"center_writing_weights": True}
    result = diagnose(model, sae, token_rows(model, sae, ["To be, or not to be, that is the question"]))
    assert any("center_writing_weights=True" in w for w in result.warnings)
    centred = result.alternatives["the stream centred"]
    processed = refgpt.tl.processing.process(model, ["center_writing_weights"])
    x, _ = activations(processed, sae, token_rows(processed, sae, ["To be, or not to be, that is the question"]))
    from refgpt.sae.evaluation import measure
    # the two streams differ by float64 rounding of the same sums: measured 1.2e-16 relative here
    assert centred.explained_variance == pytest.approx(measure(sae, x).explained_variance, rel=1e-13)
