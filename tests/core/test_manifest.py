"""A checkpoint directory changes as one unit (issue 24): refgpt.save writes a fresh directory and
exchanges it with the old one; refgpt-manifest.json, written last, lets refgpt.load refuse a
directory whose files were mixed by other hands (refgpt/files/manifest.py); what a save does to the
rest of the directory (carried over, dropped, refused)."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import stat

import numpy as np
import pytest

import refgpt
from random_models import random_model
from refgpt import Config, Model, RefGPTError
from refgpt.files import atomic_write

CFG_A = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=16, d_vocab=11, n_ctx=6, tie_word_embeddings=False)
# the mix: the same shapes, another eps and activation (other logits, and no word said)
CFG_B = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=16, d_vocab=11, n_ctx=6, tie_word_embeddings=False, eps=1e-3,
               act_fn="relu")
TOKENS = np.array([[1, 2, 3]])


@pytest.fixture
def two_saves(tmp_path):
    a, b = random_model(CFG_A, seed=1), random_model(CFG_B, seed=2)
    return refgpt.save(a, tmp_path / "a"), refgpt.save(b, tmp_path / "b"), a, b


@pytest.mark.parametrize("name, message", [
    ("config.json", r"config.json: \d+ bytes, but refgpt-manifest.json records \d+|config.json: its sha256 is not"),
    ("model.safetensors", r"model.safetensors: (\d+ bytes, but refgpt-manifest.json records|written by another save)"),
])
def test_a_file_of_another_save_is_refused_naming_it(two_saves, name, message):
    """The issue's mix: new weights with the old config loaded silently (other eps, other logits)."""
    a, b, *_ = two_saves
    shutil.copy(b / name, a / name)
    with pytest.raises(RefGPTError, match=message) as error:
        refgpt.load(a)
    assert "mixes files of different origins" in str(error.value) and "delete refgpt-manifest.json" in str(error.value)


def test_weights_of_the_same_size_from_another_save_are_told_apart_by_the_save_id(tmp_path):
    one, other = random_model(CFG_A, seed=1), random_model(CFG_A, seed=3)
    a, b = refgpt.save(one, tmp_path / "a"), refgpt.save(other, tmp_path / "b")
    assert (a / "model.safetensors").stat().st_size == (b / "model.safetensors").stat().st_size
    shutil.copy(b / "model.safetensors", a / "model.safetensors")
    with pytest.raises(RefGPTError, match="written by another save"):
        refgpt.load(a)


def test_a_missing_file_of_the_save_is_refused(tmp_path):
    tokenizer = refgpt.Tokenizer.from_dir(refgpt.default_model_path())
    model = random_model(dataclasses.replace(CFG_A, d_vocab=tokenizer.vocab_size), seed=1)
    model.tokenizer = tokenizer
    out = refgpt.save(model, tmp_path / "ck")
    (out / "merges.txt").unlink()
    with pytest.raises(RefGPTError, match="records merges.txt, which is missing"):
        refgpt.load(out, tokenizer=False)


def test_deleting_the_manifest_makes_it_an_ordinary_hf_directory(two_saves):
    a, b, _, model_b = two_saves
    shutil.copy(b / "config.json", a / "config.json")
    shutil.copy(b / "model.safetensors", a / "model.safetensors")
    (a / "refgpt-manifest.json").unlink()
    assert np.array_equal(refgpt.load(a)(TOKENS), model_b(TOKENS))


def test_files_the_manifest_does_not_list_are_not_its_business(two_saves):
    """A tokenizer added beside weights saved without one loads, as it always did."""
    a, *_ = two_saves
    tok = refgpt.default_model_path()
    shutil.copy(tok / "vocab.json", a / "vocab.json")
    shutil.copy(tok / "merges.txt", a / "merges.txt")
    assert refgpt.load(a).tokenizer is not None


@pytest.mark.parametrize("text, message", [("{", "not valid JSON"), ('{"format": "x"}', "'format' must be"),
                                           ('{"format": "refgpt-checkpoint", "format_version": "1", "save": "00", '
                                            '"files": {}}', "'save' must be 32 hex digits"),
                                           ('{"format": "refgpt-checkpoint", "format_version": "1", "save": "'
                                            + "0" * 32 + '", "files": {"../x": {"bytes": 1, "sha256": "' + "0" * 64
                                            + '"}}}', "is not a file name in the directory")])
