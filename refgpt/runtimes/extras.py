"""A runtime is an optional extra: import it, or say in one line which extra to install."""

from __future__ import annotations

import importlib

from ..errors import RefGPTError


def require(module: str, extra: str, what: str):
    """``import module``, or a RefGPTError naming ``extra`` (``pip install 'refgpt[extra]'``)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise RefGPTError(f"{what} needs the {extra} extra: pip install 'refgpt[{extra}]' "
                          f"({error.name or module} is not installed)") from None
