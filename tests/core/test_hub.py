"""GPT-2 by name (refgpt.files.hub, refgpt.files.hf_cache): the HF cache in both spellings, revisions,
HF_HUB_OFFLINE, and downloads from an imitation of the hub on 127.0.0.1 — success, a renamed
repository, interruption and resume, a wrong hash, 404s, no network, shards.

Nothing here contacts anything off this machine: every test runs with HF_HUB_CACHE in a temporary
directory and HF_ENDPOINT at the loopback (a fake hub, or a port nothing listens on).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import refgpt
from fake_hub import etag_of, fabricate_cache, tiny_gpt2_files
from peers import require_peers
from refgpt import RefGPTError
from refgpt.files.hf_cache import cache_dir, parse_name
from refgpt.files.hub import download, download_files

TOKENS = np.array([[5, 17, 300, 8000, 2]])


pytestmark = pytest.mark.usefixtures("hf_env")  # conftest.py: an empty HF cache, the hub unreachable


def logits_of(directory) -> np.ndarray:
    return refgpt.load(directory)(TOKENS)  # [batch, pos, d_vocab]


def only_line(message: str) -> str:
    assert "\n" not in message
    return message


# ---- names and where the cache is ---------------------------------------------------------

def test_names_are_hub_ids_as_huggingface_hub_validates_them():
    assert parse_name("gpt2") == ("gpt2", "main")
    assert parse_name("openai-community/gpt2@v1.0") == ("openai-community/gpt2", "v1.0")
    assert parse_name("owner/name@refs/pr/1") == ("owner/name", "refs/pr/1")
    for not_a_name in ["/abs/path", "./gpt2", "a/b/c", "a--b", "a..b", "-x", "x.", "x@../../etc", "x@", "~/gpt2",
                       "gpt2.git", "a b", "", "x@/abs"]:
        assert parse_name(not_a_name) is None, not_a_name


@pytest.mark.parametrize("env, expected", [
    ({"HF_HUB_CACHE": "/c/hub"}, "/c/hub"),
    ({"HUGGINGFACE_HUB_CACHE": "/legacy"}, "/legacy"),
    ({"HF_HOME": "/h"}, "/h/hub"),
    ({"XDG_CACHE_HOME": "/x"}, "/x/huggingface/hub"),
    ({"HF_HOME": "~/h", "HF_HUB_CACHE": "$HOME/c"}, "{home}/c"),
    ({}, "{home}/.cache/huggingface/hub"),
])
def test_cache_dir_is_huggingface_hubs(env, expected, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    home = os.path.expanduser("~")
    assert str(cache_dir()) == expected.format(home=home)
    hf = subprocess.run([sys.executable, "-c", "import huggingface_hub.constants as c; print(c.HF_HUB_CACHE)"],
                        capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if hf.returncode == 0:  # the peer, when installed (a dependency of transformers)
        assert hf.stdout.strip() == str(cache_dir())


@pytest.mark.slow
def test_loading_a_directory_loads_no_http_machinery_and_refgpt_hub_loads_on_first_use():
    code = ("import sys, refgpt; refgpt.load_default(); "
            "print(sorted(m for m in ('refgpt.files.hub', 'refgpt.files.hf_cache', 'urllib.request', 'http.client') "
            "if m in sys.modules)); "
            "print(refgpt.files.hub is sys.modules['refgpt.files.hub'], refgpt.files.hf_cache is sys.modules['refgpt.files.hf_cache'], "
            "refgpt.files.hub.download.__module__, refgpt.download is refgpt.files.hub.download)")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert loaded.stdout.splitlines() == ["[]", "True True refgpt.files.hub True"]


# ---- the cache: both spellings, revisions, offline ----------------------------------------

@pytest.mark.parametrize("folder", ["models--gpt2", "models--openai-community--gpt2"])
@pytest.mark.parametrize("name", ["gpt2", "openai-community/gpt2"])
def test_either_spelling_finds_either_cache_folder_offline(hf_env, hub_files, folder, name, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = fabricate_cache(hf_env, folder, hub_files)
    model = refgpt.load(name)
    assert model.source == snapshot
    plain = tmp_path / "plain"
    plain.mkdir()
    for filename, data in hub_files.items():
        (plain / filename).write_bytes(data)
    np.testing.assert_array_equal(model(TOKENS), logits_of(plain))  # the same bits as from a directory
    assert model.tokenizer is not None


def test_the_spelling_asked_for_comes_first(hf_env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bare = fabricate_cache(hf_env, "models--gpt2", tiny_gpt2_files(seed=2))
    moved = fabricate_cache(hf_env, "models--openai-community--gpt2", tiny_gpt2_files(seed=3))
    assert refgpt.load("gpt2").source == bare
    assert refgpt.load("openai-community/gpt2").source == moved


@pytest.mark.slow
def test_a_revision_is_a_ref_or_a_commit(hf_env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    main = fabricate_cache(hf_env, "models--owner--tiny", tiny_gpt2_files(seed=4), refs=("main",))
    v1 = fabricate_cache(hf_env, "models--owner--tiny", tiny_gpt2_files(seed=5), refs=("v1", "refs/pr/1"))
    assert refgpt.load("owner/tiny").source == main
    assert refgpt.load("owner/tiny@v1").source == v1
    assert refgpt.load("owner/tiny@refs/pr/1").source == v1
    assert refgpt.load(f"owner/tiny@{main.name}").source == main
    assert not np.array_equal(logits_of("owner/tiny"), logits_of("owner/tiny@v1"))
    with pytest.raises(RefGPTError) as error:
        refgpt.load("owner/tiny@v2")
    assert "models--owner--tiny (no 'v2')" in only_line(str(error.value))


def test_an_uncached_name_offline_is_one_line_naming_where_it_looked(hf_env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RefGPTError) as error:
        refgpt.load("gpt2-medium")
    message = only_line(str(error.value))
    assert message.startswith("gpt2-medium: not a directory, and not in the HF cache")
    assert f"{hf_env}/models--gpt2-medium (absent)" in message
    assert f"{hf_env}/models--openai-community--gpt2-medium (absent)" in message
    assert "HF_HUB_OFFLINE" in message


def test_a_directory_wins_and_a_path_is_never_a_hub_name(tmp_path, hub_files, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2").mkdir()
    for filename, data in hub_files.items():
        (tmp_path / "gpt2" / filename).write_bytes(data)
    assert refgpt.load("gpt2").source == Path("gpt2")
    for path in ["/nonexistent/gpt2", "./nothing", Path("nothing")]:
        with pytest.raises(RefGPTError, match="model directory not found"):
            refgpt.load(path)


def test_a_snapshot_without_weights_is_not_used(hf_env, hub_files, monkeypatch):
    """An interrupted download, or a cache holding only pytorch_model.bin, which refgpt does not read."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = fabricate_cache(hf_env, "models--gpt2", {"config.json": hub_files["config.json"],
                                                         "pytorch_model.bin": b"torch"})
    with pytest.raises(RefGPTError) as error:
        refgpt.load("gpt2")
    assert f"{snapshot} (lacks model.safetensors)" in only_line(str(error.value))


