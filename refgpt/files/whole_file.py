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
    except FileNotFoundError:
        raise RefGPTError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise RefGPTError(f"{path}: is a directory, not a {what}") from None
    except OSError as error:
        raise RefGPTError(f"{path}: cannot read {what} ({error.strerror or error})") from None


__all__ = ["read_bytes"]
