"""Issue 38's correct ports at GPT-2 small's shape with all 12 layers, judged op by op
(refgpt/oracle/local.py): the C port's five builds (forward and backward, 32 positions) and HF in
float32, bfloat16 and float16 (48 tokens, ``layer_norm="any"``), on the model and batches of
tests/oracle/test_local_small_ports.py, which asserts that none is flagged; and TransformerLens's
forward and backward in float32 and bfloat16 on its own random GPT-2 of that shape, 2×48 tokens
(tests/oracle/test_local_backward.py's, which asserts the same). Prints, for
benchmarks/RESULTS.md, each port's flagged and judged ops and seconds (running the port, judging it),
then the worst ratio |port − reference|/bound per op kind and port (≤ 1: within its bound).

    PYTHONPATH=. python benchmarks/local_small_ports.py               # every port (25 minutes on a loaded machine)
    PYTHONPATH=. python benchmarks/local_small_ports.py "C O3" "HF bfloat16"
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "oracle")]

import c_port  # noqa: E402
import port_cases  # noqa: E402
from test_local_backward import GPT2_SMALL_48, tl_backward  # noqa: E402
from test_local_small_ports import c_small, hf_small  # noqa: E402
from refgpt.oracle import local  # noqa: E402

PORTS = (*(f"C {b}" for b in c_port.BUILDS), "HF float32", "HF bfloat16", "HF float16", "TL float32", "TL bfloat16")


def judge_port(port, model, directory):
    """(the port's LocalReport, seconds making and running the port, seconds judging it)."""
    kind, which = port.split(" ", 1)
    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    params, cfg, y, layer_norm = model.params, model.cfg, None, "two-pass"
    if kind == "C":
        x, y, acts = c_small(which, model, directory)
    elif kind == "HF":
        (x, acts), layer_norm = hf_small(which, model, directory), "any"
    else:  # TransformerLens's own random GPT-2, forward and backward
        params, cfg, x, acts = tl_backward(0, which, directory, **GPT2_SMALL_48)
    t1 = time.perf_counter()
    store = "float32" if kind == "C" else which
    report = local.judge(params, cfg, x, acts, store, targets=y, layer_norm=layer_norm)
    return report, t1 - t0, time.perf_counter() - t1


def table(results) -> str:
    ports = list(results)
    lines = ["| port | ops judged | flagged | port s | judge s |", "| --- | ---: | ---: | ---: | ---: |"]
    worst = {}  # (op, kind of bound) → port → ratio
    for port, (report, run_s, judge_s) in results.items():
        ops = [v for v in report.ops if v.skipped is None]
        lines.append(f"| {port} | {len(ops)} | {len(report.flagged)} | {run_s:.0f} | {judge_s:.0f} |")
        for v in ops:
            row = worst.setdefault((v.op, "probabilistic" if v.kind.startswith("probabilistic") else "worst case"), {})
            row[port] = max(row.get(port, 0.0), v.ratio)
    lines += ["", "| op | bound | " + " | ".join(ports) + " |", "| --- | --- |" + " ---: |" * len(ports)]
    for (op, kind), row in sorted(worst.items(), key=lambda kv: -max(kv[1].values())):
        lines.append(f"| {op} | {kind} | " + " | ".join(f"{row[p]:.3f}" if p in row else "" for p in ports) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    chosen = sys.argv[1:] or PORTS
    model = port_cases.gpt2_small_shape(12)
    results = {}
    with tempfile.TemporaryDirectory() as d:
        for port in chosen:
            results[port] = judge_port(port, model, Path(d) / port.replace(" ", "_"))
            print(port, "judged", flush=True, file=sys.stderr)
    print(table(results))
