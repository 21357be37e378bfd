"""The HF cache under faults (issue 24): a hub that answers with hostile redirects and headers,
a download killed before each of its file-system events, and two downloads of one name at once.
The loopback hub of tests/fake_hub.py serves a small GPT-2; nothing leaves the machine.

Whatever happens, the cache never holds a blob that does not hash to its name, a snapshot is
found only when it is whole, an error is one line (exit status 1, never an internal error), and
the next download leaves a correct cache with nothing else in it."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from fault_injection import LONG, count_events, run_killed, sample, in_child
from fake_hub import etag_of
from refgpt import RefGPTError
from refgpt.files.atomic_write import is_temporary
from refgpt.files.hf_cache import find_snapshot
from refgpt.files.hub import content_hash, download

REPO = "openai-community/gpt2"


def folder(cache):
    return cache / "models--openai-community--gpt2"


def assert_cache_sound(cache, hub_files, complete: bool) -> None:
    """Every blob hashes to its name; a snapshot is found only whole, holding the hub's bytes; with
    ``complete`` nothing but the cache's own files is left (no partial, no temporary)."""
    blobs = folder(cache) / "blobs"
    for blob in blobs.iterdir() if blobs.is_dir() else []:
        if blob.name.endswith(".incomplete"):
            assert not complete, f"{blob.name} left after a complete download"
            continue
        assert content_hash(blob, blob.name) == blob.name, f"{blob.name} does not hash to its name"
    snapshot, _ = find_snapshot(REPO, "main", cache)
    if snapshot is not None:
        for name, data in hub_files.items():
            assert (snapshot / name).read_bytes() == data, name
    if complete:
        assert snapshot is not None
        leftovers = [p for p in folder(cache).rglob("*") if is_temporary(p) or p.name.endswith((".tmp", ".incomplete"))]
        assert leftovers == [], leftovers


# ---- a hub that misbehaves --------------------------------------------------------------------

HOSTILE = [
    ("a redirect to file:", 302, {"Location": "file:///etc/passwd"}, "not an http:// or https:// URL"),
    ("a redirect to ftp:", 301, {"Location": "ftp://127.0.0.1/x"}, "not an http:// or https:// URL"),
    ("a redirect to javascript:", 307, {"Location": "javascript:alert(1)"}, "not an http:// or https:// URL"),
    ("a malformed IPv6 Location", 302, {"Location": "http://[::1/x"}, "malformed URL"),
    ("a port out of range", 302, {"Location": "http://127.0.0.1:99999/x"}, "malformed URL"),
    ("a Location with a space", 302, {"Location": "/openai-community/gpt2/resolve/main/con fig.json"}, "malformed URL"),
    ("a redirect without a Location", 302, {}, "without a commit hash|redirected without a Location"),
    ("a server error", 500, {}, "answered HTTP 500"),
    ("no commit header", 200, {"ETag": '"' + "0" * 40 + '"'}, "without a commit hash"),
    ("an ETag that is no hash", 200, {"X-Repo-Commit": "a" * 40, "ETag": '"W/xyz"'}, "neither a sha256 nor a git sha1"),
    ("a size that is no number", 200, {"X-Repo-Commit": "a" * 40, "ETag": '"' + "0" * 40 + '"', "Content-Length": "-1"},
     "did not say how large"),
]


