"""The cost of the non-finite guard: the check every forward pass makes on its logits.

``Model._run`` sums the logits once (np.add.reduce) and tests the sum with np.isfinite; only when
that fails does it run again to name the first non-finite hook point. This measures, in one run
and side by side, a GPT-2-small-shaped forward pass (random weights) and the guard on its logits,
and reports guard / forward (issue 12: must stay under 2 %).

    python benchmarks/bench_guards.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

from refgpt import Config, Model  # noqa: E402
from refgpt.gpt2.params import param_shapes  # noqa: E402

GPT2_SMALL = Config(d_model=768, n_layers=12, n_heads=12, d_mlp=3072, d_vocab=50257, n_ctx=1024)


def best(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def guard(logits):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.isfinite(np.add.reduce(logits, axis=None))


def run(lengths=(1, 64, 256), dtypes=("float32", "float64"), repeats=3) -> list[dict]:
    rng = np.random.default_rng(0)
    params = {n: 0.02 * rng.standard_normal(s).astype(np.float32) for n, s in param_shapes(GPT2_SMALL).items()}
    rows = []
    for dtype in dtypes:
        model = Model(GPT2_SMALL, params, dtype=dtype)
        for T in lengths:
            tokens = rng.integers(0, GPT2_SMALL.d_vocab, (1, T))
            logits = model(tokens)
            forward = best(lambda: model(tokens), repeats)
            check = best(lambda: guard(logits), 20 * repeats)
            rows.append({"dtype": dtype, "T": T, "forward_s": forward, "guard_s": check, "guard_over_forward": check / forward})
    return rows


if __name__ == "__main__":
    print(f"{'dtype':8} {'T':>5} {'forward':>10} {'guard':>10} {'guard/forward':>14}")
    for r in run():
        print(f"{r['dtype']:8} {r['T']:>5} {r['forward_s'] * 1e3:>8.1f}ms {r['guard_s'] * 1e6:>8.1f}µs {100 * r['guard_over_forward']:>13.3f}%")
