"""Exact logit attribution next to a plain forward pass, GPT-2 small's shapes, float64.

The claim (issue 4): attributing one target's logit at every position, head by head, costs at
most 2× a plain forward pass. Measured here on random GPT-2-small-shaped weights (d_model 768,
12 layers, 12 heads, d_mlp 3072, vocab 50257; GPT-2's initialisation, no download) at T = 256:

    forward         model(tokens)
    cached forward  model.run_with_cache(tokens, names=refgpt.analysis.attribution.required_hooks(cfg))
    attribute       refgpt.attribute(cache, target, granularity=…, logits=logits)

and the ratios attribute / forward and (cached forward + attribute) / forward, the second being
what a user pays end to end. Each time is the median of ``repeats`` runs after one warm-up; the
forward and the cached forward are timed in alternation, so that a busy machine slows both alike.
Also measured: layer and neuron granularity, and one target per position (each position's next
token), which projects every piece onto its own direction.

    python benchmarks/bench_attribution.py        # prints the table; run() returns the numbers
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
try:
    import refgpt
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))
    import refgpt
from refgpt.analysis.attribution import required_hooks  # noqa: E402
from refgpt.gpt2.params import param_shapes  # noqa: E402

GPT2_SMALL = refgpt.Config(d_model=768, n_layers=12, n_heads=12, d_mlp=3072, d_vocab=50257, n_ctx=1024)


def gpt2_init(cfg, seed=0):
    """GPT-2's initialisation: weights N(0, 0.02²), biases 0, LayerNorm gains 1."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(".w"):
            params[name] = np.ones(shape)
        elif name.split(".")[-1].startswith("b"):
            params[name] = np.zeros(shape)
        else:
            params[name] = 0.02 * rng.standard_normal(shape)
    params["unembed.W_U"] = params["embed.W_E"].T  # tied, as GPT-2's are
    return params


def median_seconds(fn, repeats):
    fn()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_medians(fns, repeats):
    """Median seconds of each fn, the fns timed in turn each round so that a change in the
    machine's load hits all of them alike."""
    for fn in fns:
        fn()  # warm up
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, record in zip(fns, times):
            start = time.perf_counter()
            fn()
            record.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def run(T=256, repeats=5) -> dict:
    model = refgpt.Model(GPT2_SMALL, gpt2_init(GPT2_SMALL))
    tokens = np.random.default_rng(1).integers(0, GPT2_SMALL.d_vocab, (1, T))
    names = required_hooks(GPT2_SMALL, logits=False)
    forward, cached = interleaved_medians([lambda: model(tokens),
                                           lambda: model.run_with_cache(tokens, names=names)], repeats)
    logits, cache = model.run_with_cache(tokens, names=names)
    next_tokens = np.concatenate([tokens[:, 1:], tokens[:, :1]], axis=1)  # [batch, pos]
    results = {"T": T, "repeats": repeats, "forward_s": forward, "cached_forward_s": cached, "attribute": []}
    for granularity, target in [("head", 464), ("layer", 464), ("neuron", 464), ("head", next_tokens)]:
        seconds = median_seconds(lambda: refgpt.attribute(cache, target, granularity=granularity, logits=logits), repeats)
        error = refgpt.attribute(cache, target, granularity=granularity, logits=logits).check(relative=True)
        results["attribute"].append({
            "granularity": granularity, "target": "one token" if np.ndim(target) == 0 else "one per position",
            "seconds": seconds, "over_forward": seconds / forward,
            "end_to_end_over_forward": (cached + seconds) / forward, "relative_error": error})
    return results


def main():
    r = run()
    print(f"GPT-2 small shapes, float64, T = {r['T']}, median of {r['repeats']}")
    print(f"forward {1e3 * r['forward_s']:.1f} ms; run_with_cache (needed hooks) {1e3 * r['cached_forward_s']:.1f} ms")
    print(f"{'granularity':<12}{'target':<18}{'attribute ms':>13}{'÷ forward':>11}{'(cache+attr) ÷ fwd':>20}{'rel. error':>12}")
    for row in r["attribute"]:
        print(f"{row['granularity']:<12}{row['target']:<18}{1e3 * row['seconds']:>13.2f}{row['over_forward']:>11.4f}"
              f"{row['end_to_end_over_forward']:>20.3f}{row['relative_error']:>12.1e}")


if __name__ == "__main__":
    main()
