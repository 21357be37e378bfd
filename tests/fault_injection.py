"""Crash-consistency testing for refgpt's writers, as storage is tested (SQLite's crash tests, ALICE):
a writer killed before each of its file-system events, a file system that fails at each byte.

Every case runs the writer in a **forked child** (the parent has imported refgpt and built the
models once, so a case costs milliseconds) and looks at the directory afterwards:

- ``count_events(action, root)``: how many file-system events the writer makes under ``root``. An
  event is a call that changes or syncs the file system: an audited one (``sys.addaudithook``:
  ``open`` for writing, ``os.rename``/``replace``, ``os.remove``, ``os.mkdir``, ``os.rmdir``,
  ``os.symlink``, ``os.link``, ``os.truncate``, ``os.chmod``, ``os.chown``, ``shutil.*``, and
  refgpt's two ctypes calls, renameat2's exchange and fallocate) or a write (``sys.setprofile``,
  from the first open for writing on: the ``write``,
  ``truncate``, ``flush`` and ``close`` methods of a file under ``root``, ``os.fsync``,
  ``os.ftruncate``).
- ``run_killed(action, root, n)``: the child kills itself (SIGKILL) just before its ``n``-th event.
- ``run_with_file_size_limit(action, limit)``: the child runs under ``RLIMIT_FSIZE = limit``: the
  write that would grow a file past ``limit`` bytes fails with EFBIG (``kill=True``: the kernel kills
  the child there, with SIGXFSZ) — a full disk, or a kill, at any byte, without root.

``REFGPT_FAULTS=long`` runs every event and many more byte limits; the default (CI) runs a sample.
"""

from __future__ import annotations

import os
import pickle
import resource
import signal
import sys
import traceback
from pathlib import Path