@pytest.mark.parametrize("index, expected", [
    ({"weight_map": {"wte.weight": "../../../../etc/passwd"}}, r"shard name '\.\./\.\./\.\./\.\./etc/passwd' is not a "
                                                               r"relative file name"),
    ({"weight_map": {"wte.weight": ["a"]}}, r"not a valid shard index \(TypeError"),
    ([1, 2], r"not a valid shard index \(TypeError"),
])
def test_a_cached_shard_index_is_checked_as_a_downloaded_one_is(hf_env, hub_files, monkeypatch, index, expected):
    """A shard name becomes a path inside the snapshot: one that would leave it is refused, not looked up."""
    import json

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = fabricate_cache(hf_env, "models--gpt2", {"config.json": hub_files["config.json"],
                                                         "model.safetensors.index.json": json.dumps(index).encode()})
    with pytest.raises(RefGPTError, match=rf"^{snapshot}/model.safetensors.index.json: {expected}"):
        refgpt.load("gpt2")


def test_a_damaged_ref_is_an_error_not_a_guess(hf_env, hub_files, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fabricate_cache(hf_env, "models--gpt2", hub_files)
    (hf_env / "models--gpt2" / "refs" / "main").write_text("../../etc")
    with pytest.raises(RefGPTError, match=r"models--gpt2/refs/main: not a commit hash \('../../etc'\)"):
        refgpt.load("gpt2")


# ---- downloads from the fake hub --------------------------------------------------------------

def test_download_writes_the_hf_cache_layout(hf_env, hub, hub_files):
    snapshot = download("openai-community/gpt2")
    repo = hf_env / "models--openai-community--gpt2"
    assert snapshot == repo / "snapshots" / hub.commit
    assert (repo / "refs" / "main").read_text() == hub.commit  # no newline, as huggingface_hub writes it
    assert sorted(os.listdir(snapshot)) == sorted(hub_files)
    for filename, data in hub_files.items():
        link = snapshot / filename
        assert os.readlink(link) == f"../../blobs/{etag_of(filename, data)}"  # relative, as HF's
        assert link.read_bytes() == data
    assert sorted(os.listdir(repo / "blobs")) == sorted(etag_of(f, d) for f, d in hub_files.items())
    assert not list(repo.rglob("*.incomplete")) and not list(repo.rglob("*.tmp"))
    np.testing.assert_array_equal(logits_of(snapshot), logits_of("openai-community/gpt2"))
    lfs_gets = [path for method, path, _ in hub.requests if method == "GET" and path.startswith("/lfs/")]
    assert lfs_gets == [f"/lfs/{etag_of('model.safetensors', hub_files['model.safetensors'])}"]  # via the store


def test_every_file_after_the_first_is_fetched_at_the_first_ones_commit(hub, hub_files):
    download("openai-community/gpt2")
    later = [p for m, p, _ in hub.requests if m == "HEAD" and "/resolve/" in p and "config.json" not in p]
    assert later and all(f"/resolve/{hub.commit}/" in p for p in later)


def test_a_second_download_checks_the_cache_and_fetches_nothing(hub):
    download("openai-community/gpt2")
    hub.requests.clear()
    download("openai-community/gpt2")
    assert [m for m, _, _ in hub.requests] == ["HEAD"] * 4


def test_a_renamed_repository_is_cached_under_the_name_asked_for(hf_env, hub):
    """As transformers' from_pretrained("gpt2") and TransformerLens do: models--gpt2."""
    snapshot = download("gpt2")
    assert snapshot == hf_env / "models--gpt2" / "snapshots" / hub.commit
    assert any(p.startswith("/openai-community/gpt2/resolve/") for _, p, _ in hub.requests)


def test_load_downloads_a_name_it_does_not_find(hf_env, hub):
    model = refgpt.load("gpt2")
    assert model.source == hf_env / "models--gpt2" / "snapshots" / hub.commit


def test_a_revision_is_downloaded_and_its_ref_written(hf_env, hub, hub_files):
    v1 = hub.add_commit("openai-community/gpt2", tiny_gpt2_files(seed=7), ref="v1")
    snapshot = download("openai-community/gpt2", "v1")
    repo = hf_env / "models--openai-community--gpt2"
    assert snapshot == repo / "snapshots" / v1 and (repo / "refs" / "v1").read_text() == v1
    assert not (repo / "refs" / "main").exists()
    assert download("openai-community/gpt2", hub.commit) == repo / "snapshots" / hub.commit
    assert sorted(os.listdir(repo / "refs")) == ["v1"]  # a commit needs no ref


def test_a_broken_connection_resumes_with_a_range_request(hub, hub_files):
    size = len(hub_files["model.safetensors"])
    hub.break_after["model.safetensors"] = [1000, size // 2 - 1000]
    snapshot = download("openai-community/gpt2")
    assert (snapshot / "model.safetensors").read_bytes() == hub_files["model.safetensors"]
    ranges = [r for m, p, r in hub.requests if m == "GET" and p.startswith("/lfs/")]
    assert ranges == [None, "bytes=1000-", f"bytes={size // 2}-"]


def test_a_server_that_ignores_range_sends_the_whole_file_again(hub, hub_files):
    hub.ignore_range = True
    hub.break_after["model.safetensors"] = [1000]
    snapshot = download("openai-community/gpt2")
    assert (snapshot / "model.safetensors").read_bytes() == hub_files["model.safetensors"]  # not appended to
    assert [r for m, p, r in hub.requests if m == "GET" and p.startswith("/lfs/")] == [None, "bytes=1000-"]


def test_an_interrupted_download_is_kept_and_the_next_run_resumes_it(hf_env, hub, hub_files):
    hub.break_after["vocab.json"] = [100, 200, 300]  # every attempt of this run breaks off
    with pytest.raises(RefGPTError) as error:
        download("openai-community/gpt2")
    etag = etag_of("vocab.json", hub_files["vocab.json"])
    partial = hf_env / "models--openai-community--gpt2" / "blobs" / f"{etag}.incomplete"
    message = only_line(str(error.value))
    assert "broke off" in message and f"600 of {len(hub_files['vocab.json'])} bytes are kept in {partial}" in message
    assert partial.read_bytes() == hub_files["vocab.json"][:600]
    assert not (hf_env / "models--openai-community--gpt2" / "refs").exists()  # not a usable snapshot yet
    hub.requests.clear()
    snapshot = download("openai-community/gpt2")
    assert (snapshot / "vocab.json").read_bytes() == hub_files["vocab.json"] and not partial.exists()
    assert [r for m, p, r in hub.requests if m == "GET" and "vocab.json" in p] == ["bytes=600-"]  # the rest


def test_an_unreachable_file_store_is_retried_then_one_line(hf_env, hub, hub_files):
    hub.store.shutdown()
    hub.store.server_close()
    with pytest.raises(RefGPTError) as error:
        download("openai-community/gpt2")
    assert only_line(str(error.value)) == (
        f"openai-community/gpt2@{hub.commit[:12]}: model.safetensors: the download broke off (cannot reach "
        f"{hub.store_url}: [Errno 111] Connection refused (HF_HUB_OFFLINE=1 runs from the cache alone)) 3 times; "
        "nothing was kept")


@pytest.mark.parametrize("filename, kind", [("model.safetensors", "sha256"), ("config.json", "git sha1")])
def test_a_wrong_hash_removes_the_file_and_says_so(hf_env, hub, hub_files, filename, kind):
    hub.corrupt.add(filename)
    with pytest.raises(RefGPTError) as error:
        download("openai-community/gpt2")
    message = only_line(str(error.value))
    etag = etag_of(filename, hub_files[filename])
    assert f"{filename}: downloaded {kind} " in message and f"does not match the hub's {etag}" in message
    repo = hf_env / "models--openai-community--gpt2"
    assert not (repo / "blobs" / etag).exists() and not (repo / "blobs" / f"{etag}.incomplete").exists()
    assert not (repo / "snapshots" / hub.commit / filename).exists()


def test_a_cached_blob_that_does_not_hash_to_its_name_is_reported(hf_env, hub, hub_files):
    snapshot = download("openai-community/gpt2")
    blob = (snapshot / "merges.txt").resolve()
    blob.write_bytes(b"tampered")
    with pytest.raises(RefGPTError, match=r"merges.txt: the cached .* does not hash to its name"):
        download("openai-community/gpt2")


@pytest.mark.parametrize("name, revision, expected", [
    ("nobody/nothing", "main", r"^nobody/nothing: no such repository on http://127\.0\.0\.1:\d+, or it is "
                               r"private or gated \(HTTP 401\)"),
    ("openai-community/gpt2", "v9", r"^openai-community/gpt2@v9: no such revision on .* \(HTTP 404\)$"),
])
def test_unknown_repositories_and_revisions_are_one_line(hub, name, revision, expected):
    with pytest.raises(RefGPTError, match=expected) as error:
        download(name, revision)
    only_line(str(error.value))


def test_a_missing_file_is_a_404_line(hf_env, hub, hub_files):
    hub.add_commit("owner/no-merges", {k: v for k, v in hub_files.items() if k != "merges.txt"})
    with pytest.raises(RefGPTError, match=r"^owner/no-merges@[0-9a-f]{40}: merges.txt: no such file in the "
                                          r"repository \(HTTP 404\)$"):
        download("owner/no-merges")
    assert not (hf_env / "models--owner--no-merges" / "refs").exists()


def test_no_network_is_one_line_and_load_says_where_it_looked(hf_env):
    with pytest.raises(RefGPTError, match=r"^gpt2: cannot reach http://127\.0\.0\.1:\d+: .*refused") as error:
        download("gpt2")
    only_line(str(error.value))
    with pytest.raises(RefGPTError, match=r"^distilgpt2: not a directory, and not in the HF cache \(looked in "
                                          r".*models--distilbert--distilgpt2 \(absent\)\); downloading it failed: "
                                          r"distilgpt2: cannot reach"):
        refgpt.load("distilgpt2")


@pytest.mark.parametrize("endpoint", ["huggingface.co", "ftp://127.0.0.1:21", "http://", "file:///tmp/hub"])
def test_an_endpoint_that_is_not_an_http_url_is_one_line(endpoint, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    with pytest.raises(RefGPTError) as error:
        download("gpt2")
    assert only_line(str(error.value)) == f"hub endpoint {endpoint!r} (HF_ENDPOINT): not an http:// or https:// URL"


def test_a_cache_that_cannot_be_written_is_one_line(hf_env, hub, monkeypatch):
    hf_env.parent.joinpath("a file").write_text("not a cache")
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_env.parent / "a file"))
    with pytest.raises(RefGPTError) as error:
        refgpt.load("gpt2")
    message = only_line(str(error.value))
    assert message.endswith(f"downloading it failed: gpt2: cannot write the HF cache: "
                            f"{hf_env.parent / 'a file' / 'models--gpt2' / 'blobs'}: Not a directory")


def test_a_cache_path_with_odd_characters_behind_a_symlink_works(hf_env, hub, hub_files, monkeypatch):
    """Spaces, %, non-ASCII and a symlinked cache directory: the snapshot links stay relative."""
    real = hf_env.parent / "réel dir %20 #1"
    real.mkdir()
    (hf_env.parent / "link to cache").symlink_to(real, target_is_directory=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_env.parent / "link to cache"))
    snapshot = download("gpt2")
    assert snapshot == hf_env.parent / "link to cache" / "models--gpt2" / "snapshots" / hub.commit
    for filename, data in hub_files.items():
        assert os.readlink(real / "models--gpt2" / "snapshots" / hub.commit / filename).startswith("../../blobs/")
        assert (snapshot / filename).read_bytes() == data
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert refgpt.load("gpt2").source == snapshot


