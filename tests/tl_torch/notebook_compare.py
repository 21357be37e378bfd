"""Comparing two runs of one notebook (tests/tl_torch/notebook_runner.py): refgpt's and TransformerLens's,
cell by cell.

A cell **matches** when it ran in both and everything it produced agrees: every variable it made
or changed, every figure it would have drawn (the display calls' arguments), and what it printed.
Numbers agree within what float64 arithmetic in two different orders gives:

    float64, complex128   |a − b| ≤ TOL·max(1, max|b|), TOL = 1e-11 (tests/peers.py TL_TOL: refgpt
                          and TransformerLens agree to ~1e-15 on every activation; 1e-11 leaves room
                          for the notebooks' own divisions by differences of such numbers)
    float32               the same, or one float32 rounding step (2⁻²³·max(1, |b|)): a float64
                          value stored into a float32 tensor (``torch.zeros(...)[i] = x``) rounds to
                          either neighbour when the two float64s straddle the midpoint
    integers, booleans, strings: equal
    printed numbers       equal up to one unit in the last printed digit (a rounding can go either
                          way for two numbers 1e-15 apart)

Names and type names that the two libraries print differently (``<class
'refgpt.tl_torch.cache.ActivationCache'>``) are differences like any other: a cell whose only
difference is one is a documented departure (docs/transformerlens.md §2), not a match.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

TOL = 1e-11
F32_STEP = 2.0 ** -23


@dataclass
class CellResult:
    index: int
    verdict: str  # "match", "differs", "fails on refgpt", "fails on TL", "fails on both", "skipped"
    seconds: tuple = (0.0, 0.0)
    details: list = field(default_factory=list)

    def __str__(self):
        more = "; ".join(self.details[:4])
        return f"cell {self.index}: {self.verdict}" + (f" ({more})" if more else "")


def compare_runs(ref: list, tl: list, ignore=None) -> list[CellResult]:
    """One CellResult per cell; ``ignore``: cell index → variable names not compared there."""
    ignore = ignore or {}
    results = []
    for r, t in zip(ref, tl):
        result = CellResult(r["index"], "match", (r["seconds"], t["seconds"]))
        if r["status"] == "skipped" or t["status"] == "skipped":
            result.verdict = "skipped"
        elif r["status"] != "ok" or t["status"] != "ok":
            failed = [name for name, run in (("refgpt", r), ("TL", t)) if run["status"] != "ok"]
            result.verdict = "fails on both" if len(failed) == 2 else f"fails on {failed[0]}"
            result.details = [f"{name}: {run.get('error', '')[:300]}" for name, run in (("refgpt", r), ("TL", t))
                              if run["status"] != "ok"]
        else:
            result.details = differences(r, t, set(ignore.get(r["index"], ())))
            if result.details:
                result.verdict = "differs"
        results.append(result)
    return results


def differences(r: dict, t: dict, ignored=()) -> list[str]:
    found = []
    for name in sorted((set(r["values"]) | set(t["values"])) - set(ignored)):
        if name not in r["values"] or name not in t["values"]:
            found.append(f"{name}: made by {'refgpt' if name in r['values'] else 'TL'} only")
            continue
        why = differ(r["values"][name], t["values"][name])
        if why:
            found.append(f"{name}{why}")
    if len(r["displays"]) != len(t["displays"]):
        found.append(f"display calls: {len(r['displays'])} vs {len(t['displays'])}")
    for i, (a, b) in enumerate(zip(r["displays"], t["displays"])):
        if a[0] != b[0]:
            found.append(f"display {i}: {a[0]} vs {b[0]}")
            continue
        why = differ(a[1], b[1]) or differ(a[2], b[2])
        if why:
            found.append(f"display {i} ({a[0]}){why}")
    why = printed_difference(r["stdout"], t["stdout"])
    if why:
        found.append(f"stdout: {why}")
    return found


def differ(a, b, path="") -> str:
    """'' when the fingerprints agree, else where and how they differ."""
    if a is None or b is None:
        return "" if a is None and b is None else f"{path}: data vs not data"
    if a[0] != b[0]:
        return f"{path}: {a[0]} vs {b[0]}"
    kind = a[0]
    if kind == "array":
        return _arrays_differ(a, b, path)
    if kind == "scalar":
        return _scalars_differ(a[1], b[1], path)
    if kind in ("list", "tuple"):
        if len(a[1]) != len(b[1]):
            return f"{path}: length {len(a[1])} vs {len(b[1])}"
        for i, (x, y) in enumerate(zip(a[1], b[1])):
            why = differ(x, y, f"{path}[{i}]")
            if why:
                return why
        return ""
    if kind in ("dict", "cache"):
        if list(a[1]) != list(b[1]):
            only = sorted(set(a[1]) ^ set(b[1]))[:3]
            return f"{path}: keys differ ({len(a[1])} vs {len(b[1])}; e.g. {only or 'order'})"
        for key in a[1]:
            why = differ(a[1][key], b[1][key], f"{path}[{key!r}]")
            if why:
                return why
        return ""
    if kind == "factored":
        return differ(a[1], b[1], f"{path}.A") or differ(a[2], b[2], f"{path}.B")
    return "" if a == b else f"{path}: {a!r:.80} vs {b!r:.80}"


def _arrays_differ(a, b, path) -> str:
    _, dtype_a, shape_a, x, peak_a = a
    _, dtype_b, shape_b, y, peak_b = b
    if dtype_a != dtype_b:
        return f"{path}: dtype {dtype_a} vs {dtype_b}"
    if shape_a != shape_b:
        return f"{path}: shape {list(shape_a)} vs {list(shape_b)}"
    if x.dtype.kind in "biu":
        return "" if np.array_equal(x, y) else f"{path}: integers differ at {int(np.argmax(x != y))}"
    finite = np.isfinite(y)
    if not np.array_equal(np.isfinite(x), finite) or not np.array_equal(x[~finite], y[~finite]):
        return f"{path}: non-finite entries differ"
    if not finite.any():
        return ""
    scale = max(1.0, float(np.max(np.abs(y[finite]))), *(p for p in (peak_b,) if p is not None and math.isfinite(p)))
    err = float(np.max(np.abs(x[finite] - y[finite]))) / scale
    bound = TOL if "float32" not in dtype_a else max(TOL, F32_STEP)
    return "" if err <= bound else f"{path}: max relative error {err:.2e} > {bound:.0e}"


def _scalars_differ(x, y, path) -> str:
    if isinstance(x, float) or isinstance(y, float) or isinstance(x, complex):
        if isinstance(x, bool) or isinstance(y, bool) or isinstance(x, str) or isinstance(y, str):
            return "" if x == y else f"{path}: {x!r} vs {y!r}"
        if x != x and y != y:
            return ""
        return "" if abs(x - y) <= TOL * max(1.0, abs(y)) else f"{path}: {x!r} vs {y!r}"
    return "" if x == y else f"{path}: {x!r:.60} vs {y!r:.60}"


_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def printed_difference(a: str, b: str) -> str:
    """'' when two printouts agree (numbers up to one unit in their last printed digit)."""
    if a == b:
        return ""
    text_a, text_b = _NUMBER.split(a), _NUMBER.split(b)
    nums_a, nums_b = _NUMBER.findall(a), _NUMBER.findall(b)
    if text_a != text_b or len(nums_a) != len(nums_b):
        for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines())):
            if x != y:
                return f"line {i}: {x[:100]!r} vs {y[:100]!r}"
        return f"{len(a.splitlines())} vs {len(b.splitlines())} lines"
    for x, y in zip(nums_a, nums_b):
        if x == y:
            continue
        unit = _last_digit(x)
        if abs(float(x) - float(y)) > 1.0001 * unit:
            return f"printed {x} vs {y}"
    return ""


def _last_digit(s: str) -> float:
    """One unit in the last printed digit of a number as printed."""
    mantissa, _, exponent = s.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 10.0 ** (-decimals + (int(exponent) if exponent else 0))
