"""Reading a whole small file (a config, an index, a manifest, a prompts file, a torch zip) that fails closed.

One place maps the operating system's errors to a RefGPTError that names the file and what it was
meant to be: missing, a directory, or unreadable (permissions, I/O), with the system's reason.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import RefGPTError


def read_bytes(path, what: str) -> bytes:
    """The bytes of ``path``, or a RefGPTError: "PATH: WHAT not found", "PATH: is a directory, not
    a WHAT", "PATH: cannot read WHAT (reason)". ``what`` names the file's role, e.g. "prompts file"."""
    path = Path(path)
    try:
        return path.read_bytes()
    except OSError as error:
        raise refusal(path, what, error) from None


def refusal(path, what: str, error: OSError) -> RefGPTError:
    """The RefGPTError for ``error``, met opening or reading ``path`` (a WHAT), worded as above."""
    if isinstance(error, FileNotFoundError):
        return RefGPTError(f"{path}: {what} not found")
    if isinstance(error, IsADirectoryError):
        return RefGPTError(f"{path}: is a directory, not a {what}")
    return RefGPTError(f"{path}: cannot read {what} ({error.strerror or error})")


__all__ = ["read_bytes", "refusal"]
