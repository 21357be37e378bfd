"""How hard the fuzz tests push: modest in CI, more with REFGPT_FUZZ=long (see CONTRIBUTING.md)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

LONG = os.environ.get("REFGPT_FUZZ", "") == "long"


def fuzz_settings(ci_examples: int, long_examples: int | None = None):
    """hypothesis settings: ``ci_examples`` cases by default, ``long_examples`` (20×) with REFGPT_FUZZ=long."""
    return settings(
        max_examples=(long_examples or 20 * ci_examples) if LONG else ci_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                               HealthCheck.data_too_large],
        derandomize=not LONG,  # CI runs the same cases every time; the long mode explores
    )


def refused_cleanly(action) -> str:
    """Run ``action()``: "accepted", or "refused" with a one-line RefGPTError. Any other exception
    (a traceback from deep inside) propagates and fails the test."""
    from refgpt import RefGPTError

    try:
        action()
    except RefGPTError as error:
        assert "\n" not in str(error), f"a two-line error: {error!r}"
        return "refused"
    return "accepted"


def json_values():
    """Any JSON value a hostile file might hold where another was expected."""
    from hypothesis import strategies as st

    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0, -1, 2**31, 2**63, 2**64, 10**30]),
        st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([1e-320, 1e308, -0.0, 0.5]),
        st.text(max_size=5), st.sampled_from(["gpt2", "gelu", "", "model.safetensors", "../x"]))
    return st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                        max_leaves=5)


def text_mutation(draw, text: str) -> str:
    """One byte-level edit of ``text``: truncate, delete, insert, duplicate a line, nest deeply."""
    from hypothesis import strategies as st

    kind = draw(st.sampled_from(["truncate", "delete", "insert", "duplicate_line", "nest", "nan", "bigint"]))
    i = draw(st.integers(0, max(0, len(text) - 1)))
    if kind == "truncate":
        return text[:i]
    if kind == "delete":
        return text[:i] + text[i + draw(st.integers(1, 8)):]
    if kind == "insert":
        return text[:i] + draw(st.sampled_from(['"', "{", "}", "[", ",", ":", "\\", "\x00", "\n", "é", "\udcff"[:0] + "\ufffd", " 1", "NaN", "-"])) + text[i:]
    if kind == "duplicate_line":
        lines = text.split("\n")
        j = draw(st.integers(0, len(lines) - 1))
        return "\n".join(lines[: j + 1] + lines[j:])
    if kind == "nest":
        return "[" * 50_000 + "]" * 50_000
    if kind == "nan":
        return text.replace("1", "NaN", 1)
    return text.replace("1", "9" * 5000, 1)


def socket_file(path):
    """A non-regular file that is safe to aim writes at: a Unix socket (opening it fails at once,
    and replacing it harms nothing). Tests never aim at /dev/null: code that replaced it would
    break the machine, as old refgpt did when run as root."""
    import socket

    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()
    return path


# ---- values at the edges, for arguments (issue 24) --------------------------------------------------

#: Integers where representations break: 8/16/32/64-bit limits, both signs, and beyond 64 bits.
EDGE_INTEGERS = (0, 1, 2, 3, -1, -2, 127, 128, 255, 256, 2**15, 2**16, 2**31 - 1, 2**31, -(2**31), 2**32,
                 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 10**30)


def edge_numbers():
    """A number (or a thing standing where a number belongs) at a representation's edge: an edge
    integer as a Python int, as every NumPy integer type that holds it, as a bool, as a float (whole
    or not), as a string; or None, NaN, ±∞, a complex number, a Fraction, a list."""
    import fractions

    import numpy as np
    from hypothesis import strategies as st

    def as_types(n):
        kinds = [n, float(n), float(n) + 0.5, str(n), fractions.Fraction(n, 1), [n]]
        for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64):
            info = np.iinfo(t)
            if info.min <= n <= info.max:
                kinds.append(t(n))
        if abs(n) < 2**24:
            kinds.append(np.float32(n))
        return st.sampled_from(kinds)

    odd = st.sampled_from([None, True, False, np.True_, float("nan"), float("inf"), float("-inf"), 1.5, -0.5,
                           complex(1, 0), "1", "", b"1", (), np.array(3), np.array([1, 2])])
    return st.one_of(st.sampled_from(EDGE_INTEGERS).flatmap(as_types), odd)


def edge_integer_arrays(max_side: int = 4):
    """An array of token ids or positions at the edges: every integer dtype (uint64 ≥ 2⁶³ included),
    bools, floats (whole or not), 0-d, empty, ragged lists, object arrays."""
    import numpy as np
    from hypothesis import strategies as st

    dtypes = st.sampled_from(["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                              "bool", "float32", "float64", "object"])

    def build(args):
        dtype, shape, values = args
        n = int(np.prod(shape))
        values = (values * n)[:n] if values else []
        array = np.array(values, dtype=object).reshape(shape) if n else np.zeros(shape, dtype=object)
        try:
            return array.astype(dtype) if dtype != "object" else array
        except (OverflowError, ValueError, TypeError):
            return array.astype(object)

    shapes = st.lists(st.integers(0, max_side), min_size=0, max_size=3).map(tuple)
    values = st.lists(st.sampled_from(EDGE_INTEGERS + (0.5, 1.0, -3.25)), min_size=1, max_size=6)
    arrays = st.tuples(dtypes, shapes, values).map(build)
    ragged = st.sampled_from([[[1, 2], [3]], [1, [2]], [[1], [2**64]], [2**70], "12", [None], [[]]])
    return st.one_of(arrays, ragged)
