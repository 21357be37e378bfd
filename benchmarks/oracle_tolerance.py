"""Measure the oracle's growth factor G: how far an independent implementation lands from refgpt.

    python benchmarks/oracle_tolerance.py [--models 500] [--seed 0]

refgpt's profiles (refgpt/oracle/comparison.py) accept a candidate element when

    |candidate − reference| ≤ G·u·(c_X + S_X + |reference|)

with u the format's unit roundoff, S_X = max(1, max|X_ref|) and c_X the error of refgpt's own
float32 forward pass at tensor X in units of 2⁻²⁴ (refgpt/oracle/golden.py). This script measures, over
random models, the smallest G that would have accepted an *independent* implementation:

* float32 and float64: refgpt in that dtype with every activation additionally multiplied by
  (1 + u·r), r uniform in [−1, 1], at every hook point: a second rounding of the same size at
  every step, in a pattern unrelated to refgpt's own, as a port with another summation order has;
* bfloat16 and float16: weights rounded to the format, then float32 arithmetic with every
  activation stored in the format (rounded to nearest even) at every hook point, perturbed by one
  unit roundoff first: a port that keeps activations in 16 bits and accumulates in float32.

Models are drawn like tests/random_models.py draws them (every config knob; weights N(0, s²),
s ∈ {0.1, 0.5, 1}) with d_model ≥ 2: a LayerNorm over one element outputs exactly its bias in
any implementation, which the perturbation model gets wrong. Prints, per format, the median,
99th percentile and maximum of the needed G.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from random_models import random_params  # noqa: E402
from refgpt import Config, Model  # noqa: E402
from refgpt.oracle import golden  # noqa: E402
from refgpt.gpt2.activations import ACTIVATIONS  # noqa: E402
from refgpt.oracle.comparison import (BIAS_GROWTH, GROWTH, UNIT_ROUNDOFF, bias_bound,  # noqa: E402
                                      is_zero_in_exact_arithmetic, tensor_scale)
from refgpt.oracle.gradients import compute_gradients  # noqa: E402
from refgpt.oracle.name_maps import is_gradient  # noqa: E402


def round_bf16(x):
    """float32 → nearest bfloat16 (ties to even), returned as float32."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def round_f16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


_STORE = {"float64": None, "float32": None, "bfloat16": round_bf16, "float16": round_f16}


def independent_run(cfg: Config, params: dict, tokens, fmt: str, seed: int, backward: bool = False) -> dict[str, np.ndarray]:
    """The golden tensors of a simulated independent implementation in ``fmt`` (module docstring).

    Its gradients (float32 and float64 only) are refgpt's backward pass in that dtype on weights
    moved by one rounding each (×(1 + u·r)): the hooks that perturb the forward do not reach the
    backward, and a second rounding at its inputs is the nearest stand-in for another summation order.
    """
    store, u = _STORE[fmt], UNIT_ROUNDOFF[fmt]
    dtype = "float64" if fmt == "float64" else "float32"
    weights = {k: np.asarray(v, dtype) for k, v in params.items()}
    if store is not None:
        weights = {k: store(v) for k, v in weights.items()}
    rng = np.random.default_rng(seed)

    def perturb(a, name):
        b = (a * (1.0 + u * rng.uniform(-1.0, 1.0, a.shape))).astype(a.dtype)
        return store(b) if store is not None else b

    out = golden.compute(Model(cfg, weights, dtype=dtype), tokens, fwd_hooks=[(lambda n: True, perturb)])
    if backward and store is None:
        moved = {k: perturb(v, k) for k, v in weights.items()}
        out.update(compute_gradients(Model(cfg, moved, dtype=dtype), tokens))
    return out


def needed_growth(reference: dict, candidate: dict, conditioning: dict, error_rms: dict, fmt: str):
    """The smallest G (elementwise) and B (the bias bound, refgpt/oracle/comparison.py ``bias_bound``)
    accepting every float tensor, each with the tensor that needs it: ((G, name), (B, name))."""
    u, worst, worst_bias = UNIT_ROUNDOFF[fmt], (0.0, ""), (0.0, "")
    for name, r in reference.items():
        if r.dtype.kind != "f" or name not in candidate:
            continue
        r = r.astype(np.float64)
        finite = np.isfinite(r)
        c = candidate[name].astype(np.float64)[finite]
        r = r[finite]
        if r.size == 0:
            continue
        scale = tensor_scale(name, r, reference)
        err = np.abs(c - r)
        g = float(np.max(err / (u * (conditioning[name] + scale + np.abs(r)))))
        worst = max(worst, (g, name))
        bound = bias_bound(u, error_rms[name], r) / BIAS_GROWTH  # the bias bound for B = 1
        if bound and not is_zero_in_exact_arithmetic(name):
            worst_bias = max(worst_bias, (abs(float(np.mean(c - r))) / bound, name))
    return worst, worst_bias


