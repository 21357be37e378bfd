"""GPT-2 XL at full context on a 24 GB machine: a streamed golden file, and its comparison.

    nice python benchmarks/bench_scale.py --shape xl --dir /tmp/refgpt-scale        # the record
    python benchmarks/bench_scale.py --shape small --T 256 --dir /tmp/scale-dev     # a quick try

A golden file of GPT-2 XL (48 layers, d_model 1600, 25 heads) at T = 1024 with every activation
in float64 is ~34 GB, more than this machine's memory, so ``refgpt golden`` streams it and
``refgpt compare`` walks it a tensor at a time. This measures both as a user runs them, each in
its own process:

1. the random checkpoint: GPT-2 XL's shapes, float32, in the layout of the real
   openai-community/gpt2-xl file, written a tensor at a time (made on the fly, never committed,
   deleted afterwards unless ``--keep``);
2. loading it as float64: peak RSS against the size of the float64 weights (one copy of the
   weights, not a float64 copy beside the float32 file's pages);
3. ``refgpt golden --tokens ids.npy`` (every activation, float64): wall time, peak RSS;
4. ``refgpt compare golden golden``: wall time, peak RSS.

Peak RSS is ru_maxrss of the child (wait4); a sampler also reads /proc/PID/status every 0.2 s for
the peak of RssAnon (the process's own memory) and RssFile (mapped file pages, which the kernel
drops under pressure). Needs disk for the file (``--dir``) and ~13 GB of free memory for XL.
Writes the "scale-SHAPE" section of RESULTS.md and results_scale_SHAPE.json (the JSON as it goes:
a run cut short leaves what it measured).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from machine import describe, machine, update_section  # noqa: E402
from refgpt.files.safetensors_file import SafetensorsWriter  # noqa: E402

SHAPES = {  # GPT-2's sizes, as HF config.json names them
    "small": dict(n_embd=768, n_layer=12, n_head=12),
    "medium": dict(n_embd=1024, n_layer=24, n_head=16),
    "large": dict(n_embd=1280, n_layer=36, n_head=20),
    "xl": dict(n_embd=1600, n_layer=48, n_head=25),
}
VOCAB, N_CTX = 50257, 1024


def hf_layout(n_embd, n_layer, **_) -> dict:
    """Bare HF key → shape, as in the real gpt2 checkpoints (tied embeddings, no lm_head)."""
    d, m = n_embd, 4 * n_embd
    shapes = {"wte.weight": (VOCAB, d), "wpe.weight": (N_CTX, d)}
    for L in range(n_layer):
        shapes.update({f"h.{L}.ln_1.weight": (d,), f"h.{L}.ln_1.bias": (d,),
                       f"h.{L}.attn.c_attn.weight": (d, 3 * d), f"h.{L}.attn.c_attn.bias": (3 * d,),
                       f"h.{L}.attn.c_proj.weight": (d, d), f"h.{L}.attn.c_proj.bias": (d,),
                       f"h.{L}.ln_2.weight": (d,), f"h.{L}.ln_2.bias": (d,),
                       f"h.{L}.mlp.c_fc.weight": (d, m), f"h.{L}.mlp.c_fc.bias": (m,),
                       f"h.{L}.mlp.c_proj.weight": (m, d), f"h.{L}.mlp.c_proj.bias": (d,)})
    shapes.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
    return shapes


def make_checkpoint(directory: Path, shape: dict, seed=0) -> Path:
    """A random float32 GPT-2 of this shape, written one tensor at a time (GPT-2's init: N(0, 0.02²),
    residual projections scaled by 1/√(2·n_layer); gains 1 + N(0, 0.1²), biases N(0, 0.02²))."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": VOCAB,
              "n_positions": N_CTX, "n_ctx": N_CTX, "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-5, **shape}
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    layout = {k: (np.float32, s) for k, s in hf_layout(**shape).items()}
    rng = np.random.default_rng(seed)
    residual = 0.02 / np.sqrt(2 * shape["n_layer"])
    with SafetensorsWriter(directory / "model.safetensors", layout, {"format": "pt"}) as out:
        for key, (_, s) in layout.items():
            if key.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                a = 1 + 0.1 * rng.standard_normal(s, dtype=np.float32)
            else:
                std = residual if key.endswith("c_proj.weight") else 0.02
                a = rng.standard_normal(s, dtype=np.float32) * np.float32(std)
            out.write(key, a)
    return directory


#: Extra environment of the measured processes (``--blas-threads``).
CHILD_ENV: dict[str, str] = {}


