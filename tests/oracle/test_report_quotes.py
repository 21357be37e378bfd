"""The report quotes the files (issue 25, item 3), and a reference without the candidate's gradients
is a failure, never a silent OK.

Every value the first-divergence paragraph prints is a file's own value at the index it prints; a
tensor judged up to a per-row shift or factor says so and prints it; the first index shown is an
element out beyond that shift, and the fraction counts such elements only.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from doc_pages import DOCS, load_script
from refgpt import Config, Model
from refgpt.files.safetensors_file import SafetensorsWriter
from refgpt.oracle import comparison as oracle
from refgpt.oracle import golden

example = load_script(DOCS / "oracle_example.py")
CFG = Config(d_model=16, n_layers=2, n_heads=2, d_mlp=32, d_vocab=20, n_ctx=8)
TOKENS = np.array([[3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5, 8, 9, 7, 9, 3]])


def refgpt_cli(*args):
    return subprocess.run([sys.executable, "-m", "refgpt", *map(str, args)], capture_output=True, text=True)


def save(path, tensors):
    shapes = {n: (np.asarray(a).dtype, np.shape(a)) for n, a in tensors.items()}
    with SafetensorsWriter(path, shapes, {}) as out:
        for n, a in tensors.items():
            out.write(n, np.asarray(a))
    return path


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    model = Model(CFG, example.realistic_params(CFG, seed=3))
    path = tmp_path_factory.mktemp("g") / "golden.safetensors"
    golden.write(path, golden.make(model, TOKENS, backward=True))
    return path, model


@pytest.mark.slow
def test_one_logit_plus_a_half_is_named_at_its_index_with_the_files_values(ref, tmp_path):
    path, _ = ref
    g = golden.read(path)
    edited = {n: np.array(a) for n, a in g.tensors.items()}
    edited["logits"][0, 2, 5] += 0.5  # what a port author tries first
    r = refgpt_cli("compare", path, save(tmp_path / "edited.safetensors", edited))
    assert r.returncode == 1, r.stderr
    first = next(line for line in r.stdout.splitlines() if line.startswith("first divergence:"))
    was, now = float(g.tensors["logits"][0, 2, 5]), float(edited["logits"][0, 2, 5])
    assert first.startswith("first divergence: logits (outside the blocks), first at batch 0, pos 2, d_vocab 5 "
                            "(index [0, 2, 5]): ")
    assert f"candidate {now:.9g}, reference {was:.9g}" in first  # the two files' numbers, at that index
    assert "judged after the row's shift 0:" in first  # the median of the row's differences: the other 19 are 0
    vocab = g.tensors["logits"].size
    assert f"1 of {vocab} elements (" in first and "beyond their row's shift" in first  # one element, not a position
    report = oracle.compare(path, edited)
    t = report["logits"]
    assert t.first_bad.index == (0, 2, 5) and t.first_bad.candidate == now and t.first_bad.reference == was
    assert t.frac_out == 1 / vocab and t.worst is None or t.worst.index == (0, 2, 5)


def test_a_softmax_row_off_by_more_than_its_one_sum_can_be_says_so_with_the_sums(ref):
    path, model = ref
    g = golden.read(path)
    probs = np.exp(np.asarray(g.tensors["log_probs"]))  # [batch, pos, d_vocab]
    probs[1, 3] *= 1.01  # the row's sum off by 1 %: far more than rounding of one sum of 20 terms
    report = oracle.compare(path, {"tokens": g.tensors["tokens"], "logits": g.tensors["logits"], "probs": probs})
    first = report.first_divergence
    assert first.name == "probs" and first.row.rows_out == 1 and first.row.first_out == [1, 3]
    text = oracle.describe_divergence(first)
    assert f"the row at [1, 3] (batch 1, pos 3) sums to {probs[1, 3].sum():.9g} in the candidate" in text
    assert "(exp of the golden's log_probs)" in text and "factor 1.01" in text


@pytest.mark.slow
def test_gradients_against_a_golden_without_them_fail_unless_forward_only(ref, tmp_path):
    path, model = ref
    forward = tmp_path / "forward.safetensors"
    golden.write(forward, golden.make(model, TOKENS))
    cand = save(tmp_path / "cand.safetensors", golden.compute(Model(CFG, dict(model.params), dtype="float32"), TOKENS,
                                                            backward=True))
    report = oracle.compare(forward, cand)
    assert not report.ok and all(t.ok for t in report.tensors)
    assert "--backward" in report.too_little[0] and "--forward-only" in report.too_little[0]
    r = refgpt_cli("compare", forward, cand)
    assert r.returncode == 1 and "made without --backward" in r.stdout
    r = refgpt_cli("compare", forward, cand, "--forward-only")
    assert r.returncode == 0 and "OK: all" in r.stdout and "--forward-only: the candidate's" in r.stdout
    assert refgpt_cli("compare", path, cand).returncode == 0  # the golden with gradients judges them all
