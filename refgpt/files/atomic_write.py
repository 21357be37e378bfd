"""Writing outputs without ever damaging what is there: new bytes beside the old, then one switch.

Every file refgpt writes (golden files, llm.c checkpoints and dumps, lens translators, figures, HF
cache refs) goes through :class:`AtomicFile` (``write_atomically(path, write)`` is its short form),
and every directory (``refgpt.save``'s checkpoint) through :func:`write_directory_atomically`:

- The new bytes go to a **temporary** beside the target (same directory, so the same file system),
  named ``.NAME.refgpt-tmp-0123456789ab`` (``-save-`` for a directory). Only when it is complete
  and on disk (``fsync``) is it switched onto the target: ``rename(2)`` for a file,
  ``renameat2(RENAME_EXCHANGE)`` for a directory (both atomic). A kill at any moment leaves the old
  target or the new one, never a mix, and a failure (a full disk, an exception halfway, Ctrl-C)
  leaves the old one and removes the temporary, whichever step failed (``close`` included).
- **Leftovers never look valid and never pile up.** No refgpt reader opens a temporary's name
  (:func:`is_temporary`; a safetensors writer also keeps its header zero until the end). A writer
  holds an ``flock`` on its temporary while it works; the next writer to the same target removes
  every temporary of its kind whose lock is free — a killed writer's — and never a live one.
- **Names.** Errors name the target as the caller gave it, never the temporary. A target name of
  up to NAME_MAX bytes always works: a temporary that would be longer is named by the target's
  first bytes and a hash of the whole name.
- A symbolic link is written *through*: the file (or directory) it points to is replaced, the link
  stays. An existing target that is not a regular file (a directory, a device such as /dev/null, a
  pipe) is refused: replacing it would destroy it (as root, a device node).
- A replaced file keeps its permission bits; a new one gets the umask's.

A directory switch needs ``RENAME_EXCHANGE`` (Linux ≥ 3.15 on ext4, xfs, btrfs, tmpfs, …). Where the
file system lacks it (NFS, macOS), the old directory is renamed aside and the new one into place:
a kill between the two leaves both whole, the old one as ``.NAME.refgpt-old-…``, which
``refgpt.load`` of NAME then points to.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import re
import secrets
import shutil
import stat
from pathlib import Path
from typing import Callable

from ..errors import RefGPTError, as_path

#: The kinds of temporary: a file being written, a directory being written, an old directory
#: renamed aside (only where the file system cannot exchange two directories).
KINDS = ("tmp", "save", "old")
_TEMPORARY = re.compile(r"\..+\.refgpt-(?:tmp|save|old)-[0-9a-f]{12}", re.DOTALL)
_SUFFIX_BYTES = len(".refgpt-save-") + 12  # the longest suffix a temporary's name gets


def is_temporary(path) -> bool:
    """Is ``path`` (or a directory above it) one of refgpt's temporaries? Readers refuse those."""
    return any(_TEMPORARY.fullmatch(part) for part in Path(path).parts)


def refuse_temporary(path) -> None:
    """A RefGPTError if ``path`` is a temporary: an unfinished (or never switched) write."""
    if is_temporary(path):
        raise RefGPTError(f"{path}: a temporary file of a refgpt writer that never finished (killed, or "
                          "out of disk); it is not a result, and the next write of the same output removes it")


def temporary_path(target: Path, kind: str) -> Path:
    """A fresh temporary's path for ``target``: ``.NAME.refgpt-KIND-<12 hex digits>`` beside it."""
    return target.with_name(f"{_prefix(target, kind)}{secrets.token_hex(6)}")


def _prefix(target: Path, kind: str) -> str:
    """``.NAME.refgpt-KIND-``, with NAME shortened (its first bytes, "~", 8 hex digits of its hash)
    when the temporary's name would not fit in NAME_MAX bytes."""
    name = target.name
    try:
        name_max = os.pathconf(target.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    if len(os.fsencode(name)) + 1 + _SUFFIX_BYTES <= name_max:
        return f".{name}.refgpt-{kind}-"
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:8]
    room = max(1, name_max - 1 - _SUFFIX_BYTES - 9)
    start = os.fsencode(name)[:room].decode("utf-8", errors="ignore") or "x"
    while len(os.fsencode(start)) > room:  # a name that is not UTF-8 (surrogate escapes)
        start = start[:-1]
    return f".{start}~{digest}.refgpt-{kind}-"


@contextlib.contextmanager
def _directory_lock(directory: Path, shared: bool):
    """A flock on the directory itself: writers hold it shared while they create and lock a
    temporary (two steps), a cleaner exclusively while it looks for stale ones, so that a cleaner
    never takes a temporary made a moment ago, and not yet locked, for a killed writer's. Best
    effort: where a directory cannot be locked, nothing is held. A staging directory (a temporary
    itself, private to its writer, and flocked by it) needs no such lock and gets none."""
    if is_temporary(directory):
        yield
        return
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def remove_stale(target: Path, kinds=KINDS) -> None:
    """Remove every temporary of ``target`` of these kinds that no live writer holds (its flock is
    free: the writer was killed, or its machine lost power). Best effort: a read-only directory
    keeps its leftovers, and says nothing."""
    with _directory_lock(target.parent, shared=False):
        _remove_stale(target, kinds)


