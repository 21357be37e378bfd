"""An imitation of the Hugging Face hub's file endpoints on 127.0.0.1, and fabricated HF caches.

``FakeHub`` serves ``/{repo}/resolve/{revision}/{filename}`` (HEAD and GET) as the hub does:

- a regular (git) file: 200, ``ETag: "<git blob sha1>"``, ``X-Repo-Commit``, ``Content-Length``;
- an LFS file (``*.safetensors``): 302 to a second server on another port (the "LFS store", as the
  hub redirects to its CDN), with ``X-Linked-Etag: "<sha256>"``, ``X-Linked-Size`` and
  ``X-Repo-Commit``; the store answers GET with the bytes;
- a renamed repository (``gpt2`` → ``openai-community/gpt2``): 307 to the new name, relative;
- errors with the hub's ``X-Error-Code``: 401 RepoNotFound, 404 RevisionNotFound, 404 EntryNotFound;
- ``Range: bytes=N-`` → 206 with ``Content-Range``.

Faults to inject: ``hub.break_after[filename] = [n, …]`` — each GET of that file (in turn) sends
its headers, then only n bytes, then drops the connection; ``hub.corrupt.add(filename)`` — the
bytes served differ from the hashes advertised; ``hub.ignore_range = True`` — 200 and the whole
file whatever the Range; ``hub.answer[filename] = (status, headers)`` — the hub's HEAD and GET of
that file answer so instead (a redirect to ``file:``, a malformed Location, …); ``hub.pace = s`` —
bodies are sent in 4 KiB pieces, ``s`` seconds apart (for downloads that must overlap).
``hub.requests`` records (method, path, Range).

Everything binds to 127.0.0.1 on a port the OS chooses; the threads are daemons and ``close()``
stops them. Nothing here contacts anything else.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released): a hub that cannot be reached."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_lfs(filename: str) -> bool:
    return filename.endswith(".safetensors")


def etag_of(filename: str, data: bytes) -> str:
    """The hub's ETag: sha256 for an LFS file, git blob sha1 for any other."""
    return sha256(data) if is_lfs(filename) else git_sha1(data)


