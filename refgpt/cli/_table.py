"""Aligned text tables for the subcommands' human-readable output.

    >>> print(table(["rank", "token"], [[1, "'a'"], [10, "' the'"]], align="><"))
    rank  token
       1  'a'
      10  ' the'
"""

from __future__ import annotations


def table(header: list[str], rows: list[list], align: str) -> str:
    """Columns padded to their widest cell, two spaces apart; ``align`` is one '<' or '>' per column."""
    cells = [list(map(str, header))] + [list(map(str, row)) for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(f"{cell:{a}{w}}" for cell, a, w in zip(row, align, widths)).rstrip() for row in cells]
    return "\n".join(lines)
