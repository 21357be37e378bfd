"""The local verdicts' false-alarm calibration (issue 38): correct ports of many random GPT-2s judged op
by op (refgpt/oracle/local.py) — refgpt's own float32 pass, tests/local_ports.py's port at float32,
bfloat16 and float16 storage (float32 accumulation), and the C port's five builds, forward and
backward — counting flagged ops (there must be none) and the worst ratio |port − reference|/bound
per op kind, with the case that reached it, and per port the models judged and skipped.

Each model i is drawn from seed i: 1–4 heads of 4–32 dimensions, 1–4 layers, d_mlp 1–4·d_model,
a vocabulary of 11–500, 1–32 positions in 1–2 rows, ε ∈ {1e-5, 1e-3, 0.1}, the score scale's two
switches, and weights N(0, s²) with s ∈ {0.05, 0.1, 0.3, 0.5, 1.0}·√(64/d_model) (LayerNorm gains
1 + N(0, s²)). float16 storage is skipped for a model outside its range, and said so in the counts:
a float64 activation beyond 2¹⁵, or a residual stream beyond 2⁷ (a LayerNorm's centred square,
up to (2·2⁷)², would pass float16's largest value, 65,504: the port's scale is then ∞, correct
code or not).

Each model's decode and padded batch (STEP_PORTS, rows of their own): two prompts of 2–16 tokens drawn
from seed (i, 2), row 1 left-padded by 0 … P − 2 (tests/random_models.py's decode_case, which
tests/oracle/test_local_steps.py's random-model decode test draws by too), decoded 5 greedy steps in
float64; refgpt's float32 decode and tests/local_ports.py's (at bfloat16 and float16) forced along its
tokens are judged step by step (local.judge_decode: refgpt's with its KV cache kept, the port's,
which recomputes the whole sequence each step as llm.c's loop does, kv_cache="recomputed"); the same two prompts, row 1 left-padded for even i
and right-padded for odd i, run by the NumPy port at float32, bfloat16 and float16 with their mask and
judged at their real positions (local.judge with attention_mask and position_ids). float16 is skipped
where the float64 decode is out of its range (the rule above).

The C port (tests/oracle/c_port/gpt2_port.c: llm.c's loops, sequential row sums) is judged in its five
builds (tests/c_port.py's BUILDS: -O3 in index order, reversed and in 8 lanes, -Ofast, -O3 with FMA),
forward and backward, on the same models as llm.c can run them (c_port.llmc_shaped): ε = 1e-5,
d_mlp = 4·d_model (the MLP's weights drawn again when the draw's d_mlp differs), scores scaled by
1/√d_head, W_U tied to W_E, the vocabulary padded to a multiple of 128; every other weight, the
tokens (llm.c's x) and the weight scale are the draw's, and the targets (llm.c's y) are drawn from
seed (i, 1). Each build is compiled once (cached), then run once per model: one process each.

    PYTHONPATH=. python benchmarks/local_calibration.py 1000     # the table for benchmarks/RESULTS.md
    PYTHONPATH=. python benchmarks/local_calibration.py 1000 --ports C --start 0   # the C builds only
    PYTHONPATH=. python benchmarks/local_calibration.py 1000 --ports decode,padded  # the decode and padded rows

tests/oracle/test_local_calibration.py runs a small draw by default, 1,000 with REFGPT_CALIBRATION=long.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import c_port  # noqa: E402
from local_ports import port_decode, port_forward  # noqa: E402
from random_models import decode_case, random_params  # noqa: E402
from refgpt import Config, Model  # noqa: E402
from refgpt.gpt2 import padding  # noqa: E402
from refgpt.oracle import decode, local  # noqa: E402

PORTS = ("refgpt float32", "port float32", "port bfloat16", "port float16")
C_PORTS = tuple(f"C {build}" for build in c_port.BUILDS)
#: each model's decode (judge_decode) and padded forward (judge with the mask): their own rows
STEP_PORTS = ("decode refgpt float32", "decode port bfloat16", "decode port float16", "padded port float32",
              "padded port bfloat16", "padded port float16")
STEPS = 5  # greedy decode steps of each model's decode case


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


def steps_case(i, cfg, params):
    """(prompt [2, P], mask [2, P], ref, chosen [2, STEPS]) of model i's decode: random_models.decode_case
    drawn from seed (i, 2), P ≤ 16 (P + STEPS ≤ n_ctx = 32)."""
    return decode_case(cfg, params, np.random.default_rng((i, 2)), STEPS, longest=17)


def padded_batch(i, prompt, mask):
    """(tokens, mask, position_ids) [2, P]: the decode's prompts, row 1 left-padded for even i, right-padded
    (its real tokens moved first) for odd i; position ids the golden's (pads 0)."""
    if i % 2:
        pads = int((mask[1] == 0).sum())
        prompt, mask = prompt.copy(), mask.copy()
        prompt[1], mask[1] = np.roll(prompt[1], -pads), mask[1, ::-1]
    return prompt, mask, np.where(mask == 1, padding.position_ids(mask), 0)


