"""The cost of local verdicts (issue 38): ``refgpt golden``, today's ``refgpt compare`` and
``refgpt compare --local`` side by side, in one run, at GPT-2 small's shape.

    nice python benchmarks/bench_local.py                          # the record: small, T = 1024
    python benchmarks/bench_local.py --T 128 --no-record           # a quick try

Each step is its own process, run as a user runs it, measured by bench_scale.measured (wall time,
ru_maxrss, and the peaks of RssAnon and RssFile sampled every 0.2 s):

1. a random float32 checkpoint of the shape (bench_scale.make_checkpoint), loaded as float64;
2. ``refgpt golden --tokens ids.npy --model CKPT``: the float64 golden (with its three float32
   passes for c_X, r_X and f_X);
3. the candidate: refgpt's own float32 pass, every golden tensor, dumped without an error model
   (``CANDIDATE``; measured, but it is the port's work);
4. ``refgpt compare GOLDEN CANDIDATE`` (today's whole-tensor rule);
5. ``refgpt compare GOLDEN CANDIDATE --local --local-model CKPT``: today's rule, then every op
   recomputed in float64 from the candidate's own inputs (refgpt/oracle/local.py), streamed.

The target (issue 38, item 4): step 5 in about the time of step 2, its own memory a few hundred
MB above the float64 weights. Writes the section "local-cost-SHAPE-TT" of RESULTS.md and
results_local_cost_SHAPE_TT.json.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_scale import SHAPES, VOCAB, arguments, make_checkpoint, measured  # noqa: E402
from machine import describe, machine, update_section  # noqa: E402


#: The candidate: refgpt's own float32 pass, every golden tensor of it (golden.stream) written as it
#: is made, without the golden's error model (a port's dump, not a golden).
CANDIDATE = """
import sys, numpy as np, refgpt
from refgpt.files.safetensors_file import SafetensorsWriter
from refgpt.oracle import golden
model = refgpt.load(sys.argv[1], dtype="float32", tokenizer=False)
tokens = np.load(sys.argv[2])
with SafetensorsWriter(sys.argv[3], golden.layout(model, tokens.shape), {}) as out:
    for name, tensor in golden.stream(model, tokens):
        out.write(name, tensor)
"""


def run(shape_name="small", T=1024, directory=Path("/tmp/refgpt-local-cost"), keep=False) -> dict:
    shape, directory = SHAPES[shape_name], Path(directory)
    results = {"machine": machine(), "shape": shape_name, **shape, "T": T}
    refgpt = [sys.executable, "-m", "refgpt"]
    try:
        ckpt = make_checkpoint(directory / "model", shape)
        ids = directory / "ids.npy"
        np.save(ids, np.random.default_rng(1).integers(0, VOCAB, (1, T)))
        n_params = sum(int(np.prod(s)) for s in _shapes(ckpt))
        results["weights_float64_mib"] = n_params * 8 / 2**20
        golden, candidate = directory / "golden.safetensors", directory / "candidate.safetensors"
        steps = {
            "golden": [*refgpt, "golden", "--tokens", str(ids), "-o", str(golden), "--model", str(ckpt)],
            "candidate": [sys.executable, "-c", CANDIDATE, str(ckpt), str(ids), str(candidate)],
            "compare": [*refgpt, "compare", str(golden), str(candidate)],
            "compare_local": [*refgpt, "compare", str(golden), str(candidate), "--local", "--local-model", str(ckpt)],
        }
        for step, args in steps.items():
            results[step] = measured(args, directory / f"{step}.log")
            print(step, {k: v for k, v in results[step].items() if k != "output"}, flush=True)
            if step == "compare_local":  # what it said: every op judged, none flagged (refgpt's own float32 pass)
                said = (directory / f"{step}.log").read_text().splitlines()
                results[step]["verdict"] = next((line for line in said if line.startswith(("OK: no op", "FIRST LOCAL",
                                                                                         "local verdicts skipped"))),
                                                said[-1] if said else "")
        results["golden_file_mib"] = golden.stat().st_size / 2**20
        results["candidate_file_mib"] = candidate.stat().st_size / 2**20
    finally:
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)
    return results


def _shapes(ckpt):
    from refgpt.files.safetensors_file import SafetensorsFile

    st = SafetensorsFile(ckpt / "model.safetensors")
    return [st.shape(n) for n in st.names]


def markdown(r) -> str:
    w = r["weights_float64_mib"]
    rows = [("`refgpt golden` (float64, with its three float32 passes)", r["golden"]),
            ("`refgpt compare` (today's whole-tensor rule)", r["compare"]),
            ("`refgpt compare --local` (today's rule, then every op)", r["compare_local"])]
    lines = [f"## Cost of local verdicts: GPT-2 {r['shape']}-shaped random weights, T = {r['T']}", "",
             f"`python benchmarks/bench_local.py --shape {r['shape']} --T {r['T']}` on {describe(r['machine'])}. "
             "Each step is its own process "
             "(bench_scale.measured: peak RSS is ru_maxrss; RssAnon, the process's own memory, and RssFile, mapped "
             "file pages the kernel drops under pressure, are peaks sampled every 0.2 s). The candidate is "
             "refgpt's own float32 pass, every tensor of a golden dumped (bench_local.CANDIDATE).", "",
             f"Float64 weights {w:.0f} MiB; golden file {r['golden_file_mib'] / 1024:.1f} GiB, candidate file "
             f"{r['candidate_file_mib'] / 1024:.1f} GiB.", "",
             "| step | wall s | CPU s | CPU × golden's | peak RSS MiB | peak RssAnon MiB | RssAnon − weights MiB | "
             "peak RssFile MiB | exit |", "|---|---|---|---|---|---|---|---|---|"]
    for label, m in rows:
        lines.append(f"| {label} | {m['seconds']:.0f} | {m['cpu_seconds']:.0f} | "
                     f"{m['cpu_seconds'] / r['golden']['cpu_seconds']:.2f} | "
                     f"{m['peak_rss_mib']:.0f} | {m['peak_anon_mib']:.0f} | "
                     f"{'— (no weights)' if m is r['compare'] else round(m['peak_anon_mib'] - w)} | "
                     f"{m['peak_file_mib']:.0f} | {m['exit']} |")
    local_only = r["compare_local"]["cpu_seconds"] - r["compare"]["cpu_seconds"]
    lines += ["", f"The local verdicts alone (the --local run less today's compare, CPU time): {local_only:.0f} s, "
              f"{local_only / r['golden']['cpu_seconds']:.2f}× the golden's. Their verdict: "
              f"{r['compare_local'].get('verdict', '?')}"]
    return "\n".join(lines) + "\n"


def main():
    a = arguments(__doc__.split("\n")[0], "small", "/tmp/refgpt-local-cost", "results_local_cost_SHAPE_TT.json").parse_args()
    r = run(a.shape, a.T, Path(a.dir), a.keep)
    print(markdown(r))
    if not a.no_record:
        record(r)


def record(r) -> None:
    """results_local_cost_SHAPE_TT.json and RESULTS.md's section "local-cost-SHAPE-TT"."""
    (HERE / f"results_local_cost_{r['shape']}_T{r['T']}.json").write_text(json.dumps(r, indent=1, default=str))
    update_section(f"local-cost-{r['shape']}-T{r['T']}", markdown(r))


if __name__ == "__main__":
    main()
