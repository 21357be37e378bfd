"""``refgpt attribute``: the table and --json say what refgpt.attribute computes, the sum check is
printed, and bad input is one line with exit status 2 (usage) or 1."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import refgpt
from random_models import random_model, rel_err, save_checkpoint
from refgpt import Config
from refgpt.analysis.attribution import naive_attribution
from refgpt.gpt2.tokenizer import bytes_to_unicode

pytestmark = pytest.mark.slow  # every test here runs the command end to end, a second or more each

TEXT = "Hello, world"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random byte-vocabulary GPT-2 (float64 on disk) with vocab.json and an empty merges.txt."""
    cfg = Config(d_model=16, n_layers=2, n_heads=4, d_mlp=24, d_vocab=257, n_ctx=32)
    directory = save_checkpoint(random_model(cfg, seed=21, scale=0.5), tmp_path_factory.mktemp("attr"), dtype=np.float64)
    vocab = {char: byte for byte, char in bytes_to_unicode().items()} | {"<|endoftext|>": 256}
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (directory / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    return directory


def test_json_matches_the_python_api(refgpt_cli, checkpoint):
    done = refgpt_cli("attribute", TEXT, "--target", " ", "--against", "#100", "--granularity", "head", "--top", "5",
                         "--model", str(checkpoint), "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    model = refgpt.load(checkpoint)
    logits, cache = model.run_with_cache(model.to_tokens(TEXT, prepend_bos=False)[0][None])
    result = refgpt.attribute(cache, 32, 100, granularity="head", logits=logits)
    values = result.values[:, 0, -1]
    assert answer["target"]["id"] == 32 and answer["against"]["id"] == 100 and answer["n_components"] == len(values)
    assert [row["component"] for row in answer["top"]] == [label for label, _ in result.top(5)]
    assert [row["contribution"] for row in answer["top"]] == [value for _, value in result.top(5)]
    shares = [row["cumulative_share"] for row in answer["top"]]
    assert shares == sorted(shares) and 0 < shares[-1] <= 1
    assert rel_err(answer["sum"], answer["logit"]) <= 1e-12 and answer["rel_error"] <= 1e-12
    assert answer["logit"] == float(logits[0, -1, 32] - logits[0, -1, 100])
    assert answer["untrained"] is False and answer["position"] == len(TEXT) - 1


def test_table_prints_components_and_the_sum_check(refgpt_cli, checkpoint):
    done = refgpt_cli("attribute", TEXT, "--target", "o", "--granularity", "neuron", "--top", "7", "--pos", "3",
                         "--model", str(checkpoint))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("component"))
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[header + 1:header + 8]]
    assert len(rows) == 7 and all(row[2].endswith("%") for row in rows)
    assert "position 3 ('l')" in out and "logit of 'o' (id 111)" in out
    total = float(re.search(r"sum of all \d+ components\s+(\S+)", out).group(1))
    logit = float(re.search(r"the model's logit\s+(\S+)", out).group(1))
    assert rel_err(total, logit) <= 1e-12 and re.search(r"\|sum − logit\|\s+\S+ \(relative", out)


@pytest.mark.parametrize("argv, status, message", [
    ([TEXT, "--target", "ab"], 1, "'ab' is 2 tokens"),
    ([TEXT, "--target", "#999"], 1, "outside the vocabulary"),
    ([TEXT, "--target", "#x"], 1, "#ID"),
    ([TEXT], 2, "--target"),
    ([TEXT, "--target", "a", "--granularity", "heads"], 2, "invalid choice"),
    ([TEXT, "--target", "a", "--pos", "40"], 1, "--pos"),
])
def test_bad_input_is_one_line(refgpt_cli, checkpoint, argv, status, message):
    done = refgpt_cli("attribute", *argv, "--model", str(checkpoint))
    assert done.returncode == status
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("refgpt: error:") and message in done.stderr


def test_naive_is_the_page_s_section_1(refgpt_cli, tmp_path):
    """docs/decomposition.md §1's command prints the page's σ and both sums (N15, N18, N14),
    --json gives naive_attribution's numbers, and --plot writes the figure."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "decomposition.md").read_text(encoding="utf-8")
    command = next(line.strip() for line in page.splitlines() if line.strip().startswith("refgpt attribute"))
    args = [a.strip('"') for a in re.findall(r'"[^"]*"|\S+', command)[1:]]
    args[args.index("--plot") + 1] = str(tmp_path / "naive.png")
    done = refgpt_cli(*args)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "naive.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    quoted = {name: re.search(r"([-+\d.]+) \(" + name + r"\)", page).group(1) for name in ("N14", "N15", "N18")}
    assert f"ln_final σ at position 5 = {quoted['N15']}" in done.stdout
    answer = json.loads(refgpt_cli(*args[:args.index("--plot")], "--json").stdout)
    assert f"{answer['ln_final_scale']:.3f}" == quoted["N15"] and f"{answer['naive_sum']:.2f}" == quoted["N18"]
    assert f"{answer['logit']:.4f}" == f"{answer['exact_sum']:.4f}" == quoted["N14"]
    model = refgpt.load_default()
    logits, cache = model.run_with_cache(model.to_tokens("To be, or not to", prepend_bos=False))
    result = naive_attribution(cache, " be", logits=logits)
    assert [p["naive"] for p in answer["pieces"]] == result.naive.tolist()
    assert [p["exact"] for p in answer["pieces"]] == result.exact.tolist()


def test_plot_goes_with_naive(refgpt_cli):
    done = refgpt_cli("attribute", TEXT, "--target", " ", "--plot", "x.png")
    assert done.returncode == 2 and done.stderr.strip().endswith("--plot draws --naive's figure: it goes with --naive")


@pytest.mark.parametrize("extra", [["--top", "3"], ["--granularity", "head"]])
def test_naive_refuses_the_options_it_would_ignore(refgpt_cli, extra):
    status, _, err = refgpt_cli.in_process("attribute", "To be, or not to", "--target", " be", "--naive", *extra)
    assert status == 2 and "do not apply" in err