@pytest.mark.slow
@pytest.mark.parametrize("what, status, headers, message", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_hub_answer_is_one_line_with_status_1(refgpt_cli, hub, hf_env, what, status, headers, message):
    hub.answer["config.json"] = (status, headers)
    code, out, err = refgpt_cli.in_process("download", REPO)
    assert code == 1 and out == "" and err.count("\n") == 1 and err.startswith("refgpt: error: "), (what, code, err)
    import re

    assert re.search(message, err), (what, err)
    assert not (folder(hf_env) / "snapshots").exists() or not any((folder(hf_env) / "snapshots").rglob("config.json"))


def test_a_redirect_to_file_is_never_followed_for_the_weights_either(hub, hf_env):
    hub.answer["model.safetensors"] = (302, {"Location": "file:///etc/passwd", "X-Repo-Commit": hub.commit,
                                             "X-Linked-Etag": '"' + "0" * 64 + '"', "X-Linked-Size": "10"})
    with pytest.raises(RefGPTError, match="not an http:// or https:// URL: not followed"):
        download(REPO)


def test_a_malformed_endpoint_is_one_line(refgpt_cli, hf_env, monkeypatch):
    for endpoint in ("http://[::1", "http://127.0.0.1:99999", "http://host name", "file:///tmp"):
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        code, _, err = refgpt_cli.in_process("download", REPO)
        assert code == 1 and err.count("\n") == 1 and "HF_ENDPOINT" in err, (endpoint, err)


# ---- a download killed at every event --------------------------------------------------------


@pytest.mark.slow
def test_a_download_killed_at_any_event_leaves_a_sound_cache_and_the_next_one_completes(hub, hf_env, hub_files):
    n, log = count_events(lambda: download(REPO), hf_env)
    assert n > 10, log
    import shutil

    cases = 0
    for k in sample(n, 40 if LONG else 10):
        if hf_env.exists():
            shutil.rmtree(hf_env)
        assert run_killed(lambda: download(REPO), hf_env, k) == "killed", k
        assert_cache_sound(hf_env, hub_files, complete=False)
        download(REPO)  # the next one: resumes what it can, removes what the killed one left
        assert_cache_sound(hf_env, hub_files, complete=True)
        cases += 1
    assert cases >= min(n, 10)


def test_a_killed_download_is_resumed_from_its_partial_file(hub, hf_env, hub_files):
    """A download killed while the weights arrive leaves its own partial file (locked while it
    grew, free once its process died); the next download takes it over, with a Range request from
    where it stopped, instead of starting again."""
    weights = etag_of("model.safetensors", hub_files["model.safetensors"])
    first = 100_000

    def fetch():
        download(REPO)

    hub.break_after["model.safetensors"] = [first]  # the first GET sends 100,000 bytes and hangs up
    n, log = count_events(fetch, hf_env)  # (the hub runs in this process: its faults are set here)
    opened = next(i for i, e in enumerate(log) if e.startswith(f"open {weights}.") and e.endswith(".incomplete"))
    wrote = next(i for i, e in enumerate(log) if i > opened and e.endswith(".write"))
    import shutil

    shutil.rmtree(hf_env)
    hub.break_after["model.safetensors"] = [first]
    assert run_killed(fetch, hf_env, wrote + 2) == "killed"  # just after the first bytes were written
    partials = list((folder(hf_env) / "blobs").glob(f"{weights}.*.incomplete"))
    assert [p.stat().st_size for p in partials] == [first], partials
    hub.break_after.clear()
    hub.requests[:] = []
    download(REPO)
    ranges = [r for m, p, r in hub.requests if m == "GET" and p.startswith("/lfs/")]
    assert ranges == [f"bytes={first}-"], ranges
    assert_cache_sound(hf_env, hub_files, complete=True)


# ---- two downloads at once -----------------------------------------------------------------------


def test_two_downloads_of_one_name_at_once_leave_a_correct_cache(hub, hf_env, hub_files):
    """The issue's corruption: both appended to one blobs/<etag>.incomplete, one verified and renamed
    it while the other kept writing into the verified blob. Now the second waits on the blob's lock
    (huggingface_hub's lock file) and finds the verified blob; repeated with the downloads started
    together, the weights served slowly enough that they overlap."""
    import shutil

    hub.pace = 0.0005
    for round_ in range(6 if LONG else 2):
        if hf_env.exists():
            shutil.rmtree(hf_env)
        pids = []
        for _ in range(2):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    download(REPO)
                except BaseException:  # noqa: BLE001 — reported through the exit status
                    code = 1
                os._exit(code)
            pids.append(pid)
        statuses = [os.waitpid(pid, 0)[1] for pid in pids]
        assert statuses == [0, 0], (round_, statuses)
        assert_cache_sound(hf_env, hub_files, complete=True)
        gets = [p for m, p, r in hub.requests if m == "GET" and p.startswith("/lfs/")]
        assert len(gets) == 1, gets  # once: the second download waited on the lock and found the blob
        hub.requests[:] = []
    digest = hashlib.sha256(hub_files["model.safetensors"]).hexdigest()
    assert (folder(hf_env) / "blobs" / digest).read_bytes() == hub_files["model.safetensors"]
