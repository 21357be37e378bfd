"""The explorer page at GPT-2 small's shape: how big it is, how long it takes to build and to load.

    python benchmarks/bench_explorer.py [--tokens 256] [--loads 5]

A GPT-2-small-shaped model (12 layers × 12 heads, d_model 768, the 50,257-token vocabulary and
GPT-2's tokenizer from ../shared/gpt2, or $REFGPT_GPT2_TOKENIZER) with random weights, on the first T tokens of README.md;
every head is in the page. It is built (refgpt.analysis.explore, float64), written, and opened
from file:// in headless Chromium (tests/browser.py) several times: the load time is the page's
own clock when its script has drawn every view (``refgptExplorer.readyAt``, ms after navigation
start), median of the loads. The build's memory is tracemalloc's peak of what it allocates beyond
the model's weights (NumPy's arrays are traced), measured in a second build (tracemalloc slows
every allocation, so the timed build runs without it), and its CPU time is given beside the wall time (on
a busy machine the wall time says more about the neighbours). Random weights spread attention evenly, the worst case for the
page's size (a trained model's peaked rows hold more zeros). Needs chromium, chromium-driver,
selenium.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from browser import Browser  # noqa: E402
from machine import describe, machine  # noqa: E402
from random_models import random_model  # noqa: E402
from tl_port import TOKENIZER_DIR  # noqa: E402
from refgpt import Config, Tokenizer  # noqa: E402
from refgpt.analysis import explorer  # noqa: E402

GPT2_SMALL = Config(d_model=768, n_layers=12, n_heads=12, d_mlp=3072, d_vocab=50257, n_ctx=1024)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--loads", type=int, default=5)
    args = parser.parse_args()
    where = describe(machine())  # the BLAS and its kernel, the threads, the load at the start
    model = random_model(GPT2_SMALL, seed=1, scale=0.05)
    model.tokenizer = Tokenizer.from_dir(TOKENIZER_DIR)
    tokens = model.to_tokens((REPO / "README.md").read_text(encoding="utf-8"))[0][:args.tokens]
    start, cpu = time.perf_counter(), time.process_time()
    page = explorer.explore(model, tokens)  # timed without tracemalloc, which slows every allocation
    built, cpu = time.perf_counter() - start, time.process_time() - cpu
    tracemalloc.start()
    explorer.explore(model, tokens)  # built again for its memory peak
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    with tempfile.TemporaryDirectory() as tmp:
        path = page.save(Path(tmp) / "page.html")
        size = path.stat().st_size
        browser = Browser()
        try:
            loads = []
            for _ in range(args.loads):
                console, requests = browser.open(path)
                assert console == [] and len(requests) == 1, (console, requests)
                loads.append(browser.js("return refgptExplorer.readyAt"))
        finally:
            browser.quit()
    sizes = {k: len(json.dumps(v, separators=(",", ":"), ensure_ascii=False)) for k, v in page.data.items()}
    result = {"tokens": len(tokens), "heads": 144, "page_MiB": round(size / 2**20, 2),
              "pattern_MiB": round(sizes["pattern"] / 2**20, 2), "attribution_MiB": round(sizes["attribution"] / 2**20, 2),
              "build_s": round(built, 1), "build_cpu_s": round(cpu, 1), "machine": where, "build_peak_MB": round(peak / 1e6),
              "load_average": round(os.getloadavg()[0], 1), "load_ms_median": round(statistics.median(loads)), "loads_ms": [round(x) for x in loads]}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