def measured(args, log: Path, progress=None) -> dict:
    """Run ``args``; wall time, CPU time (user + system, wait4's), exit status, peak RSS (ru_maxrss)
    and sampled peaks of RssAnon and RssFile, in MiB. ``progress(partial)`` is called every 30 s while it runs."""
    peaks = {"RssAnon": 0, "RssFile": 0}
    env = {**os.environ, "PYTHONPATH": str(REPO), **CHILD_ENV}
    t = time.perf_counter()
    with open(log, "w") as out:
        child = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        done = threading.Event()

        def sample():
            status = Path(f"/proc/{child.pid}/status")
            last = time.perf_counter()
            while not done.is_set():
                if progress is not None and time.perf_counter() - last > 30:
                    last = time.perf_counter()
                    progress({"seconds_so_far": last - t, "peak_anon_mib_so_far": peaks["RssAnon"] / 1024,
                              "peak_file_mib_so_far": peaks["RssFile"] / 1024, "running": True})
                try:
                    for line in status.read_text().splitlines():
                        key = line.split(":")[0]
                        if key in peaks:
                            peaks[key] = max(peaks[key], int(line.split()[1]))
                except (OSError, ValueError, IndexError):
                    pass
                done.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            _, status, usage = os.wait4(child.pid, 0)
        except BaseException:  # stopped (SIGTERM, Ctrl-C): stop the child too, then clean up
            child.kill()
            child.wait()
            done.set()
            raise
        child.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        sampler.join()
    return {"seconds": time.perf_counter() - t, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "exit": child.returncode, "peak_rss_mib": usage.ru_maxrss / 1024,
            "peak_anon_mib": peaks["RssAnon"] / 1024, "peak_file_mib": peaks["RssFile"] / 1024,
            "output": log.read_text()[-2000:]}


LOAD_PROBE = """
import json, sys, time, refgpt
t = time.perf_counter()
model = refgpt.load(sys.argv[1], dtype="float64", tokenizer=False)
seconds = time.perf_counter() - t
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
kib = lambda k: int(status[k].split()[0])
weights = sum({id(a.base if a.base is not None else a): (a.base if a.base is not None else a).nbytes
               for a in model.params.values()}.values())
print(json.dumps({"seconds": seconds, "weights_mib": weights / 2**20, "rss_anon_mib": kib("RssAnon") / 1024,
                  "rss_file_mib": kib("RssFile") / 1024, "peak_rss_mib": kib("VmHWM") / 1024}))
"""


def record(results) -> None:
    """Write what is known so far to benchmarks/results_scale_<shape>.json (a long run may be cut short)."""
    if results.get("record"):
        (HERE / f"results_scale_{results['shape']}.json").write_text(json.dumps(results, indent=1, default=str))


def run(shape_name="xl", T=1024, directory=Path("/tmp/refgpt-scale"), keep=False, record_results=True) -> dict:
    shape = SHAPES[shape_name]
    directory = Path(directory)
    results = {"machine": machine(), "shape": shape_name, **shape, "T": T, "dtype": "float64", "record": record_results,
               "child_env": dict(CHILD_ENV)}
    try:
        t = time.perf_counter()
        ckpt = make_checkpoint(directory / "model", shape)
        results["make_checkpoint_s"] = time.perf_counter() - t
        results["checkpoint_mib"] = (ckpt / "model.safetensors").stat().st_size / 2**20
        print(f"checkpoint: {results['checkpoint_mib']:.0f} MiB in {results['make_checkpoint_s']:.0f} s", flush=True)
        np.save(directory / "ids.npy", np.random.default_rng(1).integers(0, VOCAB, (1, T)))

        probe = measured([sys.executable, "-c", LOAD_PROBE, str(ckpt)], directory / "load.log")
        results["load"] = {**json.loads(probe["output"].strip().splitlines()[-1]), "peak_rss_child_mib": probe["peak_rss_mib"]}
        print("load float32 → float64:", results["load"], flush=True)

        g = directory / "golden.safetensors"
        record(results)

        def golden_progress(partial):
            written = g.with_name(g.name + ".partial")
            record({**results, "golden_so_far": {**partial, "file_mib_allocated": written.stat().st_size / 2**20
                                                 if written.exists() else None}})

        results["golden"] = measured([sys.executable, "-m", "refgpt", "golden", "--tokens", str(directory / "ids.npy"),
                                      "-o", str(g), "--model", str(ckpt)], directory / "golden.log", golden_progress)
        record(results)
        results["golden"]["file_mib"] = g.stat().st_size / 2**20 if g.exists() else None
        print("golden:", {k: v for k, v in results["golden"].items() if k != "output"}, flush=True)
        if results["golden"]["exit"] == 0:
            results["compare"] = measured([sys.executable, "-m", "refgpt", "compare", str(g), str(g)],
                                          directory / "compare.log",
                                          lambda partial: record({**results, "compare_so_far": partial}))
            print("compare:", {k: v for k, v in results["compare"].items() if k != "output"}, flush=True)
            results["largest_tensor_mib"] = _largest_tensor_mib(g)
    finally:
        if not keep:
            shutil.rmtree(directory / "model", ignore_errors=True)
            for name in ("golden.safetensors", "golden.safetensors.partial", "ids.npy"):
                (directory / name).unlink(missing_ok=True)
    return results