def _remove_stale(target: Path, kinds) -> None:
    prefixes = tuple(_prefix(target, kind) for kind in kinds)
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return
    for entry in entries:
        if not (entry.name.startswith(prefixes) and _TEMPORARY.fullmatch(entry.name)):
            continue
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_DIRECTORY if is_dir else 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live writer's
            os.close(fd)
            continue
        try:
            if is_dir:
                _remove_tree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            pass
        finally:
            os.close(fd)


def _remove_tree(path) -> None:
    """``rm -r``, quietly (another writer may be removing the same leftover)."""
    shutil.rmtree(path, onerror=lambda *args: None)


def _locked(path: Path, flags: int, mode: int = 0o666) -> int:
    """Open ``path`` and take an exclusive flock on it: this writer is alive while it holds it."""
    fd = os.open(path, flags | os.O_CLOEXEC, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def cannot_write(path, error: BaseException, what: str = "cannot write") -> RefGPTError:
    """The one-line error for an OSError while writing ``path``: its reason, never the temporary's name."""
    reason = getattr(error, "strerror", None) or (str(error.args[0]) if error.args else type(error).__name__)
    return RefGPTError(f"{str(path)!r}: {what} ({reason})")


def _fsync_directory(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (a file system that cannot fsync a directory is let be)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def reserve(fd: int, size: int) -> None:
    """Ask the file system for ``size`` bytes of ``fd`` now (Linux fallocate), so that a full disk is
    an error before the work, not after it. Where it cannot (no fallocate), nothing happens."""
    if size <= 0 or _LIBC is None or not hasattr(_LIBC, "fallocate64"):
        return
    if _LIBC.fallocate64(fd, 0, ctypes.c_int64(0), ctypes.c_int64(size)) != 0:
        code = ctypes.get_errno()
        if code in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise OSError(code, os.strerror(code))


class AtomicFile:
    """A file written under a temporary name beside ``path`` and renamed onto it by :meth:`commit`.

        out = AtomicFile("golden.safetensors")     # checks the target, creates the locked temporary
        write everything to out.tmp ...
        out.commit()                                # fsync, rename onto the target (or out.abort())

    Problems are RefGPTErrors naming ``path`` as given (see the module docstring)."""

    def __init__(self, path, what: str = "output path"):
        self.path = as_path(path, what)
        self.target = Path(os.path.realpath(self.path))  # through every symbolic link; the links stay
        try:
            self._mode = stat.S_IMODE(os.stat(self.target).st_mode) if _existing_regular_file(self.path, self.target) else None
        except OSError as error:
            raise cannot_write(self.path, error) from error
        if not self.target.parent.is_dir():
            raise RefGPTError(f"{str(self.path)!r}: cannot write: directory {str(self.target.parent)!r} does not exist")
        remove_stale(self.target, ("tmp",))
        self.tmp = temporary_path(self.target, "tmp")
        try:
            with _directory_lock(self.target.parent, shared=True):
                self._fd = _locked(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except OSError as error:
            raise cannot_write(self.path, error) from error
        self.done = False

    def commit(self) -> Path:
        """Make the temporary the target: its mode, fsync, rename, fsync the directory."""
        try:
            if self._mode is not None:
                os.chmod(self.tmp, self._mode)
            os.fsync(self._fd)
            os.replace(self.tmp, self.target)
            self.done = True
            _fsync_directory(self.target.parent)
        except OSError as error:
            self.abort()
            raise cannot_write(self.path, error) from error
        finally:
            self._close()
        return self.path

    def abort(self) -> None:
        """Give up: remove the temporary. Never raises (the first error is the one to report)."""
        if not self.done:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
        self.done = True
        self._close()

    def _close(self):
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.commit()
        else:
            self.abort()
        return False


def write_atomically(path, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` to fill a temporary file, then switch it onto ``path`` (see the module
    docstring). Returns ``path``. An OSError anywhere is a RefGPTError naming ``path``; any other
    exception propagates, and the temporary is removed in every case."""
    out = AtomicFile(path)
    try:
        write(out.tmp)
    except OSError as error:
        out.abort()
        raise cannot_write(out.path, error) from error
    except BaseException:
        out.abort()
        raise
    return out.commit()


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


# ---- directories ----------------------------------------------------------------------------------


def write_directory_atomically(path, write: Callable[[Path], object], owned: Callable[[str], bool],
                               what: str = "save") -> Path:
    """Write a directory as one unit: ``write(staging)`` fills a fresh directory beside ``path``,
    which then takes ``path``'s place in one exchange (see the module docstring).

    The old directory's entries that ``owned(name)`` does not claim (a README, a training log) are
    carried over first, as hard links (copies where a link is refused), so only the writer's own
    files change. ``path`` is created (with its parents) if absent. Refused: a target that is a
    file, or that holds the current working directory (which would be left in the removed old
    directory)."""
    path = as_path(path, f"{what}: directory")
    shown = f"{what}: {str(path)!r}"
    target = Path(os.path.realpath(path))
    if path.is_symlink() and not target.exists():
        raise RefGPTError(f"{shown}: exists and is not a directory (a link to nowhere)")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        reason = os.strerror(errno.ENOTDIR) if isinstance(error, FileExistsError) else error.strerror or error
        raise RefGPTError(f"{shown}: cannot make the directory {str(target.parent)!r} ({reason})") from error
    if target.exists() and not target.is_dir():
        raise RefGPTError(f"{shown}: exists and is not a directory")
    if not target.parent.is_dir():
        raise RefGPTError(f"{shown}: {str(target.parent)!r} is not a directory")
    with contextlib.suppress(OSError):
        cwd = Path(os.getcwd())
        if cwd == target or target in cwd.parents:
            raise RefGPTError(f"{shown}: it holds the current working directory, which replacing it as a whole "
                              "would leave behind; save into a directory of its own, or change directory first")
    remove_stale(target, ("save", "old"))
    staging = temporary_path(target, "save")
    try:
        with _directory_lock(target.parent, shared=True):
            os.mkdir(staging)
            fd = _locked(staging, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.rmdir(staging)
        raise RefGPTError(f"{what}: {cannot_write(path, error)}") from error
    switched = False
    try:
        if target.is_dir():
            info = os.stat(target)
            os.chmod(staging, stat.S_IMODE(info.st_mode))
            if os.geteuid() == 0 and (info.st_uid, info.st_gid) != (0, 0):
                os.chown(staging, info.st_uid, info.st_gid)
            _carry_over(target, staging, owned)
        write(staging)
        for entry in os.scandir(staging):  # every file on disk before the switch
            if entry.is_file(follow_symlinks=False):
                _fsync_file(entry.path)
        _fsync_directory(staging)
        old = _switch(staging, target)
        switched = True
        _fsync_directory(target.parent)
        if old is not None:
            _remove_tree(old)
    except OSError as error:
        if not switched:
            _remove_tree(staging)
        raise RefGPTError(f"{what}: {cannot_write(path, error)}") from error
    except BaseException:
        if not switched:
            _remove_tree(staging)
        raise
    finally:
        os.close(fd)
    return path


def _fsync_file(path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _carry_over(old: Path, new: Path, owned: Callable[[str], bool]) -> None:
    """Hard-link (or copy) every entry of ``old`` that the writer does not own into ``new``."""
    for entry in os.scandir(old):
        if owned(entry.name) or is_temporary(entry.name):
            continue
        destination = new / entry.name
        if entry.is_dir(follow_symlinks=False):
            shutil.copytree(entry.path, destination, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry.path, destination)


def _link_or_copy(source, destination) -> None:
    if os.path.islink(source):
        os.symlink(os.readlink(source), destination)
        return
    try:
        os.link(source, destination, follow_symlinks=False)
    except OSError:  # another file system, or links refused (fs.protected_hardlinks)
        shutil.copy2(source, destination, follow_symlinks=False)


def _switch(staging: Path, target: Path) -> Path | None:
    """Put ``staging`` at ``target``: exchanged with the old directory in one step where the file
    system can (the old one is then at ``staging``), else renamed into place (the old one renamed
    aside first). Returns where the old directory now is, or None if there was none."""
    while True:
        if not target.exists():
            try:
                os.rename(staging, target)
                return None
            except OSError as error:
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                continue  # another writer made it first: exchange with theirs
        code = _exchange(staging, target)
        if code == 0:
            return staging
        if code == errno.ENOENT:
            continue  # the target went away meanwhile
        if code not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, -1):
            raise OSError(code, os.strerror(code))
        old = temporary_path(target, "old")  # no exchange here: rename aside, then into place
        os.rename(target, old)
        os.rename(staging, target)
        return old


def _load_libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(a: Path, b: Path) -> int:
    """Swap two directories atomically (renameat2 RENAME_EXCHANGE): 0, an errno, or -1 if unavailable."""
    if _LIBC is None or not hasattr(_LIBC, "renameat2"):
        return -1
    if _LIBC.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return 0
    return ctypes.get_errno()


def old_directory_left(target: Path) -> Path | None:
    """Where an interrupted directory switch without exchange left ``target``'s old directory, if anywhere."""
    target = Path(os.path.realpath(target))
    prefix = _prefix(target, "old")
    with contextlib.suppress(OSError):
        for entry in os.scandir(target.parent):
            if entry.name.startswith(prefix) and _TEMPORARY.fullmatch(entry.name):
                return Path(entry.path)
    return None