def random_case(rng):
    """A config, float32-exact float64 weights and tokens, drawn like tests/random_models.py."""
    while True:
        n_heads = int(rng.integers(1, 5))
        d_head = int(rng.integers(1, max(1, 32 // n_heads) + 1))
        if n_heads * d_head >= 2:
            break
    cfg = Config(d_model=n_heads * d_head, n_layers=int(rng.integers(1, 4)), n_heads=n_heads,
                 d_mlp=int(rng.integers(1, 65)), d_vocab=int(rng.integers(2, 41)), n_ctx=int(rng.integers(2, 13)),
                 eps=float(rng.choice([1e-5, 1e-3, 0.1])), act_fn=str(rng.choice(sorted(ACTIVATIONS))),
                 use_attn_scale=bool(rng.integers(2)), scale_attn_by_inverse_layer_idx=bool(rng.integers(2)),
                 tie_word_embeddings=bool(rng.integers(2)))
    params = random_params(cfg, int(rng.integers(2**31)), float(rng.choice([0.1, 0.5, 1.0])))
    params = {k: v.astype(np.float32).astype(np.float64) for k, v in params.items()}
    tokens = rng.integers(0, cfg.d_vocab, size=(int(rng.integers(1, 4)), int(rng.integers(2, cfg.n_ctx + 1))))
    return cfg, params, tokens


def trained_cases(n, seed):
    """The embedded trained model (refgpt/files/default_model.py) on ``n`` random token batches."""
    from refgpt import load_default

    model = load_default()
    params = {k: np.asarray(v, np.float32).astype(np.float64) for k, v in model.params.items()}
    rng = np.random.default_rng(seed)
    for _ in range(n):
        tokens = rng.integers(0, model.cfg.d_vocab, size=(int(rng.integers(1, 3)), int(rng.integers(2, 33))))
        yield model.cfg, params, tokens


FORMATS = ("float32", "bfloat16", "float16", "float64")


def run(models=500, seed=0, trained=0, backward=True, progress=None) -> dict:
    """Needed G and B per format (forward and, for float32/float64, backward), and the share of
    correct simulated ports that the profiles (G = GROWTH, B = BIAS_GROWTH) would flag.
    ``progress(i, results)`` is called every 100 cases with the results so far."""
    rng = np.random.default_rng(seed)
    cases = [("trained", case) for case in trained_cases(trained, seed)]
    cases += [("random", random_case(rng)) for _ in range(models)]
    needed = {fmt: [] for fmt in FORMATS}
    for i, (kind, (cfg, params, tokens)) in enumerate(cases):
        model = Model(cfg, params)
        ref = golden.compute(model, tokens, backward=backward)
        cond, rms = golden.float32_errors(model, tokens, backward=backward, reference=ref)
        for fmt in FORMATS:
            cand = independent_run(cfg, params, tokens, fmt, seed=i, backward=backward)
            (g, at), (g_bias, at_bias) = needed_growth(ref, cand, cond, rms, fmt)
            needed[fmt].append((kind, g, at, g_bias, at_bias, cfg.d_model))
        if progress is not None and (i + 1) % 100 == 0:
            progress(i + 1, summarize(needed))
    return summarize(needed)


def summarize(needed) -> dict:
    results = {}
    for fmt, rows in needed.items():
        for kind in ("random", "trained"):
            sel = [r for r in rows if r[0] == kind]
            if not sel:
                continue
            g = np.array([r[1] for r in sel])
            g_bias = np.array([r[3] for r in sel])
            flagged = (g > GROWTH) | (g_bias > BIAS_GROWTH)
            top, top_bias = max(sel, key=lambda r: r[1]), max(sel, key=lambda r: r[3])
            results[(fmt, kind)] = {
                "models": len(sel), "median": float(np.median(g)), "p99": float(np.quantile(g, 0.99)),
                "max": float(g.max()), "max_at": f"{top[2]}, d_model {top[5]}",
                "bias_median": float(np.median(g_bias)), "bias_p99": float(np.quantile(g_bias, 0.99)),
                "bias_max": float(g_bias.max()), "bias_max_at": f"{top_bias[4]}, d_model {top_bias[5]}",
                "above_G": int((g > GROWTH).sum()), "above_B": int((g_bias > BIAS_GROWTH).sum()),
                "false_alarms": int(flagged.sum()), "false_alarm_rate": float(flagged.mean())}
    return results


def report(results) -> str:
    return "\n".join(
        f"{fmt:9s} {kind:7s} {r['models']} models: G median {r['median']:.2f}, p99 {r['p99']:.2f}, "
        f"max {r['max']:.2f} (at {r['max_at']}); B median {r['bias_median']:.3f}, p99 "
        f"{r['bias_p99']:.3f}, max {r['bias_max']:.3f} (at {r['bias_max_at']}); flagged at G = {GROWTH}, "
        f"B = {BIAS_GROWTH}: {r['false_alarms']} ({100 * r['false_alarm_rate']:.2f}%: "
        f"{r['above_G']} by G, {r['above_B']} by B)" for (fmt, kind), r in results.items())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Measure the oracle's growth factor G and bias bound B on random models.")
    p.add_argument("--models", type=int, default=500)
    p.add_argument("--trained", type=int, default=0, help="also this many token batches on the embedded trained model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--forward-only", action="store_true", help="no gradients")
    p.add_argument("--progress", action="store_true", help="print the results so far every 100 cases")
    args = p.parse_args(argv)
    t0 = time.time()

    def progress(i, results):
        print(f"-- after {i} cases ({time.time() - t0:.0f} s)\n{report(results)}", flush=True)

    print(report(run(args.models, args.seed, args.trained, not args.forward_only,
                     progress if args.progress else None)))
    print(f"({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
