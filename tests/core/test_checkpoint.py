"""Loading: an HF checkpoint becomes exactly the circuits-notation parameters it stores (views
where the dtype allows), every shape and key is checked, and Model's own constructor checks what
it is given. (Bad files in general: test_bad_input.py; against HF: the peer tests.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

import refgpt
from random_models import hf_tensors, random_model, random_params, save_checkpoint
from refgpt import Config, Model, RefGPTError
from refgpt.files.checkpoint import compute_dtype, expected_shapes, to_circuits, weight_files
from refgpt.files.safetensors_file import SafetensorsFile

CFG = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)
UNTIED = Config(**{**CFG.__dict__, "tie_word_embeddings": False})


def raises(match):
    return pytest.raises(RefGPTError, match=match)


def model_of(cfg, seed):
    """A random model as a checkpoint holds it: tied configs have W_U = W_Eᵀ."""
    p = random_params(cfg, seed)
    if cfg.tie_word_embeddings:
        p["unembed.W_U"] = p["embed.W_E"].T
    return Model(cfg, p)


@pytest.mark.parametrize("cfg", [CFG, UNTIED])
@pytest.mark.parametrize("stored", [np.float64, np.float32])
def test_loaded_parameters_are_the_stored_numbers(tmp_path, cfg, stored):
    model = model_of(cfg, seed=3)
    if stored is np.float32:
        model = Model(cfg, {k: v.astype(np.float32).astype(np.float64) for k, v in model.params.items()})
    back = refgpt.load(save_checkpoint(model, tmp_path / "m", dtype=stored))
    assert back.cfg == cfg and set(back.params) == set(model.params)
    for k, v in model.params.items():
        assert back.params[k].dtype == np.float64 and np.array_equal(back.params[k], v), k
    tokens = np.array([[1, 5, 0, 10, 3]])
    assert np.allclose(back(tokens), model(tokens), rtol=0, atol=1e-12)
    assert np.shares_memory(back.W_U, back.W_E) == cfg.tie_word_embeddings


def test_weights_stored_in_the_compute_dtype_are_views_of_one_buffer(tmp_path):
    back = refgpt.load(save_checkpoint(model_of(CFG, seed=1), tmp_path / "m", dtype=np.float64))
    p = back.params
    # W_Q and W_K are disjoint column ranges of one c_attn: the same buffer, not the same bytes
    assert np.may_share_memory(p["blocks.0.attn.W_Q"], p["blocks.0.attn.W_K"])
    assert not p["blocks.0.attn.W_Q"].flags.owndata and np.shares_memory(back.W_U, back.W_E)
    back32 = refgpt.load(tmp_path / "m", dtype="float32")
    assert all(v.dtype == np.float32 for v in back32.params.values())


def test_a_converted_weight_leaves_no_second_copy_in_memory(tmp_path, monkeypatch):
    """Stored in float32 and computed in float64, each weight is a converted copy: its stored bytes'
    pages are dropped once it is converted (SafetensorsFile.release), so the weights are held once,
    not twice. Stored in the compute dtype, the weights are the mapped file: nothing is dropped."""
    released = []
    drop = SafetensorsFile.release
    monkeypatch.setattr(SafetensorsFile, "release", lambda self, name: (released.append(name), drop(self, name))[1])
    path = save_checkpoint(model_of(CFG, seed=4), tmp_path / "m", dtype=np.float32)
    refgpt.load(path)  # float64
    assert sorted(name.removeprefix("transformer.") for name in released) == sorted(expected_shapes(CFG))
    released.clear()
    refgpt.load(path, dtype="float32")
    assert released == []


def test_a_tokenizer_is_a_whole_pair_of_files(tmp_path):
    """vocab.json + merges.txt (or encoder.json + vocab.bpe) beside the weights become the tokenizer
    (load's docstring); one file of a pair alone is no tokenizer, and loading goes on without one."""
    path = save_checkpoint(model_of(CFG, seed=5), tmp_path / "m")
    for lone in ("vocab.json", "merges.txt", "encoder.json", "vocab.bpe"):
        (path / lone).write_text("{}" if lone.endswith(".json") else "#version: 0.2\n")
        assert refgpt.load(path).tokenizer is None, lone
        (path / lone).unlink()


def test_hf_buffers_and_a_tied_lm_head_copy_are_ignored(tmp_path):
    model = model_of(CFG, seed=2)
    t = {k: v.astype(np.float32) for k, v in hf_tensors(model).items()}
    t["transformer.h.0.attn.bias"] = np.ones((1, 1, 6, 6), np.float32)
    t["transformer.h.1.attn.masked_bias"] = np.array(-1e4, np.float32)
    t["lm_head.weight"] = np.zeros((11, 8), np.float32)  # tied: HF uses wte, whatever is stored here
    back = refgpt.load(save_checkpoint(model, tmp_path / "m", tensors=t))
    assert np.array_equal(back.W_U, back.W_E.T)
    t["transformer.h.0.attn.biasx"] = np.ones(3, np.float32)
    with raises("unexpected tensor 'transformer.h.0.attn.biasx': not part of a GPT-2"):
        refgpt.load(save_checkpoint(model, tmp_path / "n", tensors=t))


def test_untied_lm_head_is_w_u_and_required(tmp_path):
    model = model_of(UNTIED, seed=4)
    t = {k: v.astype(np.float64) for k, v in hf_tensors(model).items()}
    back = refgpt.load(save_checkpoint(model, tmp_path / "m", tensors=t))
    assert np.array_equal(back.W_U, model.W_U) and not np.array_equal(back.W_U, back.W_E.T)
    del t["lm_head.weight"]
    with raises("tensor 'lm_head.weight' is missing from the checkpoint \\(tie_word_embeddings is false"):
        refgpt.load(save_checkpoint(model, tmp_path / "n", tensors=t))


def test_shape_errors_say_which_config_value_disagrees(tmp_path):
    model = model_of(CFG, seed=5)
    t = {k: v.astype(np.float32) for k, v in hf_tensors(model).items()}
    bad = dict(t, **{"transformer.wpe.weight": np.zeros((7, 8), np.float32)})
    with raises("'transformer.wpe.weight' has shape \\[7, 8\\], expected \\[6, 8\\]: n_positions=6 in config.json"):
        refgpt.load(save_checkpoint(model, tmp_path / "a", tensors=bad))
    bad = dict(t, **{"transformer.wpe.weight": np.zeros((6, 9), np.float32)})
    with raises("has shape \\[6, 9\\], expected \\[6, 8\\]$"):
        refgpt.load(save_checkpoint(model, tmp_path / "b", tensors=bad))
    bad = dict(t, **{"transformer.h.0.mlp.c_fc.weight": np.zeros((8, 13), np.float32)})
    with raises("'transformer.h.0.mlp.c_fc.weight' has shape \\[8, 13\\], expected \\[8, 12\\]$"):
        refgpt.load(save_checkpoint(model, tmp_path / "c", tensors=bad))
    bad = dict(t, **{"transformer.h.2.ln_1.weight": np.ones(8, np.float32)})
    with raises("belongs to block 2, but config.json says n_layer=2"):
        refgpt.load(save_checkpoint(model, tmp_path / "d", tensors=bad))


def test_expected_shapes_and_to_circuits_layout():
    shapes = expected_shapes(UNTIED)
    assert shapes["h.1.attn.c_attn.weight"] == (8, 24) and shapes["h.1.mlp.c_proj.weight"] == (12, 8)
    assert shapes["lm_head.weight"] == (11, 8) and "lm_head.weight" not in expected_shapes(CFG)
    assert len(expected_shapes(CFG)) == 4 + 12 * 2
    model = model_of(CFG, seed=6)
    t = hf_tensors(model, prefix="")
    p = to_circuits(t, CFG)
    for k, v in model.params.items():
        assert np.array_equal(p[k], v), k


def test_sharded_checkpoints_and_bad_indexes(tmp_path):
    model = model_of(CFG, seed=7)
    t = {k: v.astype(np.float64) for k, v in hf_tensors(model).items()}
    d = tmp_path / "s"
    d.mkdir()
    keys = sorted(t)
    halves = {"a.safetensors": keys[::2], "b.safetensors": keys[1::2]}
    for name, ks in halves.items():
        save_file({k: t[k] for k in ks}, str(d / name))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: name for name, ks in halves.items() for k in ks}}))
    (d / "config.json").write_text(json.dumps(CFG.to_hf()))
    assert weight_files(d) == [d / "a.safetensors", d / "b.safetensors"]
    back = refgpt.load(d)
    assert all(np.array_equal(back.params[k], v) for k, v in model.params.items())
    for text in ("{", "[]", '{"weight_map": 3}', "{}"):
        (d / "model.safetensors.index.json").write_text(text)
        with raises("model.safetensors.index.json: not a valid shard index"):
            weight_files(d)
    (d / "model.safetensors.index.json").unlink()
    (d / "model.safetensors.index.json").mkdir()  # there, but unreadable
    with raises(r"model\.safetensors\.index\.json: is a directory, not a shard index$"):
        weight_files(d)
    (d / "model.safetensors.index.json").rmdir()
    with raises("no model.safetensors or model.safetensors.index.json"):
        weight_files(d)
    save_file(t, str(d / "model.safetensors"))  # one file: the shards beside it are not read
    assert weight_files(d) == [d / "model.safetensors"]


