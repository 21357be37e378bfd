"""GPT-2 by name: a directory, or a hub repository found in the HF cache or downloaded into it.

:func:`resolve` is what ``refgpt.load(NAME)`` and ``--model NAME`` do with a name that is not a
directory: ``gpt2``, ``openai-community/gpt2``, ``distilgpt2``, any ``owner/name`` GPT-2 repository,
optionally ``@revision`` (a branch, tag or commit). The HF cache is searched first, under both
spellings a renamed repository may have there (:mod:`refgpt.files.hf_cache`); a cached name never touches
the network. Otherwise it is downloaded, unless ``HF_HUB_OFFLINE=1``.

:func:`download` (``refgpt download NAME``) fetches ``config.json``, ``model.safetensors`` (or
``model.safetensors.index.json`` and its shards), ``vocab.json`` and ``merges.txt`` from
``$HF_ENDPOINT/{repo}/resolve/{revision}/{file}`` (default endpoint https://huggingface.co) into
the cache, exactly as huggingface_hub lays it out. For each file:

1. ``HEAD`` gives the commit (``X-Repo-Commit``), the file's ETag (``X-Linked-Etag`` for an LFS
   file, else ``ETag``) and its size (``X-Linked-Size``, else ``Content-Length``). Redirects on the
   hub's own host (renamed repositories: ``gpt2`` → ``openai-community/gpt2``) are followed; a
   redirect elsewhere (the LFS file store) is where the bytes will come from. The first file's
   commit pins every later request, so all files come from one commit even if ``main`` moves.
2. Under a lock per blob — ``.locks/models--owner--name/<etag>.lock``, the file huggingface_hub
   locks, so refgpt and huggingface_hub wait for each other too — ``GET`` writes a partial file of
   this process's own, ``blobs/<etag>.<12 hex digits>.incomplete``, itself locked while it grows.
   An interrupted download's bytes (``blobs/<etag>.incomplete``, or a killed process's partial) are
   taken over by renaming them, and ``Range: bytes=N-`` resumes them; a broken connection is retried
   twice, each time from where it stopped, and what is left is kept as ``blobs/<etag>.incomplete``
   for a later run to resume.
3. The bytes are checked against the ETag, which *is* the file's hash on the hub: the sha256 of an
   LFS file (64 hex digits), git's blob sha1 — sha1(b"blob <size>\\0" + bytes) — of any other (40).
   A mismatch removes the downloaded file and stops with one line.
4. Only then is the partial renamed to ``blobs/<etag>`` and linked as ``snapshots/<commit>/<file>``
   (an atomic rename each), and, after the last file, ``refs/<revision>`` is written. A blob is
   never written after it was verified: each process writes only its own partial, and the rename
   puts a whole, checked file in place, even where a file system ignores the lock.

Why a small client of refgpt's own (standard library only) rather than ``huggingface_hub``:

- *Weight*: refgpt's runtime needs numpy, safetensors and regex. huggingface_hub 2.x brings nine
  packages (httpx2, hf-xet, fsspec, filelock, tqdm, pyyaml, click, …, about 28 MB); this is two
  modules of standard-library Python, and ``import refgpt`` does not load even them
  (``refgpt.files.checkpoint`` imports this one only for a name that is not a directory).
- *Verification*: huggingface_hub names blobs by their ETag, but over plain HTTP it checks only a
  file's size (``http_get``; the Xet protocol checks its own chunk hashes). An oracle should check
  every byte it computes from: here each file is hashed against the hub's ETag.
- *Offline behaviour*: identical where it matters — ``HF_HUB_OFFLINE`` means no connection, and a
  name that is not cached is then one line naming the places looked. Unlike huggingface_hub, a
  cached name is used without first asking the hub whether ``main`` moved (``refgpt download``
  updates it), so a flaky network never slows or breaks a run from the cache.
- *Cache compatibility*: the layout is small and documented (:mod:`refgpt.files.hf_cache`); the tests
  check that huggingface_hub and transformers read what this writes, and that refgpt reads what
  they write. huggingface_hub 2.x no longer resumes a broken download; this does.

What it does not do: the Xet transfer protocol (the hub serves every file over plain HTTP too),
access tokens (GPT-2 checkpoints are public; a private or gated repository is an HTTP 401 error).
Two downloads of one name at once are safe: the second waits for the first's lock, then finds the
verified blob (tests/faults/test_hub_faults.py runs them side by side).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import http.client
import os
import re
import secrets
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urljoin, urlsplit

from ..errors import RefGPTError
from .hf_cache import (COMMIT, SHARD_INDEX, cache_dir, check_revision, find_snapshot, is_offline, link_into_snapshot,
                       missing_files, not_a_model_directory, parse_name, repo_folder, shard_names, write_ref)
from ..version import __version__

DEFAULT_ENDPOINT = "https://huggingface.co"
TIMEOUT = 30.0  # seconds a connection or a read may stall before the attempt counts as broken
ATTEMPTS = 3  # tries per file; each resumes where the previous one broke off
MAX_REDIRECTS = 10
CHUNK = 1 << 20  # bytes read per call
TOKENIZER_FILES = ("vocab.json", "merges.txt")
_ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # git blob sha1 | LFS sha256


def resolve(name) -> Path:
    """The checkpoint directory ``name`` means: itself if it is a directory, else the cached (or,
    unless offline, freshly downloaded) snapshot of the hub repository ``owner/name[@revision]``.
    A path that exists is always read here, never looked up on the hub: a file (``gpt2_124M.bin``,
    ``model.safetensors``) is refused, naming what is read."""
    directory = Path(name)
    if directory.is_dir():
        return directory
    if directory.exists() or directory.is_symlink():
        raise RefGPTError(not_a_model_directory(directory))
    parsed = parse_name(name) if isinstance(name, str) else None
    if parsed is None:
        raise RefGPTError(f"{directory}: model directory not found")
    repo_id, revision = parsed
    snapshot, looked = find_snapshot(repo_id, revision)
    if snapshot is not None:
        return snapshot
    where = f"not a directory, and not in the HF cache (looked in {'; '.join(looked)})"
    if is_offline():
        raise RefGPTError(f"{name}: {where}; HF_HUB_OFFLINE is set, so nothing was downloaded")
    try:
        return download(repo_id, revision)
    except RefGPTError as error:
        raise RefGPTError(f"{name}: {where}; downloading it failed: {error}") from None


@dataclass(frozen=True)
class RemoteFile:
    """What the hub's HEAD says about one file of a repository at one commit."""

    filename: str
    commit: str  # 40 hex digits
    etag: str  # sha256 (64 hex digits, LFS) or git blob sha1 (40): the blob's name and its hash
    size: int  # bytes
    url: str  # where GET finds the bytes (the LFS store after a redirect)


