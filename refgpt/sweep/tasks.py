"""What a sweep computes per prompt, and how a corpus of results is reduced: the task protocol.

A task is a class with

- ``name`` and ``min_tokens`` (the fewest tokens a prompt needs: 2 for anything with a next token);
- ``check_options(options) -> dict`` (classmethod): the options checked and made canonical (plain
  JSON; paths absolute) in the process that starts the sweep, before any model is loaded. They go
  into OUT/sweep.json, so a re-run with other options is refused rather than mixed in;
- ``__init__(model, options, out)``: run once per worker, after the model is loaded (resolve a
  target token, load translators, check a candidates directory);
- ``run(model, tokens, prompt) -> result``: one prompt's result, plain JSON (ints, floats, strings,
  lists, dicts). Floats are written with ``repr``, which reads back to the same float;
- ``files(result)``: the files a result vouches for (a golden file), as {path, sha256, bytes}; a
  re-run checks them before it skips the prompt;
- ``summarize(results) -> dict`` (classmethod): the corpus reduction over (prompt id, result)
  pairs given in prompt-id order. Sums are accumulated in that order, one prompt after the
  other, so the summary does not depend on how many workers ran or the order they finished in.

Within one prompt, sums over positions are ``math.fsum`` (correctly rounded, so independent of
any summation order). The tasks: refgpt/sweep/task_golden.py, task_compare.py, task_lens.py,
task_attribute.py, task_loss.py; refgpt/sweep/registry.py finds one by name.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import RefGPTError


class Task:
    name = ""
    min_tokens = 1

    @classmethod
    def check_options(cls, options: dict) -> dict:
        if options:
            raise RefGPTError(f"--task {cls.name} takes no options, found {sorted(options)}")
        return {}

    def __init__(self, model, options: dict, out: Path):
        self.options, self.out = options, out

    def run(self, model, tokens: np.ndarray, prompt) -> dict:  # tokens: [pos]
        raise NotImplementedError

    def files(self, result: dict) -> list[dict]:
        return []

    @classmethod
    def summarize(cls, results) -> dict:
        raise NotImplementedError


def known_options(task: str, options: dict, allowed: dict) -> dict:
    """``options`` with every key in ``allowed`` (key → default) and no other."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise RefGPTError(f"--task {task} has no option {unknown[0]!r} (its options: {', '.join(sorted(allowed)) or 'none'})")
    return {key: options.get(key, default) for key, default in allowed.items()}


def floats(values) -> list[float]:
    """An array's values as Python floats (exact: a float32 or float64 is a Python float)."""
    return [float(v) for v in np.asarray(values).reshape(-1)]


def fsum_rows(values) -> list[float]:
    """math.fsum over the last axis of a 2-D array, per row: [rows]."""
    return [math.fsum(row) for row in np.asarray(values, dtype=np.float64).tolist()]


def ratio(total: float, n: float):
    """total / n, or None when n is 0 (JSON null: nothing to average)."""
    return total / n if n else None


def ratios(totals, n) -> list:
    return [ratio(float(t), n) for t in totals]
