"""Every benchmark in one run: ``python benchmarks/run.py`` (needs the ``peers`` extra for torch).

Prints the side-by-side table and writes its section of ``benchmarks/RESULTS.md`` (one per kind
of machine, AVX-512 or AVX2: a run on one kind keeps the other's table) and
``benchmarks/results_<kind>.json``. Timings on a shared 2-core machine are noisy
(±10–30 %): compare the ratios within one run, not numbers across runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_attribution  # noqa: E402
import bench_forward  # noqa: E402
import bench_guards  # noqa: E402
import bench_tokenizer  # noqa: E402

from machine import describe, machine, update_section  # noqa: E402

TARGETS = {  # issue 17's targets (and issue 7's that still stand), as (what, test on the results)
    "T=256, 1024: ≤ 0.9× torch": lambda r: all(x["ratio_to_torch"] <= 0.9 for x in r["forward"] if x["T"] in (256, 1024)),
    "T=1: ≤ 0.8× torch": lambda r: all(x["ratio_to_torch"] <= 0.8 for x in r["forward"] if x["T"] == 1),
    "run_with_cache ≤ 1.15× forward": lambda r: r["extras"]["run_with_cache_over_forward"] <= 1.15,
    "run_with_cache ≤ 1.15× forward, malloc keeping freed memory (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_)":
        lambda r: r["extras"]["run_with_cache_over_forward_malloc_keeps_freed_memory"] <= 1.15,
    "T=1024: ≥ 75% of GEMM peak": lambda r: all(x["share_of_peak"] >= 0.75 for x in r["forward"] if x["T"] == 1024),
    "float32 load ≤ 0.2 s": lambda r: r["extras"]["load_float32_s"] <= 0.2,
    "KV step at 512 ≥ 20× cheaper": lambda r: r["extras"]["kv_speedup_at_512"] >= 20,
    "tokenizer ≥ 1 MB/s": lambda r: r["tokenizer"]["refgpt_cold_mb_s"] >= 1.0,
    "non-finite guard ≤ 2% of a forward (issue 12)": lambda r: max(r["guards"].values()) <= 0.02,
    "head attribution of one target ≤ 2× forward": lambda r: r["attribution"]["head, one token: (cached forward + attribution) / forward"] <= 2.0,
}


def kind(m) -> str:
    """The section a run belongs to: one per kind of machine, so an AVX2 run keeps the AVX-512 table."""
    return "avx512" if m["avx512"] else "avx2" if m["avx2"] else "other"


def markdown(results) -> str:
    m, fw = results["machine"], results["forward"]
    lines = [f"## Forward pass, {kind(m).upper()} machine{', one thread, CPU time' if fw.get('clock') == 'cpu' else ''}: "
             "GPT-2 small, random weights", "",
             f"`python benchmarks/run.py` on {describe(m)}; numpy {fw['numpy']}, torch {fw['torch']}, "
             f"{fw['threads']} thread(s) for both, clock: "
             f"{'process CPU time (one thread each: the work done, whatever else the machine runs)' if fw.get('clock') == 'cpu' else 'wall time'}. "
             "refgpt and torch run alternately, medians of several runs "
             "(only ratios measured side by side mean anything on a shared machine). GEMM peak: "
             f"{fw['gemm_peak_gflops_float32']:.0f} GFLOP/s float32, {fw['gemm_peak_gflops_float64']:.0f} float64 "
             "(one [1024,768]×[768,3072] product, same run).", "",
             "| dtype | T | refgpt ms | torch ms | plain NumPy ms | refgpt / torch | plain / torch | GFLOP/s | share of GEMM peak |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in fw["forward"]:
        lines.append(f"| {r['dtype']} | {r['T']} | {r['refgpt_ms']:.1f} | {r['torch_ms']:.1f} | {r['plain_ms']:.1f} | "
                     f"**{r['ratio_to_torch']:.2f}** | {r['plain_ratio_to_torch']:.2f} | {r['gflops']:.1f} | {100 * r['share_of_peak']:.0f}% |")
    lines += ["", "Batched throughput (one forward pass over batch × T tokens):", "",
              "| dtype | batch × T | refgpt tokens/s | torch tokens/s | refgpt time / torch time |", "|---|---|---|---|---|"]
    for r in fw["batched"]:
        lines.append(f"| {r['dtype']} | {r['batch']} × {r['T']} | {r['refgpt_tokens_per_s']:.0f} | "
                     f"{r['torch_tokens_per_s']:.0f} | **{r['time_ratio_to_torch']:.2f}** |")
    extras = {**fw["extras"], **{f"tokenizer {k}": v for k, v in results.get("tokenizer", {}).items()},
              **{f"attribution {k}": v for k, v in results.get("attribution", {}).items()},
              **{f"non-finite guard {k}": v for k, v in results.get("guards", {}).items()}}
    if extras:
        lines += ["", "| measurement | value |", "|---|---|"]
        for k, v in extras.items():
            lines.append(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |")
    lines += ["", "| target | met |", "|---|---|"]
    for name, ok in results["targets"].items():
        lines.append(f"| {name} | {'yes' if ok else 'NO' if ok is not None else 'not measured'} |")
    return "\n".join(lines) + "\n"


def _target(test, flat):
    try:
        return test(flat)
    except KeyError:  # not measured in this run (--quick)
        return None


def main():
    import argparse

    parser = argparse.ArgumentParser(description="every benchmark in one run")
    parser.add_argument("--quick", action="store_true",
                        help="no plain forward (refgpt/gpt2/plain.py), tokenizer or attribution benchmarks")
    args = parser.parse_args()
    results = {"machine": machine()}
    results["forward"] = bench_forward.run(plain_forward=not args.quick)
    if not args.quick:
        results["tokenizer"] = bench_tokenizer.run()
        print("tokenizer:", results["tokenizer"], flush=True)
        results["attribution"] = {f"{row['granularity']}, {row['target']}: (cached forward + attribution) / forward":
                                  row["end_to_end_over_forward"] for row in bench_attribution.run()["attribute"]}
        print("attribution:", results["attribution"], flush=True)
        results["guards"] = {f"{row['dtype']}, T={row['T']}: guard / forward": row["guard_over_forward"]
                             for row in bench_guards.run()}
        print("non-finite guard:", results["guards"], flush=True)
    flat = {**results["forward"], "tokenizer": results.get("tokenizer", {}), "attribution": results.get("attribution", {}),
            "guards": results.get("guards", {})}
    results["targets"] = {name: _target(test, flat) for name, test in TARGETS.items()}
    clock = "_cpu_clock" if results["forward"]["clock"] == "cpu" else ""
    (HERE / f"results_{kind(results['machine'])}{clock}.json").write_text(json.dumps(results, indent=2, default=str))
    text = markdown(results)
    clock = "-cpu-clock" if results["forward"]["clock"] == "cpu" else ""
    update_section(f"forward-{kind(results['machine'])}{clock}", text)
    print(text)


if __name__ == "__main__":
    main()