def step_report(port, i, cfg, params, case):
    """The local report of ``port`` (one of STEP_PORTS) on model i's decode or padded case."""
    prompt, mask, ref, chosen = case
    kind, store = port.split()[0], port.split()[-1]
    if kind == "padded":
        tokens, mask, positions = padded_batch(i, prompt, mask)
        acts = port_forward(params, cfg, tokens, store, outputs=True, attention_mask=mask)
        return local.judge(params, cfg, tokens, acts, store, attention_mask=mask, position_ids=positions)
    if port == "decode refgpt float32":  # a KV cache
        acts, _ = decode.run(Model(cfg, params, dtype="float32"), prompt, STEPS, continuation=chosen,
                             attention_mask=mask)
        return local.judge_decode(params, cfg, ref, acts, store)
    acts = port_decode(params, cfg, ref, store)  # llm.c's loop: the whole sequence recomputed every step
    return local.judge_decode(params, cfg, ref, acts, store, kv_cache="recomputed")


def c_port_case(i):
    """(cfg, params, tokens, targets) of model i as the C port runs it (the module's docstring)."""
    cfg, params, tokens, scale = draw_case(i)
    cfg, params = c_port.llmc_shaped(cfg, params, seed=i, scale=scale)
    return cfg, params, tokens, np.random.default_rng((i, 1)).integers(0, cfg.d_vocab, tokens.shape)


@dataclass
class Stats:
    models: int = 0
    judgments: int = 0
    ops: int = 0
    skipped_float16: int = 0  # float16 ports (forward, decode, padded) skipped: the model out of its range
    flagged: list = field(default_factory=list)  # (model, port, op, name, ratio)
    worst: dict = field(default_factory=lambda: defaultdict(lambda: (0.0, None)))  # op → (ratio, (model, port, name))
    seconds: float = 0.0
    per_port: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0, 0.0]))  # port → judged, skipped, ops, s
    stopped: str = ""  # why a run ended early (interrupted), and where


def out_of_float16(cache) -> bool:
    cache = {name: v for name, v in cache.items() if np.issubdtype(np.asarray(v).dtype, np.floating)}
    finite = [np.abs(v[np.isfinite(v)]).max(initial=0.0) for v in cache.values()]
    streams = [np.abs(v).max() for name, v in cache.items() if "hook_resid_" in name]
    return max(finite) > 2.0 ** 15 or max(streams) > 2.0 ** 7


def c_builds(ports):
    """build name → its executable, compiled once (tests/c_port.py caches it); None without a compiler."""
    return {p: c_port.build(*c_port.BUILDS[p.split()[1]]) for p in ports if p in C_PORTS}


def calibrate(n, start=0, stats=None, ports=PORTS + C_PORTS + STEP_PORTS, progress=None) -> Stats:
    """Judge models start … start + n − 1 on ``ports``; ``progress`` a stream to print each model's
    flags so far to (a long run's progress)."""
    stats = stats or Stats()
    exes = c_builds(ports)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="local-calibration-") as d:
        try:
            judge_models(range(start, start + n), ports, exes, stats, d, progress, t0)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM in __main__: the table of what was judged
            stats.stopped = f"interrupted after {stats.models} models (the last one's ports partly judged)"
    stats.seconds += time.perf_counter() - t0
    return stats


