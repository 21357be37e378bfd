"""How long ``refgpt golden --certify`` takes: GPT-2 small's shape, random weights, T = 64.

    python benchmarks/certify_time.py [--T 64] [--layers 12] [--backward]

Times, in one run side by side: the float64 golden (forward, or forward and backward, with the
float32 rerun that measures conditioning), and the certificate (the same in np.longdouble,
refgpt/oracle/certify.py). Prints the largest certified error of the non-zero tensors.
Weights are N(0, 0.02²) like GPT-2's initialisation, LayerNorm gains 1, float32-exact.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from refgpt import Config, Model  # noqa: E402
from refgpt.gpt2.params import param_shapes  # noqa: E402
from refgpt.oracle import certify, golden  # noqa: E402


def gpt2_small_params(cfg: Config, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = {}
    for name, shape in param_shapes(cfg).items():
        if name == "unembed.W_U":
            continue
        value = np.ones(shape) if name.endswith(".w") else 0.02 * rng.standard_normal(shape, dtype=np.float32)
        p[name] = np.asarray(value, np.float32).astype(np.float64)
    p["unembed.W_U"] = p["embed.W_E"].T  # tied
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--backward", action="store_true")
    args = ap.parse_args(argv)
    cfg = Config(d_model=768, n_layers=args.layers, n_heads=12, d_mlp=3072, d_vocab=50257, n_ctx=1024)
    model = Model(cfg, gpt2_small_params(cfg))
    tokens = np.random.default_rng(1).integers(0, cfg.d_vocab, size=(1, args.T))
    t0 = time.perf_counter()
    g = golden.make(model, tokens, backward=args.backward)
    t1 = time.perf_counter()
    certify.add_certificate(g, model, tokens)
    t2 = time.perf_counter()
    print(f"GPT-2 small shape ({args.layers} layers), T = {args.T}, backward = {args.backward}: golden (float64 + "
          f"float32 rerun) {t1 - t0:.1f} s; certificate ({certify.extended_precision()}) {t2 - t1:.1f} s "
          f"({(t2 - t1) / (t1 - t0):.0f}× the golden)")
    print(certify.summary(g))
    return 0


if __name__ == "__main__":
    sys.exit(main())
