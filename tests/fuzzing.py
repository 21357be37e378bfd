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
