"""Progress on stderr for long work: shown when stderr is a terminal, silent otherwise.

``--progress`` shows it anyway (into a log, a CI job), ``--quiet`` never. It is one line, rewritten
in place (``\\r``) at most five times a second and ended with a newline, so it never mixes with the
answer on stdout.
"""

from __future__ import annotations

import sys
import time


def add_arguments(p):
    """--progress / --quiet, for a subcommand whose work can take long."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--progress", action="store_true", help="show progress on stderr even when it is not a terminal")
    group.add_argument("--quiet", action="store_true", help="no progress on stderr, even on a terminal")


class Progress:
    """``progress(done, total)`` writes "refgpt WHAT: done/total (pct%), elapsed" to stderr when
    enabled; ``close()`` ends the line."""

    def __init__(self, what: str, enabled: bool, stream=None):
        self.what, self.enabled, self.stream = what, enabled, stream or sys.stderr
        self.start = self.last = time.monotonic()
        self.shown = False

    @classmethod
    def of(cls, args, what):
        enabled = getattr(args, "progress", False) or (not getattr(args, "quiet", False) and sys.stderr.isatty())
        return cls(what, enabled)

    def __call__(self, done, total):
        if not self.enabled:
            return
        now = time.monotonic()
        if done < total and now - self.last < 0.2 and self.shown:
            return
        self.last = now
        pct = 100 * done / total if total else 100.0
        self.stream.write(f"\rrefgpt {self.what}: {done}/{total} ({pct:.0f}%), {now - self.start:.1f} s")
        self.stream.flush()
        self.shown = True

    def stage(self, what):
        """Start a new stage of the work (a new line)."""
        self.close()
        self.what, self.start, self.shown = what, time.monotonic(), False

    def close(self):
        if self.enabled and self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False
