"""Every benchmark in one run: ``python benchmarks/run.py`` (needs the ``peers`` extra for torch).

    python benchmarks/run.py --both     # both kinds, one after the other (the quiet run)
    python benchmarks/run.py --both --smoke   # the same end to end in minutes (numbers meaningless)
    python benchmarks/run.py            # this machine's own kernels (SkylakeX on AVX-512)
    python benchmarks/run.py --avx2     # AVX2 kernels on this machine: OpenBLAS's Haswell kernel
                                        # (OPENBLAS_CORETYPE=Haswell), torch limited by
                                        # MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2

Prints the side-by-side table and writes its section of ``benchmarks/RESULTS.md`` (one per kind
of kernel, AVX-512 or AVX2, named by the kernels that ran: a run of one kind keeps the other's
table) and ``benchmarks/results_<kind>.json``. ``--avx2`` runs the benchmarks in a child process
whose environment sets the variables, because OpenBLAS and MKL read them when they load. Timings
on a shared 2-core machine are noisy (±10–30 %): compare the ratios within one run, not numbers
across runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_attribution  # noqa: E402
import bench_forward  # noqa: E402
import bench_guards  # noqa: E402
import bench_tokenizer  # noqa: E402

from machine import OPENBLAS_AVX2, TORCH_AVX2, describe, kernel_kind, machine, update_section  # noqa: E402

def _rows(r, lengths):
    """The forward rows at these lengths; KeyError (not measured) when the run has none."""
    rows = [x for x in r["forward"] if x["T"] in lengths]
    if not rows:
        raise KeyError(lengths)
    return rows


TARGETS = {  # issue 30's targets (and issues 7 and 17's that still stand), as (what, test on the results)
    "T=256, 1024: ≤ 0.9× torch (float32 and float64)":
        lambda r: all(x["ratio_to_torch"] <= 0.9 for x in _rows(r, (256, 1024))),
    "T=1: ≤ 0.5× torch": lambda r: all(x["ratio_to_torch"] <= 0.5 for x in _rows(r, (1,))),
    "run_with_cache ≤ 1.3× forward, default settings (issue 30)": lambda r: r["extras"]["run_with_cache_over_forward"] <= 1.3,
    "run_with_cache ≤ 1.15× forward, malloc keeping freed memory (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_)":
        lambda r: r["extras"]["run_with_cache_over_forward_malloc_keeps_freed_memory"] <= 1.15,
    "T=1024: ≥ 75% of GEMM peak": lambda r: all(x["share_of_peak"] >= 0.75 for x in _rows(r, (1024,))),
    "float32 load ≤ 0.2 s": lambda r: r["extras"]["load_float32_s"] <= 0.2,
    "KV step at 512 ≥ 20× cheaper": lambda r: r["extras"]["kv_speedup_at_512"] >= 20,
    "tokenizer ≥ 1 MB/s": lambda r: r["tokenizer"]["refgpt_cold_mb_s"] >= 1.0,
    "non-finite guard ≤ 2% of a forward (issue 12)": lambda r: max(r["guards"].values()) <= 0.02,
    "head attribution of one target ≤ 2× forward": lambda r: r["attribution"]["head, one token: (cached forward + attribution) / forward"] <= 2.0,
}


def kind(m) -> str:
    """The section a run belongs to: one per kind of kernel, so an AVX2 run keeps the AVX-512 table."""
    return kernel_kind(m)


def markdown(results) -> str:
    m, fw = results["machine"], results["forward"]
    forced = " --avx2" if m.get("OPENBLAS_CORETYPE") == OPENBLAS_AVX2["OPENBLAS_CORETYPE"] else ""
    forced += " --smoke (a smoke run: these numbers mean nothing)" if results.get("smoke") else ""
    lines = [f"## Forward pass, {kind(m).upper()} kernels{', one thread, CPU time' if fw.get('clock') == 'cpu' else ''}: "
             "GPT-2 small, random weights", "",
             f"`python benchmarks/run.py{forced}` on {describe(m)}; numpy {fw['numpy']}, torch {fw['torch']}, "
             f"{fw['threads']} thread(s) for both, clock: "
             f"{'process CPU time (one thread each: the work done, whatever else the machine runs)' if fw.get('clock') == 'cpu' else 'wall time'}. "
             "refgpt and torch run alternately, medians of several runs "
             "(only ratios measured side by side mean anything on a shared machine). GEMM peak: "
             f"{fw.get('gemm_peak_gflops_float32', float('nan')):.0f} GFLOP/s float32, "
             f"{fw.get('gemm_peak_gflops_float64', float('nan')):.0f} float64 "
             "(one [1024,768]×[768,3072] product: the fastest of 9 runs before the dtype's rows and 9 after, "
             "same run).", "",
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
    except (KeyError, ValueError):  # not measured in this run (--quick: no guards, no extras)
        return None


def main():
    import argparse

    parser = argparse.ArgumentParser(description="every benchmark in one run")
    parser.add_argument("--quick", action="store_true",
                        help="no plain forward (refgpt/reference/gpt2.py), tokenizer or attribution benchmarks")
    parser.add_argument("--avx2", action="store_true",
                        help="AVX2 kernels on an AVX-512 machine: OpenBLAS's Haswell kernel, torch limited to AVX2 "
                             "(run in a child process with " + " ".join(f"{k}={v}" for k, v in
                                                                     {**OPENBLAS_AVX2, **TORCH_AVX2}.items()) + ")")
    parser.add_argument("--smoke", action="store_true",
                        help="--quick at T = 1 and 64, without the batched table and the extras: the whole run, "
                             "end to end, in minutes (its numbers mean nothing)")
    parser.add_argument("--lengths", default=",".join(map(str, bench_forward.LENGTHS)),
                        help="the forward table's lengths T, comma-separated (default: %(default)s; a smoke run: 1,64)")
    parser.add_argument("--both", action="store_true",
                        help="both kinds of kernel, one after the other, each in its own process: this machine's own, "
                             "then --avx2 (each writes its own section of RESULTS.md, the kernels that ran named)")
    args = parser.parse_args()
    if args.both:
        me = [sys.executable, str(Path(__file__).resolve()), *(a for a in sys.argv[1:] if a not in ("--both", "--avx2"))]
        codes = [subprocess.run(command).returncode for command in (me, [*me, "--avx2"])]
        raise SystemExit(max(codes))
    if args.avx2:
        env = {**os.environ, **OPENBLAS_AVX2, **TORCH_AVX2}
        argv = [a for a in sys.argv[1:] if a != "--avx2"]
        raise SystemExit(subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv], env=env).returncode)
    try:
        import torch  # noqa: F401 — loaded first, so that the machine's record names torch's kernels too
    except ImportError:
        pass
    results = {"machine": machine(), "smoke": args.smoke}
    lengths = tuple(int(t) for t in args.lengths.split(","))
    if any(t not in bench_forward.LENGTHS for t in lengths):
        parser.error(f"--lengths: each of {', '.join(map(str, bench_forward.LENGTHS))}")
    if args.smoke:
        args.quick, lengths = True, (1, 64)
    results["forward"] = bench_forward.run(lengths=lengths, plain_forward=not args.quick, extras=not args.smoke,
                                           batched=not args.smoke)
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
