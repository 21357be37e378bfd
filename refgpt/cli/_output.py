"""Where the refgpt command's answers go: standard output, checked, in any encoding.

- **Any encoding.** A character the output's encoding cannot hold (a Latin-1 or ASCII terminal,
  ``PYTHONIOENCODING=ascii``) is never an error: refgpt's own signs fall back to their ASCII
  spelling (``−`` → ``-``, ``≤`` → ``<=``, ``Σ`` → ``sum``, …), anything else to a backslash escape
  (``\\u00e9``), and ``--json`` output to JSON's own ``\\u00e9`` escape, so the JSON means the
  same. Text that is data — a token, the TEXT argument, generated text — is escaped by
  :func:`shown`/:func:`escaped` before it is printed, never spelled in ASCII: the token ``−`` must
  not be shown as ``-``.
- **A closed standard output** (``refgpt … >&-``) is an error before any work is done, and a
  standard output that fails while the answer is written (a full disk, EIO) is an error too: one
  line on stderr, exit status 1. Output is never lost with status 0. A reader that left on purpose
  (``refgpt inspect … | head``: EPIPE) is not an error: status 0, as before.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import sys

from ..errors import RefGPTError

#: refgpt's own signs and their ASCII spelling, for an output that cannot encode them.
ASCII_SPELLING = {
    "−": "-", "–": "-", "—": "--", "≤": "<=", "≥": ">=", "≠": "!=", "≈": "~", "±": "+-", "×": "x", "·": "*",
    "…": "...", "Σ": "sum", "Δ": "delta", "√": "sqrt", "∞": "inf", "∂": "d", "ε": "eps", "σ": "sigma", "μ": "mu",
    "λ": "lambda", "π": "pi", "ℓ": "l", "∈": " in ", "⊙": "(*)", "→": "->", "←": "<-", "↔": "<->", "‖": "||",
    "ᵀ": "^T", "⁻": "^-", "⁰": "^0", "¹": "^1", "²": "^2", "³": "^3", "⁴": "^4", "⁵": "^5", "⁶": "^6", "⁷": "^7",
    "⁸": "^8", "⁹": "^9", "₀": "_0", "₁": "_1", "₂": "_2", "‘": "'", "’": "'", "“": '"', "”": '"', "✓": "ok",
    "✗": "x", "␣": "_", "⏎": "\\n", "█": "#", "▏": "|", "•": "*", "°": " deg",
}


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _ascii_fallback(error: UnicodeEncodeError):
    chunk = error.object[error.start:error.end]
    return "".join(ASCII_SPELLING.get(ch) or _escape(ch) for ch in chunk), error.end


def _json_fallback(error: UnicodeEncodeError):
    out = []
    for ch in error.object[error.start:error.end]:
        code = ord(ch)
        if code >= 0x10000:  # a surrogate pair, as JSON spells characters beyond the BMP
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{code:04x}")
    return "".join(out), error.end


codecs.register_error("refgpt-ascii", _ascii_fallback)
codecs.register_error("refgpt-json", _json_fallback)


def _encoding() -> str:
    return getattr(sys.stdout, "encoding", None) or "utf-8"


def shown(text: str) -> str:
    """``repr(text)`` as tables show data, or ``ascii(text)`` when the output cannot encode it."""
    return repr(text) if _encodable(repr(text)) else ascii(text)


def escaped(text: str) -> str:
    """``text`` as it is, with the characters the output cannot encode as backslash escapes."""
    if _encodable(text):
        return text
    return "".join(ch if _encodable(ch) else _escape(ch) for ch in text)


def _encodable(text: str) -> bool:
    try:
        text.encode(_encoding())
    except (UnicodeEncodeError, LookupError):
        return False
    return True


class StdoutError(OSError):
    """Standard output failed while the answer was written (not a reader that left: EPIPE)."""


class _Checked(io.TextIOBase):
    """sys.stdout as the command writes it: each failure to write is a StdoutError."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        return self._call(self._stream.write, text)

    def flush(self):
        return self._call(self._stream.flush)

    def _call(self, method, *args):
        try:
            return method(*args)
        except BrokenPipeError:
            raise
        except OSError as error:
            raise StdoutError(error.errno, error.strerror or str(error)) from None

    def __getattr__(self, name):
        return getattr(self._stream, name)

    @property
    def encoding(self):
        return getattr(self._stream, "encoding", None)

    def isatty(self):
        return self._stream.isatty()

    def fileno(self):
        return self._stream.fileno()

    def writable(self):
        return True

    def close(self):  # the real stream is not this wrapper's to close (nor to flush when collected)
        pass


@contextlib.contextmanager
def checked_streams():
    """For one run of the command: refuse a closed stdout, write stdout and stderr in any encoding
    (``set_json`` switches stdout to JSON escapes), turn a failing stdout into a StdoutError, and
    flush it before the status is decided. The streams are restored afterwards (tests run the
    command in-process)."""
    if sys.stdout is None:
        raise RefGPTError("standard output is closed, so the answer could not be printed (run without >&-)")
    original, errors = sys.stdout, {}
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and hasattr(stream, "reconfigure"):
            errors[name] = stream.errors
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="refgpt-ascii")
    sys.stdout = _Checked(original)
    try:
        yield
        sys.stdout.flush()
    except SystemExit:  # --help, --version: printed, and flushed here too
        sys.stdout.flush()
        raise
    finally:
        sys.stdout = original
        for name, value in errors.items():
            with contextlib.suppress(ValueError, OSError, AttributeError):
                getattr(sys, name).reconfigure(errors=value)


def set_json() -> None:
    """The answer is JSON: characters stdout cannot encode become JSON escapes."""
    stream = getattr(sys.stdout, "_stream", sys.stdout)
    if hasattr(stream, "reconfigure"):
        with contextlib.suppress(ValueError, OSError):
            stream.reconfigure(errors="refgpt-json")


def forget_unwritten_output() -> None:
    """After stdout failed: point it at /dev/null, so the interpreter's last flush at exit cannot
    fail again (and print a second message)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
