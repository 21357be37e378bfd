"""A linear layer, x·W + b: the operation most of GPT-2's time is spent in.

Written as a matrix product and then an in-place bias add, so that the [pos, out] result is
made once and passed over once more (by blocks of rows on the BLAS's threads, refgpt/threads.py),
rather than allocated twice (x·W, then x·W + b): at [1024, 3072] in float64 that second array is
25 MB per MLP.
"""

from __future__ import annotations

import numpy as np

from .. import threads


def affine(x, W, b, out=None):
    """x·W + b for x [..., in], W [in, out], b [out] → [..., out]; into ``out`` (C order, the
    result's shape and dtype) or a new array. The bias is added by blocks of rows on the threads."""
    out = np.matmul(x, W, out=out)  # [..., out]
    return threads.add(out, b, out=out)  # [..., out]