LONG = os.environ.get("REFGPT_FAULTS", "") == "long"

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_AUDITED = {"os.rename", "os.remove", "os.mkdir", "os.rmdir", "os.symlink", "os.link", "os.truncate", "os.chmod",
            "os.chown", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.copytree", "shutil.move"}
_WRITING = {"write", "writelines", "truncate", "flush", "close", "fsync", "ftruncate", "fdatasync"}


def _under(path, root: str) -> bool:
    if isinstance(path, int):
        try:
            path = os.readlink(f"/proc/self/fd/{path}")
        except OSError:
            return False
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    return isinstance(path, (str, os.PathLike)) and os.path.abspath(os.fspath(path)).startswith(root)


class _Events:
    """Counts file-system events under ``root``; calls ``at(n)`` just before the n-th (1-based)."""

    def __init__(self, root, at=None):
        self.root, self.at, self.n, self.log = os.path.realpath(root) + os.sep, at, 0, []
        self.active = True

    def event(self, what):
        if not self.active:
            return
        self.n += 1
        self.log.append(what)
        if self.at is not None:
            self.at(self.n)

    def audit(self, name, args):
        if not self.active:
            return
        if name == "open":
            path, mode, flags = (tuple(args) + (None, None))[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writing and _under(path, self.root):
                self.event(f"open {os.path.basename(os.fspath(path)) if not isinstance(path, int) else path}")
                if sys.getprofile() is None:  # writes come after an open: profile from here on (it is slow)
                    sys.setprofile(self.profile)
        elif name in _AUDITED:
            if args and _under(args[0], self.root):
                self.event(name)

    def profile(self, frame, kind, arg):
        if kind != "c_call" or not self.active:
            return
        name = getattr(arg, "__name__", "")
        if name not in _WRITING:
            return
        owner = getattr(arg, "__self__", None)
        if getattr(owner, "__name__", None) in ("posix", "os"):  # os.fsync(fd) etc.: the fd is not seen here
            if name in ("fsync", "ftruncate", "fdatasync"):
                self.event(f"os.{name}")
            return
        path = getattr(owner, "name", None)
        if path is not None and _under(path, self.root) and not getattr(owner, "closed", False):
            self.event(f"{type(owner).__name__}.{name}")


def _install(events: _Events):
    sys.addaudithook(events.audit)
    # renameat2 (the directory exchange) and fallocate are ctypes calls, which no audit event sees
    import refgpt.files.atomic_write as atomic_write
    import refgpt.files.safetensors_file as safetensors_file

    def counted(function, what):
        def call(*args, **kwargs):
            events.event(what)
            return function(*args, **kwargs)
        return call

    atomic_write._exchange = counted(atomic_write._exchange, "renameat2")
    safetensors_file.reserve = counted(safetensors_file.reserve, "fallocate")


def _child(run, pipe_w) -> None:
    """In the forked child: run, report the outcome through the pipe, and leave without cleanup."""
    code = 0
    try:
        outcome = run()
    except BaseException as error:  # noqa: BLE001 — everything is reported to the parent
        from refgpt import RefGPTError

        kind = "refgpt" if isinstance(error, RefGPTError) else "other"
        outcome = (kind, f"{type(error).__name__}: {error}", traceback.format_exc(limit=-4))
    try:
        sys.setprofile(None)
        os.write(pipe_w, pickle.dumps(outcome))
    except BaseException:  # noqa: BLE001
        code = 3
    os._exit(code)


def in_child(run, timeout: float = 120.0):
    """Run ``run()`` in a forked child; (outcome or None, how it ended: "exit" or the signal's name)."""
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        _child(run, w)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    ended = signal.Signals(os.WTERMSIG(status)).name if os.WIFSIGNALED(status) else "exit"
    return (pickle.loads(data) if data else None), ended


def count_events(action, root) -> tuple[int, list[str]]:
    """How many file-system events ``action()`` makes under ``root`` (run in a child), and which."""
    def run():
        events = _Events(root)
        _install(events)
        try:
            action()
        finally:
            events.active = False
        return ("counted", events.n, events.log)

    outcome, ended = in_child(run)
    assert ended == "exit" and outcome and outcome[0] == "counted", (ended, outcome)
    return outcome[1], outcome[2]


def run_killed(action, root, n: int):
    """Run ``action()`` in a child that SIGKILLs itself just before its ``n``-th event under ``root``.
    Returns "killed", or the outcome when it finished first (("ok", …), ("refgpt", message, tb), …)."""
    def die(k):
        if k == n:
            os.kill(os.getpid(), signal.SIGKILL)

    def run():
        _install(_Events(root, die))
        action()
        return ("ok", None, None)

    outcome, ended = in_child(run)
    return "killed" if ended == "SIGKILL" else outcome


def run_with_file_size_limit(action, limit: int, kill: bool = False):
    """Run ``action()`` in a child whose files cannot grow past ``limit`` bytes: EFBIG there, as a
    full disk fails a write (or, with ``kill``, SIGXFSZ: the kernel ends the child at that byte).
    Returns the outcome, or "killed"."""
    def run():
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXFSZ dumps core by default: not here
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL if kill else signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        action()
        return ("ok", None, None)

    outcome, ended = in_child(run)
    return "killed" if ended in ("SIGXFSZ", "SIGKILL") else outcome


def sample(n: int, k: int) -> list[int]:
    """Event numbers 1..n to kill at: all of them with REFGPT_FAULTS=long, else ``k`` spread evenly
    (the first and the last always among them)."""
    if LONG or n <= k:
        return list(range(1, n + 1))
    return sorted({1, n, *(1 + round(i * (n - 1) / (k - 1)) for i in range(k))})


def byte_limits(size: int, k: int) -> list[int]:
    """File-size limits to fail at: 0, the edges of an 8-byte length and of llm.c's 1024-byte
    header, and ``k`` spread over ``size`` (long: every edge, and 8× as many spread)."""
    k = 8 * k if LONG else k
    edges = {0, 1, 7, 8, 9, 1023, 1024, 1025} if LONG else {0, 8, 1024}
    return sorted({limit for limit in edges | {round(i * size / k) for i in range(1, k)} if limit < size})


def listing(directory: Path) -> list[str]:
    """Every entry under ``directory``, relative, sorted (a directory's name ends in /)."""
    out = []
    for path in sorted(Path(directory).rglob("*")):
        out.append(str(path.relative_to(directory)) + ("/" if path.is_dir() and not path.is_symlink() else ""))
    return out
