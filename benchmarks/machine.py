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
    on AVX-512 machines, Haswell on AVX2-only ones (or with OPENBLAS_CORETYPE=Haswell).
    threadpoolctl (the ``bench`` extra) when installed; else NumPy's OpenBLAS asked directly."""
    import numpy  # noqa: F401 — loads the BLAS: threadpoolctl sees only libraries already loaded

    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return [_openblas_by_ctypes()]
    keys = ("internal_api", "prefix", "version", "num_threads", "architecture")
    return [{k: info.get(k) for k in keys if info.get(k) is not None} for info in threadpool_info()]


def _openblas_by_ctypes() -> dict:
    """threadpoolctl's fields for NumPy's OpenBLAS, read as it reads them (openblas_get_config,
    openblas_get_corename), through the library refgpt.threads finds."""
    import ctypes

    from refgpt import threads

    for path in threads._blas_libraries():
        try:
            lib = ctypes.CDLL(str(path), mode=getattr(os, "RTLD_NOLOAD", 0))
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas_", "64_"), ("scipy_openblas_", ""), ("openblas_", "64_"), ("openblas_", "")):
            config, core = getattr(lib, f"{prefix}get_config{suffix}", None), getattr(lib, f"{prefix}get_corename{suffix}", None)
            if config is None or core is None:
                continue
            config.restype = core.restype = ctypes.c_char_p
            version = config().decode().split()
            return {"internal_api": "openblas", "prefix": path.name, "version": version[1] if len(version) > 1 else "?",
                    "num_threads": threads.blas_threads(), "architecture": core().decode()}
    return {"error": "threadpoolctl not installed and no OpenBLAS found (pip install refgpt[bench])"}


def blas_kernel() -> str:
    """One line: e.g. 'openblas 0.3.31 SkylakeX, 2 threads'."""
    for info in blas():
        if info.get("internal_api") in ("openblas", "mkl", "blis"):
            return (f"{info['internal_api']} {info.get('version', '?')} {info.get('architecture', '?')}, "
                    f"{info.get('num_threads', '?')} threads")
    return "BLAS unknown (threadpoolctl not installed)"


#: What limits torch to AVX2 on an AVX-512 machine (issue 30): MKL's GEMMs and ATen's own kernels.
TORCH_AVX2 = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
#: And NumPy's OpenBLAS, which picks its kernel when it loads.
OPENBLAS_AVX2 = {"OPENBLAS_CORETYPE": "Haswell"}


def torch_kernels() -> str:
    """torch's kernels, one line: ATen's CPU capability (what its elementwise and attention kernels
    are compiled for), its BLAS and, if set, MKL's instruction limit. '' if torch is not loaded."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return ""
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        capability = "?"
    blas_info = "mkl" if torch.backends.mkl.is_available() else "its own BLAS"
    limit = os.environ.get("MKL_ENABLE_INSTRUCTIONS")
    return f"ATen {capability}, {blas_info}" + (f" (MKL_ENABLE_INSTRUCTIONS={limit})" if limit else "")


def kernel_kind(m: dict) -> str:
    """The kind of kernel a run measured: 'avx512' or 'avx2' by OpenBLAS's kernel (SkylakeX and its
    successors, or Haswell/Zen: forced by OPENBLAS_CORETYPE too), else by the CPU's flags."""
    kernel = m.get("blas_kernel", "")
    if any(k in kernel for k in ("SkylakeX", "Cooperlake", "SapphireRapids")):
        return "avx512"
    if any(k in kernel for k in ("Haswell", "Zen")):
        return "avx2"
    return "avx512" if m["avx512"] else "avx2" if m["avx2"] else "other"


def machine() -> dict:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    cpu = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
               platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "avx512": "avx512f" in info, "avx2": "avx2" in info,
            "python": platform.python_version(), "platform": platform.platform(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                                  text=True).stdout.strip(),
            "blas_kernel": blas_kernel(), "blas": blas(), "torch_kernels": torch_kernels(),
            "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
            **{k: os.environ.get(k) for k in TORCH_AVX2},
            "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE"),
            "load_average": os.getloadavg()}


def describe(m: dict) -> str:
    """One sentence for a results section: where and with what it was measured."""
    return (f"{m['date']}, commit {m['git']}: {m['cpu']}, {m['cores']} cores "
            f"({'AVX-512' if m['avx512'] else 'AVX2' if m['avx2'] else 'no AVX2'}), {m['blas_kernel']}, "
            f"OPENBLAS_CORETYPE={m['OPENBLAS_CORETYPE']}"
            f"{'; torch: ' + m['torch_kernels'] if m.get('torch_kernels') else ''}, Python {m['python']}, "
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
