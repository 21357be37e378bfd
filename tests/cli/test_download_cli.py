"""``refgpt download NAME`` against an imitation of the hub on 127.0.0.1, and ``--model NAME`` from
a fabricated HF cache with HF_HUB_OFFLINE=1: HF's logits, one-line errors, the progress bar.

Nothing here contacts anything off this machine (HF_ENDPOINT is the fake hub or a closed loopback
port; HF_HUB_CACHE a temporary directory).
"""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

import refgpt
from fake_hub import etag_of, fabricate_cache, tiny_gpt2_files
from refgpt.files.hub import download

TEXT = "To be, or not to"


pytestmark = pytest.mark.usefixtures("hf_env")  # conftest.py: an empty HF cache, the hub unreachable


def test_download_then_predict_by_name(refgpt_cli, hf_env, hub, hub_files, monkeypatch):
    status, out, err = refgpt_cli.in_process("download", "gpt2")
    snapshot = hf_env / "models--gpt2" / "snapshots" / hub.commit
    assert status == 0 and err == ""  # no progress bar: stderr is not a terminal
    lines = out.splitlines()
    assert lines[0] == f"gpt2@main = commit {hub.commit}: every file's hash checked"
    assert lines[-1] == f"in {snapshot}"
    for filename, data in hub_files.items():
        kind = "sha256" if filename.endswith(".safetensors") else "git sha1"
        assert f"  {filename:<36} {len(data):>14,} bytes  {kind} {etag_of(filename, data)}" in lines
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    status, out, _ = refgpt_cli.in_process("predict", TEXT, "--model", "gpt2", "--json")
    assert status == 0 and json.loads(out)["model"] == str(snapshot)


def test_download_a_revision(refgpt_cli, hf_env, hub):
    v1 = hub.add_commit("openai-community/gpt2", tiny_gpt2_files(seed=12), ref="v1")
    for argv in (["openai-community/gpt2", "--revision", "v1"], ["openai-community/gpt2@v1"]):
        status, out, _ = refgpt_cli.in_process("download", *argv)
        assert status == 0 and out.splitlines()[0].startswith(f"openai-community/gpt2@v1 = commit {v1}")
    status, _, err = refgpt_cli.in_process("download", "gpt2@v1", "--revision", "v2")
    assert status == 1 and err == "refgpt: error: two revisions: 'gpt2@v1' and --revision 'v2'\n"


@pytest.mark.parametrize("argv, status, expected", [
    (["download", "nobody/nothing"], 1, r"nobody/nothing: no such repository on http://127\.0\.0\.1:\d+, or it is "
                                        r"private or gated \(HTTP 401\); refgpt downloads public repositories only"),
    (["download", "openai-community/gpt2", "--revision", "nope"], 1, r"openai-community/gpt2@nope: no such revision"),
    (["download", "a/b/c"], 2, r"argument NAME: not a hub repository id"),
    (["download", "gpt2", "--revision", "../x"], 1, r"revision '../x': not a branch, tag or commit name"),
])
def test_download_errors_are_one_line(refgpt_cli, hub, argv, status, expected):
    got, out, err = refgpt_cli.in_process(*argv)
    assert got == status and out == "" and err.count("\n") == 1
    assert err.startswith("refgpt: error: ")
    assert re.search(expected, err), err


def test_download_with_no_network_is_one_line(refgpt_cli):
    status, out, err = refgpt_cli.in_process("download", "gpt2")
    assert status == 1 and out == "" and err.count("\n") == 1
    assert err.startswith("refgpt: error: gpt2: cannot reach http://127.0.0.1:")


def test_download_on_a_hash_mismatch_is_one_line(refgpt_cli, hf_env, hub, hub_files):
    hub.corrupt.add("model.safetensors")
    status, _, err = refgpt_cli.in_process("download", "gpt2")
    assert status == 1 and err.count("\n") == 1 and "does not match the hub's" in err and "removed" in err
    assert not any(p.name.startswith(etag_of("model.safetensors", hub_files["model.safetensors"]))
                   for p in (hf_env / "models--gpt2" / "blobs").iterdir())


def test_progress_bar_only_on_a_terminal(capsys, hub, hub_files, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    download("openai-community/gpt2")
    err = capsys.readouterr().err
    size = len(hub_files["model.safetensors"]) / 1e6
    assert f"\rmodel.safetensors" in err and f"/{size:.1f} MB" in err and "[" + "#" * 24 + "]" in err
    assert err.count("\n") == len(hub_files)  # each file's bar ends its line


def test_an_uncached_name_offline_is_one_line_exit_1(refgpt_cli, hf_env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    status, out, err = refgpt_cli.in_process("predict", TEXT, "--model", "gpt2")
    assert status == 1 and out == ""
    assert err == (f"refgpt: error: gpt2: not a directory, and not in the HF cache (looked in "
                   f"{hf_env}/models--gpt2 (absent); {hf_env}/models--openai-community--gpt2 (absent)); "
                   "HF_HUB_OFFLINE is set, so nothing was downloaded\n")


@pytest.mark.peer
@pytest.mark.parametrize("folder", ["models--gpt2", "models--openai-community--gpt2"])
def test_predict_model_gpt2_offline_gives_hfs_logits(refgpt_cli, hf_env, hub_files, folder, monkeypatch):
    """The issue's acceptance test: a fabricated HF cache, HF_HUB_OFFLINE=1, and HF transformers'
    GPT2LMHeadModel.from_pretrained on the same snapshot (float64) as the peer."""
    torch = pytest.importorskip("torch", reason="the peer test needs the 'peers' extra")
    transformers = pytest.importorskip("transformers", reason="the peer test needs the 'peers' extra")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = fabricate_cache(hf_env, folder, hub_files)
    status, out, _ = refgpt_cli.in_process("predict", TEXT, "--model", "gpt2", "--json", "--top-k", "8192")
    answer = json.loads(out)
    assert status == 0 and answer["model"] == str(snapshot)
    tokens = [t["id"] for t in answer["tokens"]]
    hf = transformers.GPT2LMHeadModel.from_pretrained(snapshot, torch_dtype=torch.float64, local_files_only=True)
    with torch.no_grad():
        hf_logits = hf(torch.tensor([tokens])).logits[0, -1].numpy()  # [d_vocab]
    ours = np.array([t["logit"] for t in sorted(answer["top_k"], key=lambda t: t["id"])])  # [d_vocab]
    # float64 on the same float32-stored weights; the project's HF tolerance (tests/peers.py F64_TOL)
    assert np.max(np.abs(ours - hf_logits)) / max(1.0, np.max(np.abs(hf_logits))) <= 1e-12
    model = refgpt.load("openai-community/gpt2")
    assert model.source == snapshot
    np.testing.assert_array_equal(model(np.array(tokens), last_only=True)[-1], ours)


def test_an_interrupted_download_says_the_partial_file_is_kept(refgpt_cli, monkeypatch):
    def interrupted(repo_id, revision):
        raise KeyboardInterrupt

    monkeypatch.setattr("refgpt.cli.download.download_files", interrupted)
    status, out, err = refgpt_cli.in_process("download", "gpt2")
    assert status == 130 and out == ""
    assert err == "refgpt: interrupted; the partial download is kept and resumes next time\n"