def test_compute_dtype():
    assert compute_dtype("float64") == np.float64 and compute_dtype(np.float32) == np.float32
    assert compute_dtype(np.dtype("float32")) == np.float32
    for bad in ("float16", np.float16, "int64", object()):  # (None is NumPy's float64)
        with raises("dtype must be 'float64' or 'float32', found"):
            compute_dtype(bad)


# ---- Model's own checks --------------------------------------------------------------------------


def test_model_checks_every_parameter_it_is_given():
    p = random_params(CFG, 0)
    with raises("params: unexpected parameter\\(s\\) \\['blocks.9.ln1.w'\\]"):
        Model(CFG, {**p, "blocks.9.ln1.w": np.ones(8)})
    with raises("params: 'ln_final.b' is missing"):
        Model(CFG, {k: v for k, v in p.items() if k != "ln_final.b"})
    with raises("params: 'blocks.1.mlp.W_in' is int64, expected a float array"):
        Model(CFG, {**p, "blocks.1.mlp.W_in": np.ones((8, 12), np.int64)})
    with raises("params: 'blocks.1.mlp.W_in' has shape \\[12, 8\\], expected \\[8, 12\\]"):
        Model(CFG, {**p, "blocks.1.mlp.W_in": np.ones((12, 8))})
    with raises("params: 'unembed.b_U' has shape \\[10\\], expected \\[11\\]"):
        Model(CFG, {**p, "unembed.b_U": np.ones(10)})
    with raises("dtype must be 'float64' or 'float32'"):
        Model(CFG, p, dtype="float16")


def test_unembedding_bias_is_added_and_dtype_is_end_to_end():
    p = random_params(CFG, 1)
    b_U = np.linspace(-1, 1, 11)
    tokens = np.array([3, 1, 4, 1, 5])
    plain, biased = Model(CFG, p), Model(CFG, {**p, "unembed.b_U": b_U})
    assert np.allclose(biased(tokens) - plain(tokens), b_U, rtol=0, atol=1e-13)
    assert np.array_equal(biased.b_U, b_U) and not plain.b_U.any() and plain.b_U.shape == (11,)
    m32 = Model(CFG, {**p, "unembed.b_U": b_U}, dtype="float32")
    assert all(v.dtype == np.float32 for v in m32.params.values())
    logits, cache = m32.run_with_cache(tokens)
    assert logits.dtype == np.float32 and all(cache[k].dtype == np.float32 for k in cache.keys())
    assert np.allclose(logits, biased(tokens), rtol=0, atol=1e-4)
    params = Model(CFG, p).params
    with pytest.raises(TypeError):
        params["ln_final.b"] = np.zeros(8)  # read-only: a new model for new weights