def test_offline_download_is_refused(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RefGPTError, match="HF_HUB_OFFLINE is set"):
        download("gpt2")


@pytest.mark.slow
def test_a_sharded_checkpoint_is_downloaded_with_its_index(hf_env, hub):
    sharded = tiny_gpt2_files(seed=8, sharded=True)
    commit = hub.add_commit("owner/sharded", sharded)
    snapshot, remote = download_files("owner/sharded")
    assert sorted(f.filename for f in remote) == sorted(sharded)
    assert snapshot == hf_env / "models--owner--sharded" / "snapshots" / commit
    one = tiny_gpt2_files(seed=8)
    plain = hf_env.parent / "plain"
    plain.mkdir()
    for filename, data in one.items():
        (plain / filename).write_bytes(data)
    np.testing.assert_array_equal(logits_of("owner/sharded"), logits_of(plain))
    assert refgpt.load("owner/sharded").source == snapshot


def test_a_hostile_shard_name_is_refused(hf_env, hub, hub_files):
    import json

    evil = {k: v for k, v in hub_files.items() if k != "model.safetensors"}
    evil["model.safetensors.index.json"] = json.dumps({"weight_map": {"wte.weight": "../../../escape"}}).encode()
    hub.add_commit("owner/evil", evil)
    with pytest.raises(RefGPTError, match=r"shard name '../../../escape' is not a relative file name"):
        download("owner/evil")


