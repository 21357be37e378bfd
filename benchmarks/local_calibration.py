"""The local verdicts' false-alarm calibration (issue 38): correct ports of many random GPT-2s judged op
by op (refgpt/oracle/local.py) — refgpt's own float32 pass, and tests/local_ports.py's port at float32,
bfloat16 and float16 storage (float32 accumulation) — counting flagged ops (there must be none) and
the worst ratio |port − reference|/bound per op kind, with the case that reached it.

Each model i is drawn from seed i: 1–4 heads of 4–32 dimensions, 1–4 layers, d_mlp 1–4·d_model,
a vocabulary of 11–500, 1–32 positions in 1–2 rows, ε ∈ {1e-5, 1e-3, 0.1}, the score scale's two
switches, and weights N(0, s²) with s ∈ {0.05, 0.1, 0.3, 0.5, 1.0}·√(64/d_model) (LayerNorm gains
1 + N(0, s²)). float16 storage is skipped for a model outside its range, and said so in the counts:
a float64 activation beyond 2¹⁵, or a residual stream beyond 2⁷ (a LayerNorm's centred square,
up to (2·2⁷)², would pass float16's largest value, 65,504: the port's scale is then ∞, correct
code or not).

    PYTHONPATH=. python benchmarks/local_calibration.py 1000     # the table for benchmarks/RESULTS.md

tests/oracle/test_local_calibration.py runs a small draw by default, 1,000 with REFGPT_CALIBRATION=long.
"""

from __future__ import annotations

import math
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from local_ports import port_forward  # noqa: E402
from random_models import random_params  # noqa: E402
from refgpt import Config, Model  # noqa: E402
from refgpt.oracle import local  # noqa: E402

PORTS = ("refgpt float32", "port float32", "port bfloat16", "port float16")


def draw_case(i):
    """(cfg, params, tokens, scale) of model i."""
    rng = np.random.default_rng(i)
    n_heads, d_head = int(rng.integers(1, 5)), int(rng.choice([4, 8, 16, 32]))
    d_model = n_heads * d_head
    cfg = Config(d_model=d_model, n_layers=int(rng.integers(1, 5)), n_heads=n_heads,
                 d_mlp=int(rng.integers(1, 4 * d_model + 1)), d_vocab=int(rng.integers(11, 501)),
                 n_ctx=32, eps=float(rng.choice([1e-5, 1e-3, 0.1])), act_fn="gelu_new",
                 use_attn_scale=bool(rng.integers(2)), scale_attn_by_inverse_layer_idx=bool(rng.integers(2)))
    scale = float(rng.choice([0.05, 0.1, 0.3, 0.5, 1.0])) * math.sqrt(64 / d_model)
    tokens = rng.integers(0, cfg.d_vocab, (int(rng.integers(1, 3)), int(rng.integers(1, 33))))
    return cfg, random_params(cfg, seed=i, scale=scale), tokens, scale


def port_acts(port, cfg, params, tokens):
    if port == "refgpt float32":
        logits, cache = Model(cfg, params, dtype="float32").run_with_cache(tokens)
        return {**cache.cache_dict, "logits": logits}
    return port_forward(params, cfg, tokens, port.split()[1])


@dataclass
class Stats:
    models: int = 0
    judgments: int = 0
    ops: int = 0
    skipped_float16: int = 0
    flagged: list = field(default_factory=list)  # (model, port, op, name, ratio)
    worst: dict = field(default_factory=lambda: defaultdict(lambda: (0.0, None)))  # op → (ratio, (model, port, name))
    seconds: float = 0.0


def out_of_float16(cache) -> bool:
    finite = [np.abs(v[np.isfinite(v)]).max(initial=0.0) for v in cache.values()]
    streams = [np.abs(v).max() for name, v in cache.items() if "hook_resid_" in name]
    return max(finite) > 2.0 ** 15 or max(streams) > 2.0 ** 7


def calibrate(n, start=0, stats=None, ports=PORTS) -> Stats:
    stats = stats or Stats()
    t0 = time.perf_counter()
    for i in range(start, start + n):
        cfg, params, tokens, _ = draw_case(i)
        _, cache = Model(cfg, params).run_with_cache(tokens)
        too_big = out_of_float16(cache.cache_dict)
        stats.models += 1
        for port in ports:
            if port == "port float16" and too_big:
                stats.skipped_float16 += 1
                continue
            store = port.split()[1]
            report = local.judge(params, cfg, tokens, port_acts(port, cfg, params, tokens), store)
            stats.judgments += 1
            for v in report.ops:
                if v.skipped is not None:
                    continue
                stats.ops += 1
                if v.flagged:
                    stats.flagged.append((i, port, v.op, v.name, v.ratio))
                if v.ratio >= stats.worst[v.op][0]:
                    stats.worst[v.op] = (v.ratio, (i, port, v.name))
    stats.seconds += time.perf_counter() - t0
    return stats


def table(stats: Stats) -> str:
    lines = [f"{stats.models} random models, {stats.judgments} ports judged ({stats.skipped_float16} float16 ports "
             f"skipped: out of its range), {stats.ops} ops, {len(stats.flagged)} flagged, "
             f"{stats.seconds:.0f} s", "", "| op | worst ratio | where (model, port, tensor) |", "| --- | ---: | --- |"]
    for op, (ratio, where) in sorted(stats.worst.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"| {op} | {ratio:.3f} | {where[0]}, {where[1]}, `{where[2]}` |" if where else f"| {op} | 0 | |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(calibrate(int(sys.argv[1]) if len(sys.argv) > 1 else 100)))