def judge_models(models, ports, exes, stats, d, progress, t0):
    """Judge each of ``models`` on ``ports`` into ``stats`` (calibrate's loop)."""
    for i in models:
        cfg, params, tokens, _ = draw_case(i)
        too_big = "port float16" in ports and out_of_float16(Model(cfg, params).run_with_cache(tokens)[1].cache_dict)
        c_case = c_port_case(i) if exes else None
        t1 = time.perf_counter()
        case = steps_case(i, cfg, params) if set(ports) & set(STEP_PORTS) else None
        steps_too_big = case is not None and out_of_float16(case[2])  # the float64 decode (its step 0: the padded batch)
        setup = time.perf_counter() - t1  # the float64 decode's, shared by the step ports: charged to the first
        stats.models += 1
        for port in ports:
            counts, t1 = stats.per_port[port], time.perf_counter()
            if port in STEP_PORTS:
                t1, setup = t1 - setup, 0.0
            float16 = port.split()[-1] == "float16"
            if ((port == "port float16" and too_big) or (port in STEP_PORTS and float16 and steps_too_big)
                    or (port in exes and exes[port] is None)):
                stats.skipped_float16 += float16
                counts[1] += 1
                counts[3] += time.perf_counter() - t1
                continue
            if port in STEP_PORTS:
                report = step_report(port, i, cfg, params, case)
            elif port in exes:  # forward and backward, with llm.c's targets
                c_cfg, c_params, c_tokens, targets = c_case
                acts = c_port.port_acts(port.split()[1], Model(c_cfg, c_params), c_tokens, targets, d, gradients=True,
                                        losses=False)
                report = local.judge(c_params, c_cfg, c_tokens, acts, "float32", targets=targets)
            else:
                report = local.judge(params, cfg, tokens, port_acts(port, cfg, params, tokens), port.split()[1])
            stats.judgments += 1
            counts[0] += 1
            for v in report.ops:
                if v.skipped is not None:
                    continue
                stats.ops += 1
                counts[2] += 1
                if v.flagged:
                    stats.flagged.append((i, port, v.op, v.name, v.ratio))
                if v.ratio >= stats.worst[v.op][0]:
                    stats.worst[v.op] = (v.ratio, (i, port, v.name))
            counts[3] += time.perf_counter() - t1
        if progress:
            print(f"model {i}: {len(stats.flagged)} flagged so far {stats.flagged[-3:]}, "
                  f"{time.perf_counter() - t0:.0f} s", file=progress, flush=True)


def table(stats: Stats) -> str:
    lines = [f"{stats.models} random models, {stats.judgments} ports judged ({stats.skipped_float16} float16 ports "
             f"skipped: out of its range), {stats.ops} ops, {len(stats.flagged)} flagged, "
             f"{stats.seconds:.0f} s", "", "| port | models judged | skipped | ops judged | flagged | seconds |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for port, (judged, skipped, ops, seconds) in stats.per_port.items():
        flagged = sum(f[1] == port for f in stats.flagged)
        lines.append(f"| {port} | {judged} | {skipped} | {ops} | {flagged} | {seconds:.0f} |")
    lines += ["", "| op | worst ratio | where (model, port, tensor) |", "| --- | ---: | --- |"]
    for op, (ratio, where) in sorted(stats.worst.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"| {op} | {ratio:.3f} | {where[0]}, {where[1]}, `{where[2]}` |" if where else f"| {op} | 0 | |")
    lines += [stats.stopped] if stats.stopped else []
    lines += [f"flagged: model {i}, {port}, {op} at `{name}`, ratio {ratio:.3f}" for i, port, op, name, ratio in stats.flagged]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The local verdicts' false-alarm calibration (module docstring).")
    parser.add_argument("n", type=int, nargs="?", default=100, help="models to draw (default 100)")
    parser.add_argument("--start", type=int, default=0, help="the first model's seed (default 0)")
    parser.add_argument("--ports", default="all", help="'all', or a comma-separated list of port-name prefixes: "
                                                       "'C' for the C port's builds, 'port' for tests/local_ports.py's, "
                                                       "'decode' and 'padded' for the decode and padded cases")
    args = parser.parse_args()
    every = PORTS + C_PORTS + STEP_PORTS
    chosen = every if args.ports == "all" else tuple(
        p for p in every if any(p == q or p.startswith(q + " ") for q in args.ports.split(",")))
    if not chosen:
        parser.error(f"--ports {args.ports!r} names none of: {', '.join(every)}")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # kill PID: the table of the models judged so far
    print(table(calibrate(args.n, args.start, ports=chosen, progress=sys.stderr)))
