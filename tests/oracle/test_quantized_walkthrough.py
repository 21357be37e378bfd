"""docs/oracle.md's quantized-port example ("Checking a quantized port"), run command by command.

The page's commands run verbatim in a directory holding the embedded trained model as ``gpt2-dir``;
``port.npz`` and ``bug.npz`` are tests/quantized_port.py's ggml-style port, correct and with its
Q4_0 nibbles swapped, written before the first command that reads them. The lines the page shows
are checked against what compare prints, and the worst correct product's share of its bound."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys

import numpy as np

import refgpt
from doc_pages import DOCS
from quantized_port import QuantizedPort
from refgpt.oracle import golden

ROOT = DOCS.parent
SECTION = "## Checking a quantized port"


def section() -> str:
    text = (DOCS / "oracle.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", section(), flags=re.S)


def test_the_quantized_walkthrough_runs_and_shows_what_compare_prints(tmp_path):
    source = refgpt.default_model_path()
    (tmp_path / "gpt2-dir").mkdir()
    for name in ("config.json", "model.safetensors", "vocab.json", "merges.txt"):
        shutil.copy(source / name, tmp_path / "gpt2-dir" / name)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    outputs = {}
    for command in [line.strip() for line in blocks("bash")[0].splitlines() if line.strip()]:
        if "port.npz" in command and not (tmp_path / "port.npz").exists():
            tokens = np.asarray(golden.read(tmp_path / "q4.safetensors").tensors["tokens"])[0]
            np.savez(tmp_path / "port.npz", **QuantizedPort(tmp_path / "gpt2.Q4_0.gguf").run(tokens))
            np.savez(tmp_path / "bug.npz", **QuantizedPort(tmp_path / "gpt2.Q4_0.gguf", bugs=["nibble_order"]).run(tokens))
        words = shlex.split(command)
        argv = [sys.executable, "-m", "refgpt", *words[1:]] if words[0] == "refgpt" else [sys.executable, *words[1:]]
        r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode in (0, 1), (command, r.stderr)
        outputs[command] = (r.returncode, r.stdout)
    compares = [c for c in outputs if c.startswith("refgpt compare")]
    correct, bug = (outputs[c] for c in compares)
    assert correct[0] == 0 and bug[0] == 1
    shown_correct, shown_bug = blocks("text")[:2]  # the walkthrough's; the llama.cpp example after it is test_llama_cpp's
    for shown, (_, printed) in ((shown_correct, correct), (shown_bug, bug)):
        for line in shown.splitlines():
            if line != "...":
                assert line in printed.splitlines(), line
    worst = max(float(line.split()[3]) for line in correct[1].splitlines() if line.endswith("  ok") and not line.split()[1].startswith("("))  # products, not LayerNorm, GELU, add
    assert f"a correct port's worst product uses\n{worst:.2f} of its bound" in section()