class FakeHub:
    def __init__(self):
        self.repos: dict[str, dict] = {}  # repo id → {"refs": {name: commit}, "commits": {commit: {file: bytes}}}
        self.renamed: dict[str, str] = {}
        self.break_after: dict[str, list[int]] = {}
        self.corrupt: set[str] = set()
        self.ignore_range = False  # answer every GET with 200 and the whole file, as some servers do
        self.answer: dict[str, tuple[int, dict]] = {}
        self.pace = 0.0
        self.requests: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()
        self.hub = _serve(self, lfs_store=False)
        self.store = _serve(self, lfs_store=True)
        self.url = f"http://127.0.0.1:{self.hub.server_address[1]}"
        self.store_url = f"http://127.0.0.1:{self.store.server_address[1]}"

    def add_commit(self, repo_id: str, files: dict[str, bytes], ref: str | None = "main") -> str:
        """A new commit of ``repo_id`` holding ``files``; ``ref`` (a branch or tag) points at it."""
        commit = secrets.token_hex(20)
        repo = self.repos.setdefault(repo_id, {"refs": {}, "commits": {}})
        repo["commits"][commit] = dict(files)
        if ref is not None:
            repo["refs"][ref] = commit
        return commit

    def blob(self, sha: str) -> tuple[str, bytes] | None:
        """(file name, bytes) of the LFS file whose sha256 is ``sha``, as the LFS store finds it."""
        for repo in self.repos.values():
            for files in repo["commits"].values():
                for name, data in files.items():
                    if is_lfs(name) and sha256(data) == sha:
                        return name, data
        return None

    def close(self):
        for server in (self.hub, self.store):
            server.shutdown()
            server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _serve(hub: FakeHub, lfs_store: bool) -> ThreadingHTTPServer:
    handler = type("Handler", (_Handler,), {"hub": hub, "lfs_store": lfs_store})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    lfs_store: bool
    timeout = 10  # seconds a request may stall: bounded, whatever a client does

    def log_message(self, *args):  # quiet
        pass

    def do_HEAD(self):
        self._answer(send_body=False)

    def do_GET(self):
        self._answer(send_body=True)

    def _answer(self, send_body: bool):
        with self.hub._lock:
            self.hub.requests.append((self.command, self.path, self.headers.get("Range")))
        if self.lfs_store:
            sha = self.path.removeprefix("/lfs/")
            found = self.hub.blob(sha)
            if found is None:
                return self._status(404, {})
            return self._send_file(found[1], found[0], sha, {}, send_body)
        repo_id, sep, rest = self.path.lstrip("/").partition("/resolve/")
        revision, _, filename = rest.partition("/")
        repo_id, revision, filename = unquote(repo_id), unquote(revision), unquote(filename)
        if not sep or not filename:
            return self._status(404, {})
        if filename in self.hub.answer:
            status, headers = self.hub.answer[filename]
            return self._status(status, headers)
        if repo_id in self.hub.renamed:
            return self._status(307, {"Location": f"/{self.hub.renamed[repo_id]}/resolve/{rest}"})
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return self._status(401, {"X-Error-Code": "RepoNotFound"})
        commit = repo["refs"].get(revision, revision if revision in repo["commits"] else None)
        if commit is None:
            return self._status(404, {"X-Error-Code": "RevisionNotFound"})
        data = repo["commits"][commit].get(filename)
        if data is None:
            return self._status(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit})
        if is_lfs(filename):
            sha = sha256(data)
            return self._status(302, {"Location": f"{self.hub.store_url}/lfs/{sha}", "X-Repo-Commit": commit,
                                      "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                                      "ETag": f'"{git_sha1(b"lfs pointer " + sha.encode())}"'})
        self._send_file(data, filename, git_sha1(data), {"X-Repo-Commit": commit}, send_body)

    def _status(self, code: int, headers: dict):
        self.send_response(code)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _send_file(self, data: bytes, filename: str, etag: str, headers: dict, send_body: bool):
        start = 0
        wanted = None if self.hub.ignore_range else self.headers.get("Range")
        if wanted:
            start = int(wanted.removeprefix("bytes=").split("-")[0])
            if start >= len(data):
                return self._status(416, {"Content-Range": f"bytes */{len(data)}"})
        body = data[start:]
        self.send_response(206 if wanted else 200)
        for key, value in {**headers, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}.items():
            self.send_header(key, value)
        if wanted:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not send_body:
            return
        if filename in self.hub.corrupt:
            body = bytes([body[0] ^ 1]) + body[1:]
        with self.hub._lock:
            breaks = self.hub.break_after.get(filename)
            cut = breaks.pop(0) if breaks else None
        if cut is not None:
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            return
        if self.hub.pace:
            import time

            for i in range(0, len(body), 4096):
                self.wfile.write(body[i:i + 4096])
                self.wfile.flush()
                time.sleep(self.hub.pace)
            return
        self.wfile.write(body)


def fabricate_cache(cache: Path, folder_name: str, files: dict[str, bytes], refs=("main",),
                    commit: str | None = None) -> Path:
    """Write an HF cache entry by hand, as huggingface_hub lays it out; return its snapshot directory.

    ``folder_name`` is the repository's folder (``models--gpt2``); blobs are named by their ETag,
    ``snapshots/<commit>/<file>`` are relative symlinks to them, ``refs/<ref>`` hold the commit.
    """
    commit = commit or secrets.token_hex(20)
    repo = Path(cache) / folder_name
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        etag = etag_of(name, data)
        (repo / "blobs" / etag).write_bytes(data)
        pointer = snapshot / name
        pointer.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(repo / "blobs" / etag, pointer.parent), pointer)
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def tiny_gpt2_files(seed: int = 0, sharded: bool = False) -> dict[str, bytes]:
    """A small random GPT-2 as a hub repository holds it: what ``refgpt.save`` writes (config.json,
    model.safetensors in F32, and the embedded model's 8,192-token vocab.json and merges.txt), or
    with the weights split into two shards and their index."""
    import json
    import tempfile

    from safetensors.numpy import load, save

    import refgpt
    from random_models import random_model

    cfg = refgpt.Config(d_model=8, n_layers=2, n_heads=2, d_mlp=16, d_vocab=8192, n_ctx=16,
                        tie_word_embeddings=False)
    model = random_model(cfg, seed=seed)
    model.tokenizer = refgpt.Tokenizer.from_dir(refgpt.default_model_path())
    with tempfile.TemporaryDirectory() as directory:
        refgpt.save(model, directory, dtype="float32")
        files = {path.name: path.read_bytes() for path in Path(directory).iterdir()
                 if path.name != "refgpt-manifest.json"}  # refgpt's own record, which a hub repository lacks
    if not sharded:
        return files
    tensors = load(files.pop("model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        files[shard] = save({k: tensors[k] for k in keys})
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}).encode()
    return files
