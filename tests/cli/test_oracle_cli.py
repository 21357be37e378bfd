"""The oracle's command line after issue 25: decode and padded goldens, compare's filters, inspect's
--layers/--positions, and progress on stderr only where a person watches (a terminal), or when asked."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import numpy as np
import pytest

from refgpt.oracle import decode, golden


@pytest.mark.slow
def test_a_greedy_decode_golden_of_text_and_its_compare(refgpt_cli, tmp_path):
    path = tmp_path / "d.safetensors"
    r = refgpt_cli.in_process("golden", "The quick brown fox", "--generate", 4, "-o", path)
    assert r.returncode == 0, r.stderr
    assert "decode golden" in r.stdout and "4 steps (greedy)" in r.stdout and "row 0 chose [" in r.stdout
    g = golden.read(path)
    assert decode.info(g)["steps"] == 4 and "step.3.blocks.0.attn.cache_k" in g.tensors
    r = refgpt_cli.in_process("compare", path, path, "--names", "step.3.*logits*")
    assert r.returncode == 0 and "step.3.logits" in r.stdout and "step.2.logits" not in r.stdout
    assert "(1 of " in r.stdout and "tensors shown: --names step.3.*logits*)" in r.stdout


@pytest.mark.slow
def test_a_forced_continuation_from_a_ragged_token_file(refgpt_cli, tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("5 9 13 2 7 11 3\n8 1 4 6\n")
    path = tmp_path / "f.safetensors"
    r = refgpt_cli.in_process("golden", "--tokens", ids, "--generate", 3, "-o", path)
    assert r.returncode == 0, r.stderr
    g = golden.read(path)
    prompt = g.tensors["step.0.tokens"]  # each row's prompt is its tokens but the last 3, left-padded
    assert prompt[0].tolist() == [5, 9, 13, 2] and prompt[1, 3] == 8
    assert np.array_equal(g.tensors["attention_mask"][:, :4], [[1, 1, 1, 1], [0, 0, 0, 1]])
    assert np.array_equal(np.stack([g.tensors[f"step.{s}.chosen"] for s in range(3)], 1), [[7, 11, 3], [1, 4, 6]])
    assert decode.info(g)["continuation"] == "forced"
    r = refgpt_cli.in_process("golden", "--tokens", ids, "--generate", 3, "--greedy", "-o", tmp_path / "g.safetensors")
    assert r.returncode == 0 and "(greedy)" in r.stdout
    r = refgpt_cli.in_process("golden", "--tokens", ids, "--generate", 4, "-o", tmp_path / "x.safetensors")
    assert r.returncode == 1 and "needs more than 4 tokens" in r.stderr


@pytest.mark.slow
def test_a_padded_batch_from_texts_and_from_a_ragged_file(refgpt_cli, tmp_path):
    path = tmp_path / "p.safetensors"
    r = refgpt_cli.in_process("golden", "The cat", "A dog barked at the", "--padding-side", "left", "-o", path)
    assert r.returncode == 0, r.stderr
    assert "padded on the left" in r.stdout
    g = golden.read(path)
    assert g.tensors["attention_mask"].shape == g.tensors["tokens"].shape and "padding" in g.metadata
    ids = tmp_path / "ids.txt"
    ids.write_text("1 2 3 4 5\n6 7\n")
    r = refgpt_cli.in_process("golden", "--tokens", ids, "-o", tmp_path / "q.safetensors")
    assert r.returncode == 1 and "--padding-side" in r.stderr
    r = refgpt_cli.in_process("golden", "--tokens", ids, "--padding-side", "right", "-o", tmp_path / "q.safetensors")
    assert r.returncode == 0 and "padded on the right" in r.stdout
    r = refgpt_cli.in_process("compare", path, path, "--judge-pads")
    assert r.returncode == 0


def test_usage_errors_are_exit_2(refgpt_cli, tmp_path):
    out = tmp_path / "x.safetensors"
    for args in (("golden", "Hi", "--greedy", "-o", out), ("golden", "Hi", "--generate", 2, "--backward", "-o", out),
                 ("golden", "Hi", "there", "--generate", 2, "--padding-side", "right", "-o", out)):
        r = refgpt_cli.in_process(*args)
        assert r.returncode == 2 and r.stderr.startswith("refgpt: error:"), (args, r.stderr)


def test_inspect_layers_and_positions(refgpt_cli):
    r = refgpt_cli.in_process("inspect", "To be or not to be", "--layers", "1-2", "--positions", "0,-1", "--json")
    assert r.returncode == 0, r.stderr
    import json

    answer = json.loads(r.stdout)
    assert {(b["layer"], b["pos"]) for b in answer["blocks"]} == {(1, 0), (1, 5), (2, 0), (2, 5)}
    assert [f["pos"] for f in answer["ln_final"]] == [0, 5]
    r = refgpt_cli.in_process("inspect", "To be", "--layers", "9")
    assert r.returncode == 2 and "outside 0 … 3" in r.stderr


def _run_with_stderr_on_a_terminal(args):
    """Run ``python -m refgpt args`` with stderr a pseudo-terminal: (returncode, stdout, what the terminal got)."""
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    p = subprocess.Popen([sys.executable, "-m", "refgpt", *map(str, args)], stdout=subprocess.PIPE, stderr=follower,
                         env=env)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    out = p.stdout.read()
    p.wait()
    os.close(leader)
    return p.returncode, out.decode(), seen.decode(errors="replace")


@pytest.mark.slow
def test_progress_shows_on_a_terminal_and_stays_silent_otherwise(refgpt_cli, tmp_path):
    golden_args = ("golden", "The quick brown fox", "--generate", 3, "-o", tmp_path / "d.safetensors")
    r = refgpt_cli(*golden_args)  # stderr a pipe: silent
    assert r.returncode == 0 and r.stderr == ""
    r = refgpt_cli(*golden_args, "--progress")
    assert r.returncode == 0 and "refgpt golden: 9/9 (100%)" in r.stderr and "refgpt golden" not in r.stdout
    rc, out, terminal = _run_with_stderr_on_a_terminal(golden_args)
    assert rc == 0 and "refgpt golden: 9/9 (100%)" in terminal and "decode golden" in out
    rc, out, terminal = _run_with_stderr_on_a_terminal((*golden_args, "--quiet"))
    assert rc == 0 and terminal == ""
    rc, out, terminal = _run_with_stderr_on_a_terminal(("generate", "To be", "-n", 4, "--temperature", 0))
    assert rc == 0 and "refgpt generate: 4/4 (100%)" in terminal
    r = refgpt_cli("golden", "Hello there", "--backward", "--progress", "-o", tmp_path / "b.safetensors")
    assert r.returncode == 0 and "refgpt golden: 24/24 (100%)" in r.stderr  # 3 passes × 4 blocks × forward, backward
