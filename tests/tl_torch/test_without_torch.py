"""Without the torch extra, importing refgpt.tl_torch is one RefGPTError saying what to install,
not a ModuleNotFoundError from inside the room (run in a process where torch cannot be imported)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BLOCK_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
sys.meta_path.insert(0, NoTorch())
import refgpt
try:
    import refgpt.tl_torch
except refgpt.RefGPTError as error:
    print("RefGPTError:", error)
"""


def test_importing_tl_torch_without_torch_says_what_to_install():
    out = subprocess.run([sys.executable, "-c", BLOCK_TORCH], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("RefGPTError: refgpt.tl_torch needs torch"), out.stdout
    assert "pip install torch" in out.stdout
