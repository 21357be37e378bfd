"""Where the test suite's time goes: CONTRIBUTING.md's tables (per directory of tests/, and the 25
slowest tests), from the report of a run with ``--durations=0``.

    python -m pytest -q -p no:cacheprovider --durations=0 > durations.txt
    python benchmarks/suite_times.py durations.txt

A test's seconds are its setup, call and teardown together (a module's shared fixture is paid by
its first test). pytest leaves out phases under 5 ms unless given ``--durations-min=0``; they add
up to little. The counts of tests per directory come from a collection (``--collect-only -q``,
the same arguments), passed as a second file when wanted.
"""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(tests/.+)$")


def test_seconds(report: str) -> dict[str, float]:
    """Test id → seconds (setup + call + teardown) from pytest's durations report."""
    seconds: dict[str, float] = defaultdict(float)
    for line in report.splitlines():
        match = LINE.match(line)
        if match:
            seconds[match.group(3)] += float(match.group(1))
    return dict(seconds)


def directory(test_id: str) -> str:
    """tests/core/test_x.py::test_y → tests/core; a module at tests/'s top → tests/ (top)."""
    parts = test_id.split("::", 1)[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else "tests/ (top)"


def tables(report: str, collected: str | None = None, top: int = 25) -> str:
    seconds = test_seconds(report)
    per_dir: dict[str, float] = defaultdict(float)
    for test_id, s in seconds.items():
        per_dir[directory(test_id)] += s
    counts = Counter(directory(line.strip()) for line in (collected or "").splitlines() if "::" in line)
    total = sum(per_dir.values())
    out = ["| directory | tests | seconds | share |", "| --- | ---: | ---: | ---: |"]
    for name, s in sorted(per_dir.items(), key=lambda kv: -kv[1]):
        out.append(f"| `{name}` | {counts.get(name, '')} | {s:.0f} | {100 * s / total:.0f} % |")
    out.append(f"| all | {sum(counts.values()) or ''} | {total:.0f} | |")
    out += ["", "| seconds | test |", "| ---: | --- |"]
    for test_id, s in sorted(seconds.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"| {s:.1f} | `{test_id}` |")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    read = lambda p: Path(p).read_text(encoding="utf-8")
    print(tables(read(sys.argv[1]), read(sys.argv[2]) if len(sys.argv) == 3 else None))
