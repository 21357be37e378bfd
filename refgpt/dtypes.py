"""The number formats refgpt computes in, and bfloat16, which NumPy has no dtype for.

refgpt computes in float64 (the default everywhere) or float32, end to end. Checkpoints, golden
files and llm.c files may also hold bfloat16: a bfloat16 is the top 16 bits of a float32 (same
sign and 8-bit exponent, 7 mantissa bits), so it widens to float32 exactly by a 16-bit shift, and a
float32 narrows to it by rounding away the low 16 bits.
"""

from __future__ import annotations

import numpy as np

from .errors import RefGPTError

#: The compute dtypes, by name.
COMPUTE_DTYPES = {"float64": np.dtype(np.float64), "float32": np.dtype(np.float32)}


#: np.longdouble where it is wider than float64 (80-bit x87 on x86-64 Linux): not a user's compute
#: dtype (no BLAS, ~100× slower), only the oracle's certificate (refgpt/oracle/certify.py).
EXTENDED_DTYPE = np.dtype(np.longdouble) if np.finfo(np.longdouble).nmant > np.finfo(np.float64).nmant else None


def compute_dtype(dtype) -> np.dtype:
    """'float64' (the default everywhere) or 'float32', also given as a NumPy dtype (or
    EXTENDED_DTYPE, given as that dtype, for the oracle's certificate)."""
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if EXTENDED_DTYPE is not None and not isinstance(dtype, str) and name == EXTENDED_DTYPE.name:
        return EXTENDED_DTYPE
    if name not in COMPUTE_DTYPES:
        raise RefGPTError(f"dtype must be 'float64' or 'float32', found {dtype!r}")
    return COMPUTE_DTYPES[name]


def widen_bfloat16(words) -> np.ndarray:
    """bfloat16 bits (uint16) → float32, exactly: a bfloat16 is a float32's top half."""
    return (np.asarray(words, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def round_to_bfloat16(x) -> np.ndarray:
    """float32 → bfloat16 bits (uint16), rounding to nearest, ties to even, as torch does."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)  # [...]
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))  # [...]
    return (rounded >> np.uint32(16)).astype(np.uint16)  # [...]
