"""refgpt sweep: prompts per second serially and on Dask workers, and memory per worker process.

On random GPT-2-shaped weights (benchmarks/bench_scale.py's checkpoint: float32 on disk, no
download), ``--prompts`` prompts of ``--tokens`` random tokens each, one ``--task`` (default lens:
a forward pass and 13 read-outs of [T, 50257]), in float64. Each configuration runs in its own
process, started with CONTRIBUTING.md's malloc settings (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) —
what the sweep gives its own workers — unless the row says otherwise:

    serial, 1 BLAS thread          refgpt.sweep.run_sweep(workers=0), OPENBLAS_NUM_THREADS=1
    serial, 2 BLAS threads         the same with 2 threads: one process using both cores
    2 workers × 1 BLAS thread      a LocalCluster of 2 worker processes (refgpt.sweep.on_dask)
    1 worker × 2 BLAS threads      a LocalCluster of 1 worker (the cost of Dask itself)
    2 workers × 1, Dask's malloc   2 workers with MALLOC_TRIM_THRESHOLD_=65536, the nanny's default

Throughput is the steady state: the prompts after each process's first one, over the time from
the record of the first to the record of the last (cluster start-up and the first pass, which
faults in the weights, are left out: over 10,000 prompts they are nothing). Memory: each worker
process's (or the serial process's) peak RSS, and its RssAnon / RssFile at the end (RssFile: pages
of the mapped checkpoint, which processes on one machine share). The targets (issue 29): 2 workers
≥ 1.7× serial with 1 thread, and ahead of serial with 2 threads.

    python benchmarks/bench_sweep.py                              # GPT-2 small shape, 16 prompts × 128 tokens
    python benchmarks/bench_sweep.py --shape tiny --prompts 6     # a smoke run (seconds)
    python benchmarks/bench_sweep.py --record                     # also write its RESULTS.md section

Needs the ``dask`` extra. Prints a markdown table for benchmarks/RESULTS.md (section "sweep"
with --record, and benchmarks/results_sweep.json).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from bench_scale import SHAPES, make_checkpoint  # noqa: E402
from machine import describe, machine, update_section  # noqa: E402

SHAPES = {**SHAPES, "tiny": dict(n_embd=64, n_layer=2, n_head=2)}
README_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**30), "MALLOC_TRIM_THRESHOLD_": str(64 * 2**30)}

#: name → (workers: 0 serial, BLAS threads, extra environment of the process)
CONFIGS = {
    "serial, 1 BLAS thread": (0, 1, README_MALLOC),
    "serial, 2 BLAS threads": (0, 2, README_MALLOC),
    "2 workers × 1 BLAS thread": (2, 1, README_MALLOC),
    "1 worker × 2 BLAS threads": (1, 2, README_MALLOC),
    "2 workers × 1, Dask's malloc": (2, 1, {"MALLOC_TRIM_THRESHOLD_": "65536"}),
}


def memory() -> dict:
    """This process's peak RSS and its RssAnon / RssFile now, in MiB (Linux /proc)."""
    status = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "RssAnon", "RssFile"):
                status[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    peak = status.get("VmHWM", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return {"peak_rss_mib": peak, "rss_anon_mib": status.get("RssAnon"), "rss_file_mib": status.get("RssFile")}


def child(a) -> None:
    """One configuration, in this process; prints its measurements as JSON on the last line."""
    from refgpt.sweep import run_sweep

    workers, threads = a.workers, a.threads
    times = []
    stamp = lambda prompt, record: times.append(time.perf_counter())  # noqa: E731
    with tempfile.TemporaryDirectory() as out:
        if workers == 0:
            result = run_sweep(a.prompts, a.task, out, model=a.model, workers=0, on_record=stamp)
            processes = [memory()]
            blas = result_blas(out)
        else:
            from distributed import Client

            from refgpt.sweep.on_dask import local_cluster

            cluster = local_cluster(workers, threads, malloc={} if a.dask_malloc else None)
            try:
                result = run_sweep(a.prompts, a.task, out, model=a.model, scheduler=cluster.scheduler_address,
                                   batch_size=1, on_record=stamp)
                with Client(cluster, set_as_default=False) as client:
                    processes = list(client.run(memory).values())
            finally:
                cluster.close()
            blas = result_blas(out)
    if result.failed:
        raise SystemExit(f"bench_sweep: prompts failed: {result.failed[:2]}")
    warm = max(1, workers)
    times.sort()
    rate = (len(times) - warm) / (times[-1] - times[warm - 1])
    print(json.dumps({"prompts_per_s": rate, "processes": processes, "blas": blas, "n": len(times),
                      "total_s": result.seconds}))


def result_blas(out) -> dict:
    record = json.loads(next((Path(out) / "records").glob("*.json")).read_text())
    return record["provenance"]["blas"]


def measure(name, model, prompts, task) -> dict:
    workers, threads, extra = CONFIGS[name]
    env = {**os.environ, **extra, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
    for key in README_MALLOC:
        if key not in extra:
            env.pop(key, None)  # a row without CONTRIBUTING.md's setting runs with the default
    command = [sys.executable, __file__, "--child", "--model", str(model), "--prompts-file", str(prompts),
               "--task", task, "--workers", str(workers), "--threads", str(threads),
               *(["--dask-malloc"] if "Dask's malloc" in name else [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"bench_sweep: {name} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def markdown(r) -> str:
    base = r["rows"]["serial, 1 BLAS thread"]["prompts_per_s"]
    lines = [f"## refgpt sweep: prompts per second, serial and on Dask workers ({r['shape']} shape, --task {r['task']})",
             "",
             f"`python benchmarks/bench_sweep.py --shape {r['shape']} --prompts {r['prompts']} --tokens {r['tokens']} "
             f"--task {r['task']}` on {describe(r['machine'])}. Float64 on a float32 checkpoint; each row its own "
             "process(es), CONTRIBUTING.md's malloc settings unless said; BLAS threads as the records' provenance says; "
             "steady-state throughput (after each process's first prompt); memory per process: peak RSS, and "
             "RssAnon / RssFile at the end (MiB).",
             "",
             "| configuration | BLAS threads (records) | prompts/s | × serial, 1 thread | peak RSS per process | RssAnon | RssFile |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in r["rows"].items():
        peak = max(p["peak_rss_mib"] for p in row["processes"])
        anon = max(p["rss_anon_mib"] or 0 for p in row["processes"])
        file = max(p["rss_file_mib"] or 0 for p in row["processes"])
        lines.append(f"| {name} | {row['blas'].get('threads')} | {row['prompts_per_s']:.3g} | "
                     f"{row['prompts_per_s'] / base:.2f} | {peak:.0f} | {anon:.0f} | {file:.0f} |")
    two = r["rows"]["2 workers × 1 BLAS thread"]["prompts_per_s"]
    threads2 = r["rows"]["serial, 2 BLAS threads"]["prompts_per_s"]
    lines += ["", f"Targets: 2 single-threaded workers ≥ 1.7× one single-threaded process: "
                  f"{two / base:.2f}× ({'met' if two / base >= 1.7 else 'not met'}); ahead of one process with 2 BLAS "
                  f"threads: {two / threads2:.2f}× ({'met' if two > threads2 else 'not met'})."]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=SHAPES, default="small")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--task", default="lens", choices=("lens", "loss", "attribute", "golden"))
    parser.add_argument("--only", action="append", choices=CONFIGS, help="run only these rows (repeatable)")
    parser.add_argument("--record", action="store_true", help="write RESULTS.md's section and results_sweep.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--prompts-file", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dask-malloc", action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        a.prompts = a.prompts_file
        return child(a)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = make_checkpoint(tmp / "model", SHAPES[a.shape])
        rng = np.random.default_rng(0)
        (tmp / "prompts.jsonl").write_text("".join(
            json.dumps({"id": i, "tokens": rng.integers(0, 50257, a.tokens).tolist()}) + "\n" for i in range(a.prompts)))
        rows = {}
        for name in a.only or CONFIGS:
            rows[name] = measure(name, model, tmp / "prompts.jsonl", a.task)
            print(f"{name}: {rows[name]['prompts_per_s']:.3g} prompts/s", file=sys.stderr)
    if "serial, 1 BLAS thread" not in rows or "2 workers × 1 BLAS thread" not in rows or "serial, 2 BLAS threads" not in rows:
        print(json.dumps(rows, indent=1))
        return
    r = {"machine": machine(), "shape": a.shape, "prompts": a.prompts, "tokens": a.tokens, "task": a.task, "rows": rows}
    text = markdown(r)
    print(text)
    if a.record:
        (HERE / "results_sweep.json").write_text(json.dumps(r, indent=1) + "\n")
        update_section("sweep", text)


if __name__ == "__main__":
    main()
