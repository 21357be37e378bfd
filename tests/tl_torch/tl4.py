"""TransformerLens 4 beside TransformerLens 3.9, for the tests that use it as a second peer.

TransformerLens 4.x has only the TransformerBridge (no HookedTransformer) and cannot be installed
in the same environment as 3.9 (one ``transformer_lens`` package). Its dependencies are 3.9's
plus transformers ≥ 5.9, which the ``peers`` extra pins, so it needs no environment of its own:
``pip install --no-deps --target .cache/tl4/<version>`` puts the one package in a directory, and a
test process with that directory first on ``sys.path`` (``PYTHONPATH``) imports TransformerLens 4
while every dependency comes from the test environment. The first test that needs it makes the
directory (one download of ~3 MB, seconds) and it is kept in the repository's gitignored
``.cache/``, so no later run, in CI or not, downloads or installs anything. (A virtual environment
of its own would cost a second torch and transformers for nothing: only the one package clashes.)
``python tests/tl_torch/tl4.py`` makes it by hand; ``REFGPT_TL4_DIR`` points elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

VERSION = "4.3.0"
REPO = Path(__file__).resolve().parents[2]


def overlay_dir() -> Path:
    return Path(os.environ.get("REFGPT_TL4_DIR", REPO / ".cache" / "tl4" / VERSION))


def overlay(timeout=600) -> tuple[Path | None, str]:
    """(the directory holding TransformerLens VERSION, "") or (None, why it is not available)."""
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) < Version("5.9"):
        return None, f"TransformerLens {VERSION} needs transformers ≥ 5.9, this environment has {transformers.__version__}"
    target = overlay_dir()
    marker = target / "transformer_lens" / "__init__.py"
    if marker.exists():
        return target, ""
    partial = target.with_name(target.name + ".partial")
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(partial),
                               f"transformer-lens=={VERSION}"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:  # offline, or a hung index: a skip with its reason, not an error
        return None, f"pip could not fetch transformer-lens=={VERSION} within {timeout} s"
    if done.returncode != 0 or not (partial / "transformer_lens" / "__init__.py").exists():
        return None, f"pip could not fetch transformer-lens=={VERSION}: {done.stderr.strip()[-300:]}"
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, target)
    return target, ""


def environment(directory: Path) -> dict:
    """os.environ for a subprocess importing TransformerLens 4 from ``directory`` (and refgpt from this tree)."""
    path = os.pathsep.join([str(directory), str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


if __name__ == "__main__":  # make the directory by hand
    found, why = overlay()
    print(found or f"not made: {why}")
