"""Build and run tests/oracle/c_port/gpt2_port.c, a float32 GPT-2 in sequential C loops.

``build(flags, defines)`` compiles it once per (compiler flags, defines) into a cache directory
and returns the executable (None without a C compiler); ``run_port(exe, model, tokens, targets,
d)`` writes the model as an llm.c checkpoint and the batch as an llm.c debug state, runs the
port, and returns the path of its dump (refgpt/oracle/llmc_dump.py), which ``refgpt compare
--map llmc`` reads. The builds the tests and benchmarks/oracle_tolerance.py use are ``BUILDS``:
the three accumulation orders of the source at -O3, and -Ofast (reassociated, vectorised sums,
fast exp/tanh, denormals flushed) and -O3 -march=native (fused multiply-adds) in index order.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).resolve().parent / "oracle" / "c_port" / "gpt2_port.c"

#: name → (compiler flags, defines): the accumulation orders a correct float32 port may use.
BUILDS = {
    "O3": (("-O3",), ()),
    "O3-reversed": (("-O3",), ("ORDER=1",)),
    "O3-8-lanes": (("-O3",), ("ORDER=2",)),
    "Ofast": (("-Ofast",), ()),
    "O3-fma": (("-O3", "-march=native"), ()),
}


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build(flags=("-O3",), defines=()) -> Path | None:
    """The port compiled with ``flags`` and ``-D`` ``defines`` (cached by their hash and the
    source's); None when there is no C compiler."""
    cc = compiler()
    if cc is None:
        return None
    key = hashlib.sha256(repr((cc, tuple(flags), tuple(defines), SOURCE.read_bytes())).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("REFGPT_C_PORT_CACHE", Path(tempfile.gettempdir()) / "refgpt-c-port"))
    exe = cache / f"gpt2_port-{key}"
    if not exe.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".{exe.name}.{os.getpid()}"
        subprocess.run([cc, *flags, *(f"-D{d}" for d in defines), "-o", str(tmp), str(SOURCE), "-lm"], check=True)
        os.replace(tmp, exe)
    return exe


def run_port(exe, model, tokens, targets, d, name="port") -> Path:
    """Run the port ``exe`` on ``model`` (a refgpt Model llm.c can represent) with inputs
    ``tokens`` [B, T] and ``targets`` [B, T]; returns its dump ``d/NAME.bin``."""
    from refgpt.oracle import llmc

    d = Path(d)
    weights, state, out = d / f"{name}-model.bin", d / f"{name}-state.bin", d / f"{name}.bin"
    llmc.write_model(weights, model)
    llmc.write_debug_state(state, model, np.asarray(tokens), grads=False, targets=np.asarray(targets))
    subprocess.run([str(exe), str(weights), str(state), str(out)], check=True, capture_output=True)
    return out
