"""What every benchmark records about the machine, and how it updates its own part of RESULTS.md.

RESULTS.md is written by several benchmarks, each owning one section between
``<!-- begin NAME -->`` and ``<!-- end NAME -->``; ``update_section`` replaces one and keeps the
rest (older machines' tables included).
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"


def blas() -> list[dict]:
    """The BLAS (and OpenMP) libraries loaded, with OpenBLAS's kernel ("architecture"): SkylakeX
    on AVX-512 machines, Haswell on AVX2-only ones. threadpoolctl is the ``bench`` extra."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return [{"error": "threadpoolctl not installed (pip install refgpt[bench])"}]
    keys = ("internal_api", "prefix", "version", "num_threads", "architecture")
    return [{k: info.get(k) for k in keys if info.get(k) is not None} for info in threadpool_info()]


def blas_kernel() -> str:
    """One line: e.g. 'openblas 0.3.31 SkylakeX, 2 threads'."""
    for info in blas():
        if info.get("internal_api") in ("openblas", "mkl", "blis"):
            return (f"{info['internal_api']} {info.get('version', '?')} {info.get('architecture', '?')}, "
                    f"{info.get('num_threads', '?')} threads")
    return "BLAS unknown (threadpoolctl not installed)"


def machine() -> dict:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    cpu = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
               platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "avx512": "avx512f" in info, "avx2": "avx2" in info,
            "python": platform.python_version(), "platform": platform.platform(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                                  text=True).stdout.strip(),
            "blas_kernel": blas_kernel(), "blas": blas(),
            "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
            "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE"),
            "load_average": os.getloadavg()}


def describe(m: dict) -> str:
    """One sentence for a results section: where and with what it was measured."""
    return (f"{m['date']}, commit {m['git']}: {m['cpu']}, {m['cores']} cores "
            f"({'AVX-512' if m['avx512'] else 'AVX2' if m['avx2'] else 'no AVX2'}), {m['blas_kernel']}, "
            f"OPENBLAS_CORETYPE={m['OPENBLAS_CORETYPE']}, Python {m['python']}, "
            f"load average at the start {m['load_average'][0]:.1f}")


def update_section(name: str, text: str, path: Path = RESULTS) -> None:
    """Replace section ``name`` of RESULTS.md with ``text`` (appended if absent)."""
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    block = f"{begin}\n{text.rstrip()}\n{end}"
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    if begin in old and end in old:
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip() + "\n\n" + block + "\n"
    path.write_text(new)
