"""docs/oracle.md's decode walkthrough ("A failing `generate`"), run command by command.

The page's commands run verbatim in a directory holding the embedded trained model as ``gpt2-dir``
(an HF GPT-2 directory); "your port", ``mine.safetensors``, is refgpt's float32 decoding loop with
the page's bug planted (position ids off by one from the first cached step), written before the
first command that reads it. The page shows what compare prints: checked against what it prints."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import refgpt
from doc_pages import DOCS
from refgpt.oracle import decode, golden

pytestmark = pytest.mark.peer  # the page's HF command needs the peers extra

ROOT = DOCS.parent
SECTION = "## A failing `generate`"


def section() -> str:
    text = (DOCS / "oracle.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    return text[start: text.find("\n## ", start + 1)]


def commands() -> list[str]:
    return [line.strip() for block in re.findall(r"```bash\n(.*?)```", section(), flags=re.S)
            for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]


def my_port(d: Path):
    """The page's port: refgpt's float32 loop, its position ids off by one from the first cached step."""
    m = refgpt.load(d / "gpt2-dir", dtype="float32")
    W_pos = m.params["pos_embed.W_pos"]

    def off_by_one(pos_embed, hook):
        if hook.start == 0:
            return pos_embed
        return np.broadcast_to(W_pos[hook.start + 1:hook.start + 1 + pos_embed.shape[1]], pos_embed.shape).copy()

    prompt = m.to_tokens("The quick brown fox", prepend_bos=False)
    with m.hooks([("hook_pos_embed", off_by_one)]):
        tensors, chosen = decode.run(m, prompt, 8)
    golden.write(d / "mine.safetensors", golden.Golden({"tokens": np.concatenate([prompt, chosen], 1), **tensors}, {}))


def test_the_decode_walkthrough_runs_and_names_the_step(tmp_path):
    pytest.importorskip("torch", reason="the page's HF command needs the 'peers' extra")
    pytest.importorskip("transformers", reason="the page's HF command needs the 'peers' extra")
    source = refgpt.default_model_path()
    (tmp_path / "gpt2-dir").mkdir()
    for name in ("config.json", "model.safetensors", "vocab.json", "merges.txt"):
        shutil.copy(source / name, tmp_path / "gpt2-dir" / name)
    outputs = []
    for command in commands():
        if "mine.safetensors" in command and not (tmp_path / "mine.safetensors").exists():
            my_port(tmp_path)
        words = shlex.split(command)
        if words[0] == "refgpt":
            argv = [sys.executable, "-m", "refgpt", *words[1:]]
        else:
            assert words[:2] == ["python", "benchmarks/dump_hf_tl.py"], command
            argv = [sys.executable, str(ROOT / words[1]), *words[2:]]
        r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode in (0, 1), (command, r.stderr)
        outputs.append((command, r.returncode, r.stdout))
    by = {c: (rc, out) for c, rc, out in outputs}
    assert by["refgpt compare decode.safetensors hf_decode.safetensors --map hf"][0] == 0
    rc, out = by["refgpt compare decode.safetensors mine.safetensors"]
    assert rc == 1
    first = next(line for line in out.splitlines() if line.startswith("first divergence:"))
    shown = first[: first.index("; ")]  # up to the share of elements out: BLAS may move the last digits after it
    assert shown.split(": candidate")[0] in section(), shown
    row = next(line for line in out.splitlines() if "FIRST DIVERGENCE" in line)
    assert row.split()[:2] == ["step.1.hook_pos_embed", "[1,"] and "step.1.hook_pos_embed" in section()
    rc, zoom = by["refgpt compare decode.safetensors mine.safetensors --names 'step.1.blocks.0.*' --failing"]
    assert rc == 1 and "tensors shown: --names step.1.blocks.0.* and --failing)" in zoom
    assert all(line.startswith("step.1.blocks.0.") for line in zoom.split("\n\n")[0].splitlines()[2:-1])
    golden_out = by['refgpt golden --model gpt2-dir "The quick brown fox" --generate 8 -o decode.safetensors'][1]
    chose = next(line for line in golden_out.splitlines() if line.startswith("row 0 chose"))
    assert "8 steps (greedy)" in golden_out and chose.replace("\n", " ").split(" '")[0] in section().replace("\n", " ")