class _EntryNotFound(RefGPTError):
    """The repository and revision exist, the file does not (HTTP 404, X-Error-Code EntryNotFound)."""


class _Unreachable(RefGPTError):
    """No answer at all: the connection was refused, reset or timed out (no HTTP status)."""


class _Interrupted(Exception):
    """A transfer that broke off; the partial file stays and the next attempt resumes it."""


def download(repo_id: str, revision: str = "main", *, endpoint: str | None = None,
             cache: Path | None = None, progress: bool | None = None) -> Path:
    """Fetch a GPT-2 checkpoint into the HF cache; return its ``snapshots/<commit>`` directory.

    ``endpoint``: default ``$HF_ENDPOINT`` or https://huggingface.co. ``cache``: default the HF
    cache (:func:`refgpt.files.hf_cache.cache_dir`). ``progress``: a progress bar on stderr; default
    only when stderr is a terminal. Files already in the cache are hashed, not fetched again.
    """
    return download_files(repo_id, revision, endpoint=endpoint, cache=cache, progress=progress)[0]


def download_files(repo_id: str, revision: str = "main", *, endpoint: str | None = None, cache: Path | None = None,
                   progress: bool | None = None) -> tuple[Path, list[RemoteFile]]:
    """:func:`download`, returning the snapshot and what the hub said of each file fetched (and verified)."""
    if not isinstance(repo_id, str) or parse_name(repo_id) != (repo_id, "main"):
        raise RefGPTError(f"{repo_id!r}: not a hub repository id ([owner/]name)")
    check_revision(revision)
    if is_offline():
        raise RefGPTError(f"{repo_id}: HF_HUB_OFFLINE is set, and downloading needs the hub "
                          "(unset it; a cached model runs without it)")
    hub = _Hub(endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT, repo_id,
               sys.stderr.isatty() if progress is None else progress)
    folder = repo_folder(repo_id, cache or cache_dir())
    try:
        return _download_into(hub, folder, repo_id, revision)
    except OSError as error:  # the cache's disk: _Hub turns every network OSError into a RefGPTError
        raise RefGPTError(f"{repo_id}: cannot write the HF cache: {error.filename}: {error.strerror or error}") from None


