"""Writing an output file without ever damaging what is there: a temporary file, then a rename.

Every file refgpt writes (golden files, llm.c checkpoints and dumps, lens translators, figures, HF
checkpoints) goes through ``write_atomically(path, write)``:

- ``write(tmp)`` writes a temporary file beside the target (same directory, so same file system);
  only when it has finished is the temporary renamed onto the target (``os.replace``, atomic on
  POSIX). A write that fails — a full disk, an exception halfway — leaves the old file untouched
  and no partial file behind.
- A symbolic link is written *through*: the file it points to is replaced, the link stays.
- An existing target that is not a regular file (a directory, a device such as /dev/null, a pipe)
  is refused: replacing it with a regular file would destroy it (as root, a device node).
- A replaced file keeps its permission bits; a new one gets the umask's (the temporary is created
  by ``write`` like any file).
"""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path
from typing import Callable

from ..errors import RefGPTError, as_path


def write_atomically(path, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` to create a temporary file, then rename it onto ``path`` (see the module
    docstring). Returns ``path``. Problems are a ``RefGPTError`` naming ``path``."""
    path = as_path(path, "output path")
    target = Path(os.path.realpath(path))  # through every symbolic link; the links stay
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode) if _existing_regular_file(path, target) else None
    except OSError as error:
        raise RefGPTError(f"{str(path)!r}: cannot write ({error.strerror})") from None
    if not target.parent.is_dir():
        raise RefGPTError(f"{str(path)!r}: cannot write: directory {str(target.parent)!r} does not exist")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        raise RefGPTError(f"{str(path)!r}: cannot write ({error.strerror or error})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _existing_regular_file(path: Path, target: Path) -> bool:
    """Does ``target`` exist? It must then be a regular file."""
    try:
        info = os.stat(target)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a device, pipe or socket)"
        via = f" (a link to {str(target)!r})" if target != Path(os.path.abspath(path)) else ""
        raise RefGPTError(f"{str(path)!r}{via}: will not overwrite it: it is {kind}")
    return True
