"""Every benchmark in one run: ``python benchmarks/run.py`` (needs the ``peers`` extra for torch).

Prints the side-by-side table and writes ``benchmarks/RESULTS.md`` (with the machine
description) and ``benchmarks/results.json``. Timings on a shared 2-core machine are noisy
(±10–30 %): compare the ratios within one run, not numbers across runs.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_attribution  # noqa: E402
import bench_forward  # noqa: E402
import bench_guards  # noqa: E402
import bench_tokenizer  # noqa: E402

TARGETS = {  # issue 7's targets, as (what, test on the results)
    "T=256, 1024: ≤ 0.9× torch": lambda r: all(x["ratio_to_torch"] <= 0.9 for x in r["forward"] if x["T"] in (256, 1024)),
    "T=1: ≤ 1.0× torch": lambda r: all(x["ratio_to_torch"] <= 1.0 for x in r["forward"] if x["T"] == 1),
    "T=1024: ≥ 75% of GEMM peak": lambda r: all(x["share_of_peak"] >= 0.75 for x in r["forward"] if x["T"] == 1024),
    "run_with_cache ≤ 1.15× forward": lambda r: r["extras"]["run_with_cache_over_forward"] <= 1.15,
    "float32 load ≤ 0.2 s": lambda r: r["extras"]["load_float32_s"] <= 0.2,
    "KV step at 512 ≥ 20× cheaper": lambda r: r["extras"]["kv_speedup_at_512"] >= 20,
    "tokenizer ≥ 1 MB/s": lambda r: r["tokenizer"]["refgpt_cold_mb_s"] >= 1.0,
    "head attribution of one target ≤ 2× forward": lambda r: r["attribution"]["head, one token: (cached forward + attribution) / forward"] <= 2.0,
    "non-finite guard ≤ 2% of a forward (issue 12)": lambda r: max(r["guards"].values()) <= 0.02,
}


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return {"cpu": cpu, "cores": os.cpu_count(), "avx512": "avx512f" in flags, "python": platform.python_version(),
            "platform": platform.platform(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout.strip(),
            "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE")}


def markdown(results) -> str:
    m = results["machine"]
    lines = ["# Benchmark results", "",
             f"Made by `python benchmarks/run.py` on {m['date']} at commit {m['git']}: {m['cpu']}, "
             f"{m['cores']} cores (AVX-512: {m['avx512']}), Python {m['python']}, numpy {results['forward']['numpy']}, "
             f"torch {results['forward']['torch']}, {results['forward']['threads']} threads for both, "
             f"BLAS {results['forward']['blas']}, OPENBLAS_CORETYPE={m['OPENBLAS_CORETYPE']}.", "",
             "GPT-2 small (124M), random weights, batch 1, median of several runs. GEMM peak: "
             f"{results['forward']['gemm_peak_gflops_float32']:.0f} GFLOP/s float32, "
             f"{results['forward']['gemm_peak_gflops_float64']:.0f} float64 (one [1024,768]×[768,3072] product, same run).", "",
             "| dtype | T | refgpt ms | torch ms | naive NumPy ms | refgpt / torch | naive / torch | GFLOP/s | share of GEMM peak |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results["forward"]["forward"]:
        lines.append(f"| {r['dtype']} | {r['T']} | {r['refgpt_ms']:.1f} | {r['torch_ms']:.1f} | {r['naive_ms']:.1f} | "
                     f"{r['ratio_to_torch']:.2f} | {r['naive_ratio_to_torch']:.2f} | {r['gflops']:.1f} | {100 * r['share_of_peak']:.0f}% |")
    lines += ["", "| measurement | value |", "|---|---|"]
    for k, v in {**results["forward"]["extras"], **{f"tokenizer {k}": v for k, v in results["tokenizer"].items()},
                 **{f"attribution {k}": v for k, v in results["attribution"].items()},
                 **{f"non-finite guard {k}": v for k, v in results.get("guards", {}).items()}}.items():
        lines.append(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |")
    lines += ["", "| target (issue 7) | met |", "|---|---|"]
    for name, ok in results["targets"].items():
        lines.append(f"| {name} | {'yes' if ok else 'NO' if ok is not None else 'n/a'} |")
    return "\n".join(lines) + "\n"


def main():
    results = {"machine": machine()}
    results["forward"] = bench_forward.run()
    results["tokenizer"] = bench_tokenizer.run()
    print("tokenizer:", results["tokenizer"], flush=True)
    results["attribution"] = {f"{row['granularity']}, {row['target']}: (cached forward + attribution) / forward":
                              row["end_to_end_over_forward"] for row in bench_attribution.run()["attribute"]}
    print("attribution:", results["attribution"], flush=True)
    results["guards"] = {f"{row['dtype']}, T={row['T']}: guard / forward": row["guard_over_forward"]
                         for row in bench_guards.run()}
    print("non-finite guard:", results["guards"], flush=True)
    flat = {**results["forward"], "tokenizer": results["tokenizer"], "attribution": results["attribution"],
            "guards": results["guards"]}
    results["targets"] = {name: test(flat) for name, test in TARGETS.items()}
    (HERE / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (HERE / "RESULTS.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