def test_a_broken_manifest_is_one_line_naming_it(two_saves, text, message):
    a, *_ = two_saves
    (a / "refgpt-manifest.json").write_text(text)
    with pytest.raises(RefGPTError, match=message) as error:
        refgpt.load(a)
    assert "refgpt-manifest.json" in str(error.value) and "\n" not in str(error.value)


def test_saving_one_model_twice_writes_the_same_bytes(tmp_path):
    model = random_model(CFG_A, seed=5)
    one, two = refgpt.save(model, tmp_path / "one"), refgpt.save(model, tmp_path / "two")
    assert {p.name: p.read_bytes() for p in one.iterdir()} == {p.name: p.read_bytes() for p in two.iterdir()}


# ---- what a save does to the rest of the directory -------------------------------------------------


def test_a_save_carries_over_the_users_files_and_drops_the_old_models(tmp_path):
    out = refgpt.save(random_model(CFG_A, seed=1), tmp_path / "ck")
    (out / "README.md").write_text("my notes")
    (out / "runs").mkdir()
    (out / "runs" / "log.txt").write_text("step 1")
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "model-00001-of-00002.safetensors"}}))
    (out / "model-00001-of-00002.safetensors").write_bytes(b"an old shard")
    os.chmod(out, 0o750)
    refgpt.save(random_model(CFG_B, seed=2), out)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors",
                                                     "refgpt-manifest.json", "runs"]
    assert (out / "README.md").read_text() == "my notes" and (out / "runs" / "log.txt").read_text() == "step 1"
    assert stat.S_IMODE(out.stat().st_mode) == 0o750
    assert refgpt.load(out).cfg == CFG_B
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no staging or old directory left


def test_a_link_to_a_checkpoint_is_written_through_and_stays_a_link(tmp_path):
    real = refgpt.save(random_model(CFG_A, seed=1), tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    refgpt.save(random_model(CFG_B, seed=2), tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and refgpt.load(real).cfg == CFG_B


def test_a_save_refuses_to_replace_the_current_directory(tmp_path, monkeypatch):
    out = refgpt.save(random_model(CFG_A, seed=1), tmp_path / "ck")
    monkeypatch.chdir(out)
    with pytest.raises(RefGPTError, match="holds the current working directory"):
        refgpt.save(random_model(CFG_B, seed=2), ".")
    assert refgpt.load(out).cfg == CFG_A


def test_without_an_exchange_the_old_directory_is_renamed_aside_and_load_says_where(tmp_path, monkeypatch):
    """A file system without renameat2's exchange (NFS, macOS): the old directory is renamed aside,
    then the new one into place. Interrupted between the two, both are whole: refgpt.load of the
    path names where the old one is, and the next save removes it."""
    out = refgpt.save(random_model(CFG_A, seed=1), tmp_path / "ck")
    monkeypatch.setattr(atomic_write, "_exchange", lambda a, b: errno.EINVAL)
    refgpt.save(random_model(CFG_B, seed=2), out)
    assert refgpt.load(out).cfg == CFG_B and sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    real_rename = os.rename

    def interrupted(a, b):
        if ".refgpt-save-" in str(a) and os.path.basename(b) == "ck":  # the new directory into place: Ctrl-C first
            raise KeyboardInterrupt
        real_rename(a, b)

    monkeypatch.setattr(os, "rename", interrupted)
    with pytest.raises(KeyboardInterrupt):
        refgpt.save(random_model(CFG_A, seed=3), out)
    monkeypatch.setattr(os, "rename", real_rename)
    with pytest.raises(RefGPTError, match=r"an interrupted refgpt.save left the old model at .*\.ck\.refgpt-old-"):
        refgpt.load(out)
    old = atomic_write.old_directory_left(out)
    assert refgpt.load(old.rename(tmp_path / "rescued")).cfg == CFG_B
    with pytest.raises(RefGPTError, match="a temporary"):
        refgpt.load(tmp_path / ".ck.refgpt-save-0123456789ab")


def test_a_temporary_directory_is_refused_by_name(tmp_path):
    hidden = refgpt.save(random_model(CFG_A, seed=1), tmp_path / ".ck.refgpt-save-0123456789ab")
    with pytest.raises(RefGPTError, match="a temporary file of a refgpt writer that never finished"):
        refgpt.load(hidden)
