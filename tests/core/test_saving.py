"""refgpt.save: the inverse of refgpt.load, and an HF checkpoint transformers reads.

save → load gives the same model bit for bit (config, every parameter, the tokenizer); saving the
embedded model as float32 reproduces its shipped files byte for byte; HF's GPT2LMHeadModel loads
what save writes and computes the same logits (≤ 1e-12 relative in float64, the peer tolerance of
tests/core/test_peers_hf.py); and a failed write leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import refgpt
from random_models import random_model, rel_err
from refgpt import Config, Model, RefGPTError

CFG = Config(d_model=12, n_layers=2, n_heads=3, d_mlp=20, d_vocab=30, n_ctx=9, eps=1e-3, act_fn="gelu",
             use_attn_scale=False, scale_attn_by_inverse_layer_idx=True, tie_word_embeddings=False)


def tied(model):
    """The same model with W_U a view of W_Eᵀ, as a tied HF checkpoint loads."""
    return Model(model.cfg, {**model.params, "unembed.W_U": model.params["embed.W_E"].T}, dtype=model.dtype)


def assert_same_model(a, b):
    assert a.cfg == b.cfg and a.dtype == b.dtype
    assert list(a.params) == list(b.params)
    for name in a.params:
        assert a.params[name].dtype == b.params[name].dtype, name
        assert np.array_equal(a.params[name], b.params[name]), name


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("tie", [False, True])
def test_save_then_load_round_trips_bit_for_bit(tmp_path, dtype, tie):
    cfg = dataclasses.replace(CFG, tie_word_embeddings=tie)
    model = random_model(cfg, seed=4, dtype=dtype)
    model = tied(model) if tie else model
    refgpt.save(model, tmp_path / "m")
    back = refgpt.load(tmp_path / "m", dtype=dtype)
    assert_same_model(model, back)
    tokens = np.array([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]])
    assert np.array_equal(model(tokens), back(tokens))
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors", "refgpt-manifest.json"]


def test_saving_the_embedded_model_as_float32_reproduces_its_files(tmp_path):
    """Byte for byte, but for the n_ctx that save has written since the model was trained and the
    save id its weights' metadata has carried since 0.3 (the shipped files are as the training run
    wrote them, and its log records their sha256): the tensors are the same bytes."""
    from safetensors import safe_open

    default = refgpt.load_default()
    shipped = refgpt.default_model_path()
    shipped_config = json.loads((shipped / "config.json").read_text())
    refgpt.save(default, tmp_path / "copy", dtype="float32",
                config={"initializer_range": shipped_config["initializer_range"]})
    for name in ("vocab.json", "merges.txt"):
        assert (tmp_path / "copy" / name).read_bytes() == (shipped / name).read_bytes(), name
    with safe_open(tmp_path / "copy" / "model.safetensors", "np") as new, safe_open(shipped / "model.safetensors", "np") as old:
        assert sorted(new.keys()) == sorted(old.keys())
        assert all(new.get_tensor(k).tobytes() == old.get_tensor(k).tobytes() for k in old.keys())
        assert new.metadata() == {**old.metadata(), "refgpt_save": new.metadata()["refgpt_save"]}
    assert json.loads((tmp_path / "copy" / "config.json").read_text()) == {**shipped_config, "n_ctx": 128}
    back = refgpt.load(tmp_path / "copy")
    assert_same_model(default, back)
    assert back.to_tokens("To be, or not to be").tolist() == default.to_tokens("To be, or not to be").tolist()


def test_save_refuses_what_an_hf_checkpoint_cannot_hold(tmp_path):
    untied_weights = random_model(dataclasses.replace(CFG, tie_word_embeddings=True), seed=1)
    with pytest.raises(RefGPTError, match="W_U is not W_Eᵀ"):
        refgpt.save(untied_weights, tmp_path / "a")
    with_b_U = Model(CFG, {**random_model(CFG).params, "unembed.b_U": np.ones(CFG.d_vocab)})
    with pytest.raises(RefGPTError, match="unembedding bias"):
        refgpt.save(with_b_U, tmp_path / "b")
    with pytest.raises(RefGPTError, match="dtype"):
        refgpt.save(random_model(CFG), tmp_path / "c", dtype="float16")
    with pytest.raises(RefGPTError, match=r"^save: config would set n_ctx, n_embd, which the model itself fixes "
                                          r"\(n_ctx=9, n_embd=12\)$"):
        refgpt.save(random_model(CFG), tmp_path / "d", config={"n_embd": 16, "n_ctx": 1024, "n_layer": 2})
    assert not (tmp_path / "d").exists()


def test_save_into_something_that_is_not_a_directory_is_one_line(tmp_path):
    (tmp_path / "file").write_text("not a checkpoint")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    model = random_model(CFG)
    for target, expected in [("file", "save: '{}': exists and is not a directory"),
                             ("dangling", "save: '{}': exists and is not a directory (a link to nowhere)"),
                             ("file/sub", "save: '{}': cannot make the directory '{}' (Not a directory)")]:
        with pytest.raises(RefGPTError) as error:
            refgpt.save(model, tmp_path / target)
        assert str(error.value) == expected.format(tmp_path / target, tmp_path / "file")
    assert (tmp_path / "file").read_text() == "not a checkpoint" and not (tmp_path / "nowhere").exists()


def test_a_failed_write_leaves_no_file_and_no_temporary(tmp_path, monkeypatch):
    import refgpt.files.saving as saving

    def broken(path, data):
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(saving, "_write_new", broken)
    with pytest.raises(refgpt.RefGPTError, match=r"^save: '.*/m': cannot write \(disk full\)$"):
        refgpt.save(random_model(CFG), tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.peer
def test_hf_reads_what_save_writes_and_computes_the_same_logits(tmp_path):
    from peers import require_peers

    torch, transformers, _ = require_peers()
    for tie in (False, True):
        cfg = dataclasses.replace(CFG, tie_word_embeddings=tie)
        model = tied(random_model(cfg, seed=7)) if tie else random_model(cfg, seed=7)
        directory = refgpt.save(model, tmp_path / f"tie{tie}")
        hf = transformers.GPT2LMHeadModel.from_pretrained(directory, dtype=torch.float64).eval()
        assert hf.config.layer_norm_epsilon == cfg.eps and hf.config.activation_function == cfg.act_fn
        assert hf.config.scale_attn_weights is False and hf.config.scale_attn_by_inverse_layer_idx is True
        assert hf.config.n_positions == hf.config.n_ctx == cfg.n_ctx  # TransformerLens 3.9 reads n_ctx
        tokens = np.random.default_rng(0).integers(0, cfg.d_vocab, size=(2, cfg.n_ctx))
        with torch.no_grad():
            theirs = hf(torch.as_tensor(tokens)).logits.numpy()
        assert rel_err(model(tokens), theirs) <= 1e-12