def _largest_tensor_mib(path) -> float:
    from refgpt.files.safetensors_file import SafetensorsFile

    st = SafetensorsFile(path)
    return max(int(np.prod(st.shape(n))) * st.raw(n).itemsize for n in st.names) / 2**20


def markdown(r) -> str:
    g, c, load = r["golden"], r.get("compare", {}), r["load"]
    lines = [f"## Scale: GPT-2 {r['shape']}-shaped random weights, T = {r['T']}, every activation, float64",
             "", f"`nice python benchmarks/bench_scale.py --shape {r['shape']}` on {describe(r['machine'])}. "
             "Each step is its own process; peak RSS is its ru_maxrss, RssAnon/RssFile are peaks sampled every 0.2 s "
             "(RssFile: pages of mapped files, which the kernel drops under memory pressure). "
             f"Extra environment of the measured processes: {r.get('child_env') or 'none'}.", "",
             f"Model: n_layer {r['n_layer']}, d_model {r['n_embd']}, {r['n_head']} heads; checkpoint "
             f"{r['checkpoint_mib']:.0f} MiB float32; float64 weights in memory {load['weights_mib']:.0f} MiB.", "",
             "| step | wall s | peak RSS MiB | peak RssAnon MiB | peak RssFile MiB | note |", "|---|---|---|---|---|---|",
             f"| load float32 checkpoint as float64 | {load['seconds']:.1f} | {load['peak_rss_mib']:.0f} | "
             f"{load['rss_anon_mib']:.0f} (after) | {load['rss_file_mib']:.0f} (after) | "
             f"peak / float64 weights = {load['peak_rss_mib'] / load['weights_mib']:.2f} |",
             f"| `refgpt golden` (streamed) | {g['seconds']:.0f} | {g['peak_rss_mib']:.0f} | {g['peak_anon_mib']:.0f} | "
             f"{g['peak_file_mib']:.0f} | file {(g['file_mib'] or 0) / 1024:.1f} GiB, exit {g['exit']} |"]
    if c:
        lines.append(f"| `refgpt compare` golden vs itself | {c['seconds']:.0f} | {c['peak_rss_mib']:.0f} | "
                     f"{c['peak_anon_mib']:.0f} | {c['peak_file_mib']:.0f} | largest tensor "
                     f"{r['largest_tensor_mib']:.0f} MiB, exit {c['exit']} |")
    return "\n".join(lines) + "\n"


def arguments(description, shape, directory, record) -> argparse.ArgumentParser:
    """The options of a benchmark that makes a checkpoint of a shape and files in a directory (this
    one's, bench_local.py's); a SIGTERM runs its clean-up."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # run the clean-up (finally:)
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--shape", choices=SHAPES, default=shape)
    parser.add_argument("--T", type=int, default=1024)
    parser.add_argument("--dir", default=directory)
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint and the files")
    parser.add_argument("--no-record", action="store_true", help=f"do not write RESULTS.md / {record}")
    return parser


def main():
    parser = arguments(__doc__.split("\n")[0], "xl", "/tmp/refgpt-scale", "results_scale_SHAPE.json")
    parser.add_argument("--blas-threads", type=int,
                        help="OPENBLAS_NUM_THREADS for the measured processes (1 keeps an oversubscribed machine "
                             "from stalling on spinning BLAS threads); recorded")
    a = parser.parse_args()
    if a.blas_threads:
        CHILD_ENV.update(OPENBLAS_NUM_THREADS=str(a.blas_threads), OMP_NUM_THREADS=str(a.blas_threads))
    r = run(a.shape, a.T, Path(a.dir), a.keep, not a.no_record)
    text = markdown(r)
    print(text)
    if not a.no_record:
        record(r)
        update_section(f"scale-{a.shape}", text)


if __name__ == "__main__":
    main()
