"""A linear layer, x·W + b: the operation most of GPT-2's time is spent in.

Written as a matrix product and then an in-place bias add, so that the [pos, out] result is
made once and passed over once more, rather than allocated twice (x·W, then x·W + b): at
[1024, 3072] in float64 that second array is 25 MB per MLP.
"""

from __future__ import annotations


def affine(x, W, b):
    """x·W + b for x [..., in], W [in, out], b [out] → [..., out]."""
    out = x @ W  # [..., out]
    out += b  # [..., out]
    return out