def _download_into(hub: _Hub, folder: Path, repo_id: str, revision: str) -> tuple[Path, list[RemoteFile]]:
    config = hub.head(revision, "config.json")
    commit = config.commit  # every later file comes from this commit, even if the revision moves
    files = []

    def fetch(remote: RemoteFile) -> Path:
        if remote.commit != commit:
            raise RefGPTError(f"{repo_id}: {remote.filename} came from commit {remote.commit}, "
                              f"config.json from {commit}")
        files.append(remote)
        return hub.fetch(folder, remote)

    fetch(config)
    try:
        weights = hub.head(commit, "model.safetensors")
    except _EntryNotFound:  # a sharded checkpoint
        index = fetch(hub.head(commit, SHARD_INDEX))
        for shard in shard_names(index):
            fetch(hub.head(commit, shard))
    else:
        fetch(weights)
    for filename in TOKENIZER_FILES:
        fetch(hub.head(commit, filename))
    snapshot = folder / "snapshots" / commit
    if missing := missing_files(snapshot):  # e.g. an index that names no shard
        raise RefGPTError(f"{snapshot}: still lacks {', '.join(missing)} after downloading")
    write_ref(folder, revision, commit)
    return snapshot, files


def content_hash(path: Path, etag: str) -> str:
    """The hash the hub's ETag is, of ``path``'s bytes: sha256 (64 hex digits) or git's blob sha1 (40)."""
    if len(etag) == 64:
        digest = hashlib.sha256()
    else:
        digest = hashlib.sha1()
        digest.update(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are followed by hand (_Hub.head, _Hub._get_from): which ones, and with which headers.
    The 3xx answer comes back as it is (an HTTPError), its Location not even parsed here: urllib's
    own handler parses it first, and a malformed one ("http://[::1") raised a bare ValueError."""

    def http_error_302(self, req, fp, code, msg, headers):
        return None

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


class _Hub:
    """HTTP to one hub endpoint for one repository: HEAD for a file's facts, GET for its bytes."""

    def __init__(self, endpoint: str, repo_id: str, progress: bool):
        try:
            parts = urlsplit(endpoint)
            parts.port  # raises for a port that is not a number in [0, 65535]
        except ValueError as error:
            raise RefGPTError(f"hub endpoint {endpoint!r:.100} (HF_ENDPOINT): a malformed URL ({error})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or any(
                not c.isprintable() or c.isspace() for c in endpoint):
            raise RefGPTError(f"hub endpoint {endpoint!r:.100} (HF_ENDPOINT): not an http:// or https:// URL")
        self.endpoint, self.repo_id, self.progress = endpoint.rstrip("/"), repo_id, progress
        self.opener = urllib.request.build_opener(_NoRedirect)

    def head(self, revision: str, filename: str) -> RemoteFile:
        url = f"{self.endpoint}/{self.repo_id}/resolve/{quote(revision, safe='')}/{quote(filename)}"
        where = f"{self.repo_id}@{revision}: {filename}"
        for _ in range(MAX_REDIRECTS):
            response = self._open("HEAD", url, where)
            response.close()
            location = response.headers.get("Location")
            if response.status < 300 or location is None:
                get_url = url
                break
            target = self._redirect(url, location, where)
            if urlsplit(target).netloc != urlsplit(url).netloc:  # the LFS store: the bytes are there
                get_url = target
                break
            url = target  # a renamed repository, on the hub itself
        else:
            raise RefGPTError(f"{where}: more than {MAX_REDIRECTS} redirects from {self.endpoint}")
        return self._remote_file(response.headers, response.status >= 300, filename, get_url, where)

    def _redirect(self, url: str, location, where: str) -> str:
        """Where a redirect from ``url`` leads: an http(s) URL, else one line (a ``file:`` or ``ftp:``
        Location, or a malformed one, is never followed)."""
        if location is None:
            raise RefGPTError(f"{where}: {_site(url)} redirected without a Location")
        try:
            target = urljoin(url, location)
            parts = urlsplit(target)
            parts.port  # a port that is not a number in [0, 65535] raises here
        except ValueError as error:
            raise RefGPTError(f"{where}: {_site(url)} redirected to a malformed URL {location!r:.100} ({error})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RefGPTError(f"{where}: {_site(url)} redirected to {location!r:.100}, which is not an http:// or "
                              "https:// URL: not followed")
        if any(not c.isprintable() or c.isspace() for c in target):
            raise RefGPTError(f"{where}: {_site(url)} redirected to a malformed URL {location!r:.100} "
                              "(spaces or control characters)")
        return target

    def _remote_file(self, headers, redirected: bool, filename: str, url: str, where: str) -> RemoteFile:
        commit = headers.get("X-Repo-Commit")
        if commit is None or not COMMIT.fullmatch(commit):
            raise RefGPTError(f"{where}: {self.endpoint} answered without a commit hash (X-Repo-Commit "
                              f"{commit!r}): not a Hugging Face hub endpoint? (HF_ENDPOINT)")
        raw_etag = headers.get("X-Linked-Etag") or headers.get("ETag") or ""
        etag = raw_etag.removeprefix("W/").strip('"')
        if not _ETAG.fullmatch(etag):
            raise RefGPTError(f"{where}: the hub's ETag {raw_etag!r} is neither a sha256 nor a git sha1, "
                              "so the file cannot be verified")
        size = headers.get("X-Linked-Size") or (None if redirected else headers.get("Content-Length"))
        if size is None or not size.isdigit():
            raise RefGPTError(f"{where}: the hub did not say how large the file is (size {size!r})")
        return RemoteFile(filename, commit, etag, int(size), url)

    def fetch(self, folder: Path, remote: RemoteFile) -> Path:
        """The file in the cache, verified, linked from its snapshot: downloaded if its blob is absent."""
        blob = folder / "blobs" / remote.etag
        where = f"{self.repo_id}@{remote.commit[:12]}: {remote.filename}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        with blob_lock(folder, remote.etag, lambda: self._waiting(where)):
            if blob.is_file():
                if content_hash(blob, remote.etag) != remote.etag:  # not ours to delete: someone else's cache
                    raise RefGPTError(f"{where}: the cached {blob} does not hash to its name; delete it and "
                                      "download again")
            else:
                partial = take_over_partial(blob, remote.size)
                try:
                    self._get(remote, partial, where)
                    found = content_hash(partial.path, remote.etag)
                    if found != remote.etag:
                        partial.path.unlink()
                        kind = "sha256" if len(remote.etag) == 64 else "git sha1"
                        raise RefGPTError(f"{where}: downloaded {kind} {found} does not match the hub's "
                                          f"{remote.etag}; the file was removed")
                    os.replace(partial.path, blob)
                finally:
                    partial.close()
            return link_into_snapshot(folder, remote.commit, remote.filename, remote.etag)

    def _waiting(self, where: str) -> None:
        if self.progress:
            sys.stderr.write(f"{where}: waiting for another download of the same file to finish\n")

    def _get(self, remote: RemoteFile, partial: "Partial", where: str) -> None:
        """``partial`` ← the file's bytes, resuming what is there; retried ATTEMPTS times if broken off."""
        for _ in range(ATTEMPTS):
            have = partial.size()
            if have > remote.size:  # not a prefix of this file: start over
                partial.truncate()
                have = 0
            if have == remote.size:
                return
            try:
                self._get_from(remote, partial, have, where)
                return
            except _Interrupted as error:
                broke = error
        held = partial.size()
        kept = (f"{held} of {remote.size} bytes are kept in {partial.keep()}, and downloading again resumes there"
                if held else "nothing was kept")
        raise RefGPTError(f"{where}: the download broke off ({broke}) {ATTEMPTS} times; {kept}")

    def _get_from(self, remote: RemoteFile, partial: Path, have: int, where: str) -> None:
        url = remote.url
        for _ in range(MAX_REDIRECTS):
            try:
                response = self._open("GET", url, where, {"Range": f"bytes={have}-"} if have else {})
            except _Unreachable as error:  # mid-download, as good as a broken connection: try again
                raise _Interrupted(str(error).removeprefix(f"{self.repo_id}: ")) from None
            except RefGPTError as error:
                if getattr(error, "status", None) == 416:  # the server will not resume this: start over
                    partial.truncate()
                    raise _Interrupted("the server refused to resume (HTTP 416)") from None
                raise
            if response.status < 300:
                break
            response.close()
            url = self._redirect(url, response.headers.get("Location"), where)
        else:
            raise RefGPTError(f"{where}: more than {MAX_REDIRECTS} redirects")
        with response:
            if response.status == 206:
                start = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
                if start is None or int(start.group(1)) != have:
                    raise RefGPTError(f"{where}: asked to resume at byte {have}, the server answered "
                                      f"Content-Range {response.headers.get('Content-Range')!r}")
                mode = "ab"
            else:  # 200: the whole file (a server may ignore Range)
                have, mode = 0, "wb"
            with open(partial.path, mode) as out, self._bar(remote.filename, have, remote.size) as bar:
                while have < remote.size:
                    try:
                        block = response.read(min(CHUNK, remote.size - have))
                    except (http.client.HTTPException, OSError) as error:
                        raise _Interrupted(f"{type(error).__name__} at byte {have}") from None
                    if not block:
                        raise _Interrupted(f"connection closed at byte {have} of {remote.size}")
                    out.write(block)
                    have += len(block)
                    bar.update(have)

    def _bar(self, label: str, done: int, total: int):
        return _Bar(label, done, total) if self.progress else _NoBar()

    def _open(self, method: str, url: str, where: str, headers=None):
        """The response to one request (2xx, or 3xx: not followed); any other status is a RefGPTError."""
        request = urllib.request.Request(url, method=method, headers={
            "User-Agent": f"refgpt/{__version__}", "Accept-Encoding": "identity", **(headers or {})})
        try:
            return self.opener.open(request, timeout=TIMEOUT)
        except urllib.error.HTTPError as response:
            if 300 <= response.code < 400:
                return response
            response.close()
            raise self._status_error(response.code, response.headers, where) from None
        except urllib.error.URLError as error:
            raise _Unreachable(f"{self.repo_id}: cannot reach {_site(url)}: {error.reason} "
                               "(HF_HUB_OFFLINE=1 runs from the cache alone)") from None
        except (http.client.HTTPException, OSError) as error:  # timeouts, resets before any answer
            raise _Unreachable(f"{self.repo_id}: cannot reach {_site(url)}: {type(error).__name__}: "
                               f"{error}") from None

    def _status_error(self, status: int, headers, where: str) -> RefGPTError:
        code = headers.get("X-Error-Code")
        if code == "EntryNotFound":
            error = _EntryNotFound(f"{where}: no such file in the repository (HTTP {status})")
        elif code == "RevisionNotFound":
            error = RefGPTError(f"{where.split(':')[0]}: no such revision on {self.endpoint} (HTTP {status})")
        elif code == "RepoNotFound" or status == 401:
            error = RefGPTError(f"{self.repo_id}: no such repository on {self.endpoint}, or it is private "
                                f"or gated (HTTP {status}); refgpt downloads public repositories only")
        elif status == 404:
            error = RefGPTError(f"{where}: not found on {self.endpoint} (HTTP 404)")
        else:
            error = RefGPTError(f"{where}: {self.endpoint} answered HTTP {status}")
        error.status = status
        return error


# ---- several writers: a lock per blob, a partial file per process -------------------------------


@contextlib.contextmanager
def blob_lock(folder: Path, etag: str, waiting=lambda: None):
    """Hold ``.locks/<repo folder>/<etag>.lock`` (flock), as huggingface_hub's FileLock does, for
    the time one process checks, downloads and links one blob. ``waiting()`` is called once if
    another process holds it. Where the file system cannot lock, nothing is held: every process
    then writes a partial file of its own, so a blob is still never written twice."""
    lock = folder.parent / ".locks" / folder.name / f"{etag}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o664)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting()
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as error:
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        yield lock
    finally:
        os.close(fd)


class Partial:
    """This process's partial file of one blob, ``blobs/<etag>.<12 hex digits>.incomplete``, locked
    (flock) while it is open, so that a later process can tell a killed download's bytes from a
    live one's."""

    def __init__(self, path: Path):
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                os.close(self._fd)
                raise

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def truncate(self) -> None:
        os.ftruncate(self._fd, 0)

    def keep(self) -> Path:
        """Leave the bytes for a later run to resume, as ``blobs/<etag>.incomplete``; returns that path."""
        kept = self.path.with_name(self.path.name.split(".")[0] + ".incomplete")
        os.replace(self.path, kept)
        self.path = kept
        return kept

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def take_over_partial(blob: Path, size: int) -> Partial:
    """A fresh Partial for ``blob``, holding the bytes of the longest interrupted download of it
    that no live process holds (``<etag>.incomplete``, or a killed process's partial); the others
    are removed. Called with the blob's lock held."""
    candidates = []
    for entry in os.scandir(blob.parent):
        if entry.name.startswith(blob.name + ".") and entry.name.endswith(".incomplete") and entry.is_file():
            if _held_by_a_live_process(entry.path):
                continue
            candidates.append((entry.stat().st_size, entry.path))
    mine = blob.with_name(f"{blob.name}.{secrets.token_hex(6)}.incomplete")
    best = max((c for c in candidates if c[0] <= size), default=None)
    for _, path in candidates:
        if best is not None and path == best[1]:
            try:
                os.rename(path, mine)
                continue
            except FileNotFoundError:  # taken by another process meanwhile
                pass
        with contextlib.suppress(OSError):
            os.unlink(path)
    return Partial(mine)


def _held_by_a_live_process(path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError as error:
        return error.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)


def _site(url: str) -> str:
    """scheme://host[:port] of a URL: what could not be reached (never a signed URL's query)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class _NoBar:
    """No progress bar (stderr is not a terminal)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, done: int) -> None:
        pass


class _Bar(_NoBar):
    """A one-line progress bar per file on stderr, redrawn in place at most ten times a second."""

    WIDTH = 24

    def __init__(self, label: str, done: int, total: int):
        self.label, self.total, self.first = label, total, done
        self.start = self.last = time.monotonic()
        self.draw(done)

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last >= 0.1 or done >= self.total:
            self.last = now
            self.draw(done)

    def draw(self, done: int) -> None:
        filled = self.WIDTH * done // max(self.total, 1)
        rate = (done - self.first) / max(time.monotonic() - self.start, 1e-9) / 1e6
        sys.stderr.write(f"\r{self.label:<28} [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
                         f"{done / 1e6:8.1f}/{self.total / 1e6:.1f} MB {rate:6.1f} MB/s")
        sys.stderr.flush()

    def __exit__(self, *exc):
        sys.stderr.write("\n")
        return False
