"""The progress line a sweep keeps on stderr when it is a terminal: done, failed, rate, eta.

    sweep: 412/10000 prompts (3 failed) · 2.31 prompts/s · eta 1 h 09 min

Rewritten in place (carriage return) at most every ``interval`` seconds; the rate counts the
prompts run in this session (not those a re-run skipped), over the time since the first was
submitted. Nothing is printed when the stream is not a terminal (a log file, a pipe, a test).
"""

from __future__ import annotations

import sys
import time


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    if minutes < 60:
        return f"{minutes:.0f} min"
    return f"{int(minutes // 60)} h {int(minutes % 60):02d} min"


class Progress:
    def __init__(self, total: int, skipped: int = 0, stream=None, interval: float = 0.25, clock=time.monotonic):
        self.stream = sys.stderr if stream is None else stream
        self.shown = bool(getattr(self.stream, "isatty", lambda: False)())
        self.total, self.skipped, self.done, self.failed = total, skipped, 0, 0
        self.interval, self.clock = interval, clock
        self.start = clock()
        self.last = None

    def line(self, now: float | None = None) -> str:
        elapsed = (self.clock() if now is None else now) - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = self.total - self.skipped - self.done
        eta = f"eta {duration(left / rate)}" if rate > 0 and left else ("eta …" if left else "done")
        failed = f" ({self.failed} failed)" if self.failed else ""
        return (f"sweep: {self.skipped + self.done}/{self.total} prompts{failed} · {rate:.3g} prompts/s · {eta}")

    def update(self, failed: bool = False) -> None:
        self.done += 1
        self.failed += bool(failed)
        now = self.clock()
        if self.shown and (self.last is None or now - self.last >= self.interval or self.done + self.skipped == self.total):
            self.last = now
            self.stream.write("\r" + self.line(now) + "\x1b[K")
            self.stream.flush()

    def close(self) -> None:
        if self.shown and self.last is not None:
            self.stream.write("\n")
            self.stream.flush()