# ---- huggingface_hub, the peer, reads what refgpt writes and writes what refgpt reads ----------

@pytest.mark.peer
def test_huggingface_hub_reads_the_cache_refgpt_wrote(hf_env, hub, hub_files):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    download("gpt2")
    for filename in hub_files:
        found = huggingface_hub.try_to_load_from_cache("gpt2", filename, cache_dir=hf_env)
        assert isinstance(found, str) and Path(found).read_bytes() == hub_files[filename]
        path = huggingface_hub.hf_hub_download("gpt2", filename, cache_dir=hf_env, local_files_only=True)
        assert Path(path).read_bytes() == hub_files[filename]


@pytest.mark.peer
def test_refgpt_reads_the_cache_huggingface_hub_wrote(hf_env, hub, hub_files, monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    for filename in hub_files:
        huggingface_hub.hf_hub_download("openai-community/gpt2", filename, cache_dir=hf_env, endpoint=hub.url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = refgpt.load("gpt2")
    assert model.source == hf_env / "models--openai-community--gpt2" / "snapshots" / hub.commit


@pytest.mark.peer
def test_transformers_loads_by_name_what_refgpt_downloaded(hf_env, hub, monkeypatch):
    """``refgpt download gpt2`` puts the files where transformers' from_pretrained("gpt2") looks."""
    torch = pytest.importorskip("torch", reason="the peer test needs the 'peers' extra")
    transformers = pytest.importorskip("transformers", reason="the peer test needs the 'peers' extra")
    snapshot = download("gpt2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hf = transformers.GPT2LMHeadModel.from_pretrained("gpt2", cache_dir=hf_env, local_files_only=True,
                                                      torch_dtype=torch.float64)
    tokenizer = transformers.GPT2TokenizerFast.from_pretrained("gpt2", cache_dir=hf_env, local_files_only=True)
    model = refgpt.load("gpt2")
    assert model.source == snapshot
    assert tokenizer("To be, or not to")["input_ids"] == model.to_tokens("To be, or not to", prepend_bos=False)[0].tolist()
    with torch.no_grad():
        hf_logits = hf(torch.tensor(TOKENS)).logits.numpy()  # [batch, pos, d_vocab]
    ours = model(TOKENS)  # [batch, pos, d_vocab]
    assert np.max(np.abs(ours - hf_logits)) / max(1.0, np.max(np.abs(hf_logits))) <= 1e-12  # tests/peers.py F64_TOL


@pytest.mark.peer
def test_transformer_lens_loads_by_name_what_refgpt_downloaded(hf_env, hub, monkeypatch):
    """TransformerLens 3.9's from_pretrained("gpt2") finds refgpt's download in the HF cache and loads
    the same weights, bit for bit. TL's gpt2 assumes d_mlp = 4·d_model and reads n_ctx from
    config.json (which refgpt.save writes).

    In this process, as transformers' test above: huggingface_hub read HF_HUB_OFFLINE and the cache's
    place once, when it was first imported, so the cache is passed as cache_dir (that huggingface_hub's
    default cache is refgpt's is test_cache_dir_is_huggingface_hubs) and local_files_only=True is the
    offline switch. TL passes neither to the tokenizer it loads (and re-loads by its name_or_path), so
    it is given one read from the snapshot's directory (transformers finds it by name in
    test_transformers_loads_by_name_what_refgpt_downloaded). Any connection off the loopback fails
    the test."""
    torch, transformers, transformer_lens = require_peers()
    from random_models import random_model

    cfg = refgpt.Config(d_model=8, n_layers=2, n_heads=2, d_mlp=32, d_vocab=8192, n_ctx=16, tie_word_embeddings=False)
    model = random_model(cfg, seed=21)
    model.tokenizer = refgpt.Tokenizer.from_dir(refgpt.default_model_path())
    refgpt.save(model, hf_env.parent / "saved", dtype="float32")
    hub.add_commit("gpt2", {p.name: p.read_bytes() for p in (hf_env.parent / "saved").iterdir()})
    hub.renamed.clear()
    snapshot = download("gpt2")

    connect = socket.socket.connect

    def loopback_only(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1"):
            raise AssertionError(f"TransformerLens tried to connect to {address}")
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", loopback_only)
    offline = {"cache_dir": str(hf_env), "local_files_only": True}
    tl_model = transformer_lens.HookedTransformer.from_pretrained(
        "gpt2", dtype=torch.float64, fold_ln=False, fold_value_biases=False, center_writing_weights=False,
        center_unembed=False, tokenizer=transformers.GPT2TokenizerFast.from_pretrained(snapshot), **offline)
    with torch.no_grad():
        tl = {"logits": tl_model(torch.tensor(TOKENS)).numpy(),  # [batch, pos, d_vocab]
              **{k: v.numpy() for k, v in tl_model.state_dict().items()}}
    ours = refgpt.load("gpt2")
    for name, value in ours.params.items():  # float32 on disk: exact in both, TL's float32 rounding included
        np.testing.assert_array_equal(tl[name], value, err_msg=name)
    logits = ours(TOKENS)  # [batch, pos, d_vocab]
    assert np.max(np.abs(tl["logits"] - logits)) / max(1.0, np.max(np.abs(logits))) <= 1e-11  # tests/peers.py TL_TOL
