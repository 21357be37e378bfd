"""``refgpt golden`` then ``refgpt compare``, as a user runs them (subprocesses): the golden file's
contents and metadata, exit status 0 / 1 / 2, the table naming the first divergence, --json."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from safetensors.numpy import save_file

import refgpt
from random_models import random_model, save_checkpoint
from refgpt import Config
from refgpt.oracle import golden

pytestmark = pytest.mark.slow  # every test here writes and compares golden files end to end, a second or more each

CFG = Config(d_model=16, n_layers=2, n_heads=2, d_mlp=32, d_vocab=30, n_ctx=10)


@pytest.fixture(scope="module")
def files(refgpt_cli, tmp_path_factory):
    """A random checkpoint, a token file, and float64 and float32 golden files made by the CLI."""
    tmp = tmp_path_factory.mktemp("golden")
    model = random_model(CFG, seed=4)
    ckpt = save_checkpoint(model, tmp / "model")  # float32 weights on disk
    (tmp / "ids.txt").write_text("1 2 3 4 5 6\n7 8 9 10 11 12\n")
    g64 = refgpt_cli("golden", "--tokens", tmp / "ids.txt", "-o", tmp / "g64.safetensors", "--model", ckpt)
    g32 = refgpt_cli("golden", "--tokens", tmp / "ids.txt", "-o", tmp / "g32.safetensors", "--model", ckpt,
                     "--dtype", "float32", "--json")
    assert g64.returncode == 0 and g32.returncode == 0, g64.stderr + g32.stderr
    return tmp, ckpt, g64, g32


def test_golden_file_holds_every_activation_and_its_metadata(files):
    tmp, ckpt, g64, g32 = files
    assert "wrote" in g64.stdout and "tensors" in g64.stdout
    summary = json.loads(g32.stdout)
    assert summary["dtype"] == "float32" and summary["tokens_shape"] == [2, 6]
    g = golden.read(tmp / "g64.safetensors")
    model = refgpt.load(ckpt)
    assert list(g.tensors) == golden.golden_names(model)
    expected = golden.compute(model, np.array([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]))
    for name, value in expected.items():
        assert np.array_equal(g.tensors[name], value), name
    meta = g.metadata
    assert meta["format"] == "refgpt-golden" and meta["refgpt_version"] == refgpt.__version__
    assert json.loads(meta["config"]) == model.cfg.to_hf() and meta["dtype"] == "float64"
    sha = hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
    assert json.loads(meta["weights_sha256"]) == {"model.safetensors": sha}
    assert meta["numpy_version"] == np.__version__ and "blas" in json.loads(meta["blas"])
    assert json.loads(meta["command"])[:2] == ["refgpt", "golden"]
    assert set(g.conditioning) == {n for n, a in g.tensors.items() if a.dtype.kind == "f"} | {"probs"}


def test_compare_float32_golden_with_float64_golden_exits_0(refgpt_cli, files):
    tmp = files[0]
    result = refgpt_cli("compare", tmp / "g64.safetensors", tmp / "g32.safetensors")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "profile float32" in result.stdout and result.stdout.rstrip().endswith("tensors within tolerance")


def test_compare_names_the_first_divergence_and_exits_1(refgpt_cli, files):
    tmp, ckpt = files[0], files[1]
    model = refgpt.load(ckpt, dtype="float32")

    def inject(a, name):
        a = a.copy()
        a[0, 3, 9] += 0.25
        return a

    cand = golden.compute(model, np.array([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]),
                          fwd_hooks=[("blocks.1.mlp.hook_pre", inject)])
    np.savez(tmp / "cand.npz", **cand)
    result = refgpt_cli("compare", tmp / "g64.safetensors", tmp / "cand.npz")
    assert result.returncode == 1 and result.stderr == ""
    assert "first divergence: blocks.1.mlp.hook_pre (layer 1), first at batch 0, pos 3, d_mlp 9" in result.stdout
    as_json = refgpt_cli("compare", tmp / "g64.safetensors", tmp / "cand.npz", "--json")
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert report["ok"] is False and report["first_divergence"]["name"] == "blocks.1.mlp.hook_pre"
    assert report["first_divergence"]["first_bad"]["index"] == [0, 3, 9]
    loose = refgpt_cli("compare", tmp / "g64.safetensors", tmp / "cand.npz", "--atol", "1", "--json")
    assert loose.returncode == 0 and json.loads(loose.stdout)["ok"] is True


def test_golden_text_uses_the_model_tokenizer_and_names_select_tensors(refgpt_cli, tmp_path):
    out = tmp_path / "g.safetensors"
    result = refgpt_cli("golden", "Hello", "-o", out, "--names", "blocks.*.hook_resid_post", "--names", "ln_final.*")
    assert result.returncode == 0, result.stderr
    g = golden.read(out)
    model = refgpt.load_default()
    assert np.array_equal(g.tensors["tokens"], model.to_tokens("Hello", prepend_bos=False)[0][None])
    n = model.cfg.n_layers
    assert list(g.tensors) == (["tokens"] + [f"blocks.{L}.hook_resid_post" for L in range(n)]
                               + ["ln_final.hook_mean", "ln_final.hook_scale", "ln_final.hook_normalized",
                                  "ln_final.out", "logits", "log_probs", "targets", "loss"])


def test_usage_errors_exit_2_and_bad_files_exit_1_with_one_line(refgpt_cli, files, tmp_path):
    tmp = files[0]
    both = refgpt_cli("compare", tmp / "g64.safetensors", tmp / "g32.safetensors", "--profile", "float32", "--atol", "1")
    assert both.returncode == 2 and both.stderr == "refgpt: error: give either --profile or --atol/--rtol, not both\n"
    neither = refgpt_cli("golden", "-o", tmp_path / "x.safetensors")
    assert neither.returncode == 2 and neither.stderr == "refgpt: error: give either TEXT or --tokens FILE\n"
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    junk = refgpt_cli("compare", tmp / "g64.safetensors", tmp_path / "junk.safetensors")
    assert junk.returncode == 1 and junk.stderr.count("\n") == 1 and "junk.safetensors" in junk.stderr
    (tmp_path / "ids.txt").write_text("1 2 x\n")
    bad_ids = refgpt_cli("golden", "--tokens", tmp_path / "ids.txt", "-o", tmp_path / "y.safetensors", "--model", files[1])
    assert bad_ids.returncode == 1 and bad_ids.stderr == f"refgpt: error: {tmp_path / 'ids.txt'}, line 1: 'x' is not an integer token id\n"
    pattern = refgpt_cli("golden", "Hi", "-o", tmp_path / "z.safetensors", "--names", "blocks.9.*")
    assert pattern.returncode == 1 and "'blocks.9.*' matches no tensor" in pattern.stderr


def test_compare_reads_hf_named_safetensors_with_map(refgpt_cli, files):
    tmp, ckpt = files[0], files[1]
    model = refgpt.load(ckpt, dtype="float32")
    g = golden.compute(model, np.array([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]))
    hf = {"logits": g["logits"], "hidden_states.0": g["blocks.0.hook_resid_pre"],
          "hidden_states.1": g["blocks.1.hook_resid_pre"], "hidden_states.2": g["ln_final.out"]}
    save_file(hf, str(tmp / "hf.safetensors"))
    result = refgpt_cli("compare", tmp / "g64.safetensors", tmp / "hf.safetensors", "--map", "hf")
    assert result.returncode == 0, result.stdout
    assert "ln_final.out" in result.stdout
