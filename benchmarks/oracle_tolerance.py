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
from refgpt.activations import ACTIVATIONS  # noqa: E402
from refgpt.oracle.comparison import GROWTH, UNIT_ROUNDOFF  # noqa: E402


def round_bf16(x):
    """float32 → nearest bfloat16 (ties to even), returned as float32."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def round_f16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


_STORE = {"float64": None, "float32": None, "bfloat16": round_bf16, "float16": round_f16}


def independent_run(cfg: Config, params: dict, tokens, fmt: str, seed: int) -> dict[str, np.ndarray]:
    """The golden tensors of a simulated independent implementation in ``fmt`` (module docstring)."""
    store, u = _STORE[fmt], UNIT_ROUNDOFF[fmt]
    dtype = "float64" if fmt == "float64" else "float32"
    weights = {k: np.asarray(v, dtype) for k, v in params.items()}
    if store is not None:
        weights = {k: store(v) for k, v in weights.items()}
    rng = np.random.default_rng(seed)

    def perturb(a, name):
        b = (a * (1.0 + u * rng.uniform(-1.0, 1.0, a.shape))).astype(a.dtype)
        return store(b) if store is not None else b

    return golden.compute(Model(cfg, weights, dtype=dtype), tokens, fwd_hooks=[(lambda n: True, perturb)])


def needed_growth(reference: dict, candidate: dict, conditioning: dict, fmt: str) -> tuple[float, str]:
    """The smallest G accepting every element of every float tensor, and the tensor that needs it."""
    u, worst = UNIT_ROUNDOFF[fmt], (0.0, "")
    for name, r in reference.items():
        if r.dtype.kind != "f":
            continue
        r = r.astype(np.float64)
        finite = np.isfinite(r)
        c = candidate[name].astype(np.float64)[finite]
        r = r[finite]
        if r.size == 0:
            continue
        scale = max(1.0, float(np.abs(r).max()))
        g = float(np.max(np.abs(c - r) / (u * (conditioning[name] + scale + np.abs(r)))))
        if g > worst[0]:
            worst = (g, name)
    return worst


def random_case(rng):
    """A config, float32-exact float64 weights and tokens, drawn like tests/random_models.py."""
    while True:
        n_heads = int(rng.integers(1, 5))
        d_head = int(rng.integers(1, max(1, 32 // n_heads) + 1))
        if n_heads * d_head >= 2:
            break
    cfg = Config(d_model=n_heads * d_head, n_layers=int(rng.integers(1, 4)), n_heads=n_heads,
                 d_mlp=int(rng.integers(1, 65)), d_vocab=int(rng.integers(2, 41)), n_ctx=int(rng.integers(1, 13)),
                 eps=float(rng.choice([1e-5, 1e-3, 0.1])), act_fn=str(rng.choice(sorted(ACTIVATIONS))),
                 use_attn_scale=bool(rng.integers(2)), scale_attn_by_inverse_layer_idx=bool(rng.integers(2)),
                 tie_word_embeddings=bool(rng.integers(2)))
    params = random_params(cfg, int(rng.integers(2**31)), float(rng.choice([0.1, 0.5, 1.0])))
    params = {k: v.astype(np.float32).astype(np.float64) for k, v in params.items()}
    tokens = rng.integers(0, cfg.d_vocab, size=(int(rng.integers(1, 4)), int(rng.integers(1, cfg.n_ctx + 1))))
    return cfg, params, tokens


def run(models=500, seed=0) -> dict:
    results = {}
    for fmt in ("float32", "bfloat16", "float16", "float64"):
        rng = np.random.default_rng(seed)
        needed = []
        for i in range(models):
            cfg, params, tokens = random_case(rng)
            model = Model(cfg, params)
            ref = golden.compute(model, tokens)
            cond = golden.conditioning(model, tokens)
            cand = independent_run(cfg, params, tokens, fmt, seed=i)
            g, at = needed_growth(ref, cand, cond, fmt)
            needed.append((g, at, cfg.d_model))
        g = np.array([n[0] for n in needed])
        top = max(needed)
        results[fmt] = {"models": models, "median": float(np.median(g)), "p99": float(np.quantile(g, 0.99)),
                        "max": float(g.max()), "max_at": f"{top[1]}, d_model {top[2]}",
                        "above_G": int((g > GROWTH).sum()),
                        "above_G_d_model": sorted(n[2] for n in needed if n[0] > GROWTH)}
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Measure the oracle's growth factor G on random models.")
    p.add_argument("--models", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    t0 = time.time()
    for fmt, r in run(args.models, args.seed).items():
        print(f"{fmt:9s} {r['models']} models: needed G median {r['median']:.2f}, p99 {r['p99']:.2f}, "
              f"max {r['max']:.2f} (at {r['max_at']}); above G = {GROWTH}: {r['above_G']} "
              f"(d_model {r['above_G_d_model']})")
    print(f"({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
