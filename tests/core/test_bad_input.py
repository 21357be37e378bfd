"""Bad input gets a RefGPTError that names the file, key, shape or value at fault — never a crash
from deep inside, never a silently wrong number."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import refgpt
from random_models import hf_tensors, random_model, save_checkpoint
from refgpt import Config, RefGPTError

CFG = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)


@pytest.fixture
def model():
    return random_model(CFG, seed=1)


@pytest.fixture
def ckpt(tmp_path, model):
    return save_checkpoint(model, tmp_path / "m")


def test_error_is_a_value_error():
    assert issubclass(RefGPTError, ValueError)


def raises(match):
    return pytest.raises(RefGPTError, match=match)


# ---- the checkpoint ----------------------------------------------------------------------------


def test_missing_model_directory(tmp_path):
    with raises("nowhere: model directory not found"):
        refgpt.load(tmp_path / "nowhere")


def test_missing_weights_file(ckpt):
    (ckpt / "model.safetensors").unlink()
    with raises("no model.safetensors or model.safetensors.index.json"):
        refgpt.load(ckpt)


def test_empty_weights_file(ckpt):
    (ckpt / "model.safetensors").write_bytes(b"")
    with raises("model.safetensors: weights file is empty"):
        refgpt.load(ckpt)


def test_truncated_weights_file(ckpt):
    path = ckpt / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with raises("model.safetensors: tensor .* truncated"):
        refgpt.load(ckpt)


def test_file_shorter_than_header_length(ckpt):
    (ckpt / "model.safetensors").write_bytes(b"\x01\x02\x03")
    with raises("truncated: 3 bytes"):
        refgpt.load(ckpt)


def test_garbage_header(ckpt):
    (ckpt / "model.safetensors").write_bytes(struct.pack("<Q", 16) + b"\xff\xfe not json at all" + bytes(64))
    with raises("model.safetensors: header is not valid JSON"):
        refgpt.load(ckpt)


def test_header_length_past_end_of_file(ckpt):
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", len(data) * 2) + data[8:])
    with raises("header length .* runs past the end of the file"):
        refgpt.load(ckpt)


def test_header_that_is_not_an_object(ckpt):
    header = b"[1, 2, 3]"
    (ckpt / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    with raises("header is a JSON list, expected an object"):
        refgpt.load(ckpt)


def test_missing_tensor(tmp_path, model):
    tensors = {k: v.astype(np.float32) for k, v in hf_tensors(model).items()}
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    d = save_checkpoint(model, tmp_path / "m", tensors=tensors)
    with raises("'h.1.mlp.c_fc.bias' is missing"):
        refgpt.load(d)


def test_tensor_of_wrong_shape(tmp_path, model):
    tensors = {k: v.astype(np.float32) for k, v in hf_tensors(model).items()}
    tensors["transformer.h.0.attn.c_attn.weight"] = tensors["transformer.h.0.attn.c_attn.weight"][:, :-1].copy()
    d = save_checkpoint(model, tmp_path / "m", tensors=tensors)
    with raises(r"'transformer.h.0.attn.c_attn.weight' has shape \[8, 23\], expected \[8, 24\]"):
        refgpt.load(d)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weight(tmp_path, model, bad):
    tensors = {k: v.astype(np.float32) for k, v in hf_tensors(model).items()}
    tensors["transformer.h.1.ln_2.weight"][3] = bad
    d = save_checkpoint(model, tmp_path / "m", tensors=tensors)
    with raises(rf"'transformer.h.1.ln_2.weight' holds {bad} at index \(3,\)"):
        refgpt.load(d)


def test_non_float_tensor(tmp_path, model):
    tensors = {k: v.astype(np.float32) for k, v in hf_tensors(model).items()}
    tensors["transformer.wpe.weight"] = tensors["transformer.wpe.weight"].astype(np.int32)
    d = save_checkpoint(model, tmp_path / "m", tensors=tensors)
    with raises("'transformer.wpe.weight' is I32, expected a float tensor"):
        refgpt.load(d)


def test_unexpected_tensor(tmp_path, model):
    tensors = {k: v.astype(np.float32) for k, v in hf_tensors(model).items()}
    tensors["transformer.h.0.crossattention.c_attn.weight"] = np.zeros((8, 16), np.float32)
    d = save_checkpoint(model, tmp_path / "m", tensors=tensors)
    with raises("unexpected tensor 'transformer.h.0.crossattention.c_attn.weight'"):
        refgpt.load(d)


def test_missing_config(ckpt):
    (ckpt / "config.json").unlink()
    with raises("config.json: not found"):
        refgpt.load(ckpt)


def test_config_not_json(ckpt):
    (ckpt / "config.json").write_text("{'n_embd': 8,")
    with raises("config.json: not valid JSON"):
        refgpt.load(ckpt)


def edit_config(ckpt, **changes):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(changes)
    (ckpt / "config.json").write_text(json.dumps(cfg))


def test_n_head_not_dividing_n_embd(ckpt):
    edit_config(ckpt, n_head=3)
    with raises("config.json: n_head=3 does not divide n_embd=8"):
        refgpt.load(ckpt)


def test_vocab_size_disagreeing_with_tensors(ckpt):
    edit_config(ckpt, vocab_size=12)
    with raises("vocab_size=12 in config.json disagrees with the tensors \\(11 rows\\)"):
        refgpt.load(ckpt)


def test_fewer_layers_in_config_than_tensors(ckpt):
    edit_config(ckpt, n_layer=1)
    with raises("belongs to block 1, but config.json says n_layer=1"):
        refgpt.load(ckpt)


def test_more_layers_in_config_than_tensors(ckpt):
    edit_config(ckpt, n_layer=3)
    with raises("'h.2.ln_1.weight' is missing"):
        refgpt.load(ckpt)


def test_unknown_activation(ckpt):
    edit_config(ckpt, activation_function="gelu_magic")
    with raises("config.json: unknown activation_function 'gelu_magic'"):
        refgpt.load(ckpt)


def test_cross_attention_is_refused(ckpt):
    edit_config(ckpt, add_cross_attention=True)
    with raises("add_cross_attention=true .* not a decoder-only GPT-2"):
        refgpt.load(ckpt)


def test_untied_config_without_lm_head(ckpt):
    edit_config(ckpt, tie_word_embeddings=False)
    with raises("'lm_head.weight' is missing .*tie_word_embeddings is false"):
        refgpt.load(ckpt)


def test_non_integer_config_value(ckpt):
    edit_config(ckpt, n_embd=8.0)
    with raises("config.json: d_model must be a positive integer, found 8.0"):
        refgpt.load(ckpt)


def test_unknown_dtype(ckpt):
    with raises("dtype must be 'float64' or 'float32', found 'float16'"):
        refgpt.load(ckpt, dtype="float16")


# ---- the forward pass ----------------------------------------------------------------------------


@pytest.mark.parametrize("tokens, message", [
    ([1, 2, 11], "id 11 at position 2 is outside the vocabulary \\[0, 11\\)"),
    ([[1, 2], [-1, 0]], "id -1 at index \\(1, 0\\) is outside the vocabulary"),
    (np.array([1.0, 2.0]), "must be an integer array, found float64"),
    (np.array([1.5, 2.0]), "must be integers, found dtype float64"),
    (np.array([True, False]), "must be integers, found dtype bool"),
    ([], "empty sequence"),
    (np.zeros((1, 0), int), "empty sequence"),
    (np.zeros((1, 2, 3), int), "must be \\[pos\\] or \\[batch, pos\\], found 3 dimensions"),
    (np.int64(3), "must be \\[pos\\] or \\[batch, pos\\], found 0 dimensions"),
    (list(range(7)), "7 positions, but the model has only n_positions=6"),
    (["a", "b"], "no tokenizer"),  # a list of str is text (TransformerLens), which needs a tokenizer
])
def test_bad_tokens(model, tokens, message):
    with raises(message):
        model(tokens)


def test_unknown_hook_name(model):
    with raises("'blocks.0.hook_resid_pr' is not a hook point of this model; did you mean blocks.0.hook_resid_pre"):
        model.run_with_hooks([1, 2], fwd_hooks=[("blocks.0.hook_resid_pr", lambda a, n: None)])
    with raises("run_with_cache names_filter: 'blocks.9.hook_resid_pre' is not a hook point"):
        model.run_with_cache([1, 2], names=["blocks.9.hook_resid_pre"])


def test_hook_returning_wrong_shape_or_dtype(model):
    with raises(r"hook at blocks.0.hook_resid_pre: returned shape \[1, 2, 7\], expected \[1, 2, 8\]"):
        model.run_with_hooks([1, 2], fwd_hooks=[("blocks.0.hook_resid_pre", lambda a, n: a[..., :7])])
    with raises("returned float32, expected float64 \\(refgpt does not cast silently\\)"):
        model.run_with_hooks([1, 2], fwd_hooks=[("blocks.0.hook_resid_pre", lambda a, n: a.astype(np.float32))])
