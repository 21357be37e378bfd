"""Where a streamed golden's own memory peaks, tensor by tensor (issue 38, item 4); and the local
verdicts' walk.

    python benchmarks/golden_memory.py --layers 2 --T 1024 --dir /tmp/golden-memory
    python benchmarks/golden_memory.py --local --layers 2 --T 1024
    python benchmarks/golden_memory.py --local --backward --layers 2 --T 1024

``--local``: local.judge on refgpt's own float32 pass of a random GPT-2-small-shaped model (the
activations in memory, the float64 weights held before), under tracemalloc: its peak above them.
``--backward``: with refgpt's own float32 backward dumped too (every activation's and parameter's
gradient, refgpt.oracle.gradients.compute_gradients), so the backward's verdicts are walked.

A GPT-2-medium-shaped random float32 checkpoint (bench_scale.make_checkpoint) with ``--layers``
blocks, loaded as float64 as ``refgpt golden --model`` loads it; then golden.write_streamed under
tracemalloc (NumPy reports its buffers to it), the peak read and reset after each tensor is
written. The peak of a forward golden is where the logits are ([batch, pos, 50,257]: the four
passes' logits, log_probs and probs and the error model's temporaries), so it does not depend on
the number of blocks, each of which peaks far lower: a 2-block model measures a 24-block one's
peak above its weights in a few minutes instead of the full model's tens. Prints the ten largest
peaks and the overall one (MiB above what was held after loading).
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_scale import SHAPES, VOCAB, make_checkpoint  # noqa: E402
import refgpt  # noqa: E402
from refgpt.oracle import golden  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--T", type=int, default=1024)
    parser.add_argument("--dir", default="/tmp/golden-memory")
    parser.add_argument("--local", action="store_true", help="measure local.judge's walk instead")
    parser.add_argument("--backward", action="store_true", help="--local with the port's gradients judged too")
    a = parser.parse_args()
    if a.local:
        return local_walk(a.layers, a.T, a.backward)
    out = Path(a.dir)
    model = refgpt.load(make_checkpoint(out / "model", dict(SHAPES["medium"], n_layer=a.layers)), dtype="float64",
                        tokenizer=False)
    tokens = np.random.default_rng(1).integers(0, VOCAB, (1, a.T))
    names, peaks = list(golden.layout(model, tokens.shape)), []

    def progress(done, total):  # called after tensor ``done`` is written, before the error model reads it
        peaks.append((f"up to {names[done - 1]}", *(m / 2**20 for m in tracemalloc.get_traced_memory())))
        tracemalloc.reset_peak()

    tracemalloc.start()
    t = time.perf_counter()
    golden.write_streamed(out / "golden.safetensors", model, tokens, command=["golden_memory"], progress=progress)
    peaks.append(("the end (probs)", *(m / 2**20 for m in tracemalloc.get_traced_memory())))
    print(f"{time.perf_counter() - t:.0f} s; the ten largest peaks above the loaded weights (MiB):")
    for label, held, peak in sorted(peaks, key=lambda p: -p[2])[:10]:
        print(f"  {label:45s} held {held:7.0f}  peak {peak:7.0f}")
    print(f"overall: {max(p[2] for p in peaks):.0f} MiB")
    (out / "golden.safetensors").unlink()


def local_walk(layers, T, backward=False):
    from refgpt import Config, Model
    from refgpt.oracle import local
    from refgpt.oracle.gradients import compute_gradients

    sys.path.insert(0, str(HERE.parent / "tests"))
    from random_models import random_params

    cfg = Config(d_model=768, n_layers=layers, n_heads=12, d_mlp=3072, d_vocab=VOCAB, n_ctx=1024)
    params = random_params(cfg, seed=1, scale=0.3)
    tokens = np.random.default_rng(0).integers(0, VOCAB, (1, T))
    model = Model(cfg, params, dtype="float32")
    logits, cache = model.run_with_cache(tokens)  # [1, T, d_vocab]
    acts = {**cache.cache_dict, "logits": logits, **(compute_gradients(model, tokens) if backward else {})}
    del model, cache
    tracemalloc.start()
    t = time.process_time()
    report = local.judge(params, cfg, tokens, acts, "float32")
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    judged = sum(v.skipped is None for v in report.ops)
    print(f"local.judge{' with gradients' if backward else ''}: {time.process_time() - t:.0f} s of CPU, peak "
          f"{peak:.0f} MiB above the weights and the activations; {judged} ops judged, flagged: "
          f"{[v.name for v in report.flagged]}")


if __name__ == "__main__":
    main()
