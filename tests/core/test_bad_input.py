"""Bad input gets a RefGPTError that names the file, key, shape or value at fault — never a crash
from deep inside, never a silently wrong number."""

from __future__ import annotations

import dataclasses
import json
import struct

import numpy as np
import pytest

import refgpt
from random_models import hf_tensors, random_model, save_checkpoint
from refgpt import Config, RefGPTError
from refgpt.errors import RefGPTTypeError

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


@pytest.mark.parametrize("name", ["x" * 5000, "y" * 300])  # ENAMETOOLONG: the whole path, one component
def test_a_path_the_file_system_refuses_is_one_error_naming_it(tmp_path, name):
    with raises(r"^[^\n]*(x|y){20}[^\n]*: cannot open \(File name too long\)$"):
        refgpt.load(name if len(name) > 4096 else tmp_path / name)


def test_an_unreadable_config_is_one_error_naming_it(ckpt, monkeypatch):  # EACCES (the tests may run as root)
    real = type(ckpt).read_bytes

    def refuse(path):
        if path.name == "config.json":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(type(ckpt), "read_bytes", refuse)
    with raises(r"config\.json: cannot open \(Permission denied\)$"):
        refgpt.load(ckpt)


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
    with raises("config.json says n_layer=3, but the checkpoint holds 2 blocks"):
        refgpt.load(ckpt)


def test_a_million_layers_fail_fast(ckpt):
    """Refused before any n_layer-long structure is built (it took 38 s and gigabytes before)."""
    import time

    edit_config(ckpt, n_layer=1_000_000)
    start = time.process_time()
    with raises("n_layer=1000000, but the checkpoint holds 2 blocks"):
        refgpt.load(ckpt)
    assert time.process_time() - start < 5  # a generous bound on a check that takes milliseconds


def test_a_model_too_big_for_the_machine_is_refused_before_allocating(ckpt):
    edit_config(ckpt, n_layer=1_000_000, n_embd=768, n_head=12, vocab_size=50257)
    with raises(r"config.json: this model needs at least [\d,.]+ [KMGT]iB .* but the machine has [\d,.]+ [KMGT]iB available"):
        refgpt.load(ckpt)
    with raises("this model needs at least"):
        refgpt.Model(Config(d_model=2**16, n_layers=2**14, n_heads=1, d_mlp=1, d_vocab=1, n_ctx=1), {})


def test_weights_already_in_memory_are_not_asked_for_twice(model, ckpt, monkeypatch):
    """refgpt.load checks the whole model (weights + one pass) against MemAvailable before reading
    the file; Model(...), built from arrays the process already holds in its dtype, must then ask
    only for what is still to come. It asked for everything again, after the weights had taken
    their share of MemAvailable: GPT-2 XL in float64 on a 24 GB machine (11.9 GB of weights, 12.3 GB
    asked, 10.6 GB left) was refused though it fits."""
    import refgpt.gpt2.config

    cfg, params = model.cfg, dict(model.params)
    weights = sum({a.__array_interface__["data"][0]: a.nbytes for a in params.values()}.values())  # a tied W_U once
    rest = cfg.bytes_needed(8) - weights  # one forward pass's activations
    monkeypatch.setattr(refgpt.gpt2.config, "available_memory", lambda: rest)
    refgpt.Model(cfg, params)  # float64 arrays held: only the activations are still needed
    with raises(r"needs at least [\d,.]+ [KMG]iB for its weights"):  # float32 arrays: a float64 copy is needed
        refgpt.Model(cfg, {k: v.astype(np.float32) for k, v in params.items()})
    with raises("needs at least"):  # the whole model before the file is read
        refgpt.load(ckpt)
    monkeypatch.setattr(refgpt.gpt2.config, "available_memory", lambda: rest - 1)
    with raises(r"needs at least [\d,.]+ [KMG]iB more \(besides [\d,.]+ [KMG]iB of weights already in memory\)"):
        refgpt.Model(cfg, params)
    monkeypatch.setattr(refgpt.gpt2.config, "available_memory", lambda: cfg.bytes_needed(8))
    assert refgpt.load(ckpt).cfg == cfg


def test_a_tokenizer_decides_whether_a_bos_is_prepended_and_may_be_dropped(model):
    from refgpt.gpt2.tokenizer import Tokenizer, bytes_to_unicode

    model = refgpt.Model(dataclasses.replace(model.cfg), dict(model.params))  # its own cfg: the setter writes to it
    symbols = [bytes_to_unicode()[b] for b in range(256)]  # a byte-level vocabulary without <|endoftext|>
    assert model.cfg.default_prepend_bos
    model.tokenizer = Tokenizer({c: i for i, c in enumerate(symbols)}, [])
    assert model.tokenizer.bos_token_id is None and not model.cfg.default_prepend_bos  # no BOS to prepend
    model.tokenizer = None  # dropping it leaves the setting as it is
    assert model.tokenizer is None and not model.cfg.default_prepend_bos
    assert model(np.array([1, 2])).shape == (2, CFG.d_vocab)


def test_run_with_cache_incl_bwd_needs_a_loss(model):
    with raises(r"incl_bwd=True needs return_type='loss'"):
        model.run_with_cache(np.array([[1, 2, 3]]), incl_bwd=True)


def test_model_takes_a_config_and_a_mapping_of_arrays(model):
    params = dict(model.params)
    with pytest.raises(RefGPTTypeError, match="Model: cfg must be a refgpt.Config, found dict"):
        refgpt.Model(dict(vars(CFG)), params)
    with pytest.raises(RefGPTTypeError, match="Model: params must be a mapping of name → array, found list"):
        refgpt.Model(CFG, list(params.items()))


@pytest.mark.parametrize("edit,match", [
    ({"layer_norm_epsilon": float("inf")}, "Infinity is not a JSON number"),
    ({"layer_norm_epsilon": 0}, "layer_norm_epsilon must be a finite number > 0"),
    ({"layer_norm_epsilon": -1e-5}, "layer_norm_epsilon must be a finite number > 0"),
    ({"layer_norm_epsilon": 1e308 * 10}, "Infinity is not a JSON number"),
    ({"n_layer": True}, "n_layers must be a positive integer, found True"),
    ({"n_embd": 8.0}, "d_model must be a positive integer, found 8.0"),
    ({"activation_function": ["gelu"]}, r"unknown activation_function \['gelu'\]"),
    ({"model_type": ["gpt2"]}, r"model_type is \['gpt2'\]"),
    ({"add_cross_attention": "no"}, "add_cross_attention must be true or false"),
    ({"n_positions": 2**40}, "n_ctx=1099511627776 is larger than any GPT-2"),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings must be true or false, found 1"),
])
def test_config_types_and_ranges(ckpt, edit, match):
    edit_config(ckpt, **edit)
    with raises(match):
        refgpt.load(ckpt)


@pytest.mark.parametrize("text,match", [
    ('{"n_layer": ' + "9" * 5000 + "}", "config.json: not valid JSON .*4300 digits|config.json: .*digits"),
    ("[" * 100_000, "config.json: JSON nested too deeply"),
    ('{"n_layer": 2, "n_layer": 3}', "config.json: key 'n_layer' appears twice"),
])
def test_config_json_that_python_would_misread(ckpt, text, match):
    (ckpt / "config.json").write_text(text)
    with raises(match):
        refgpt.load(ckpt)


def test_a_huge_integer_from_python_is_shown_short():
    with raises("an integer of 16,610 bits"):
        Config(d_model=10**5000, n_layers=1, n_heads=1, d_mlp=1, d_vocab=1, n_ctx=1)


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
    ([1, 12, 2, 11], "id 12 at position 1 is outside"),  # the first bad id is the one named
    ([[1, 12], [-1, 0]], "id 12 at index \\(0, 1\\) is outside"),
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


@pytest.mark.parametrize("selector", [3, 2.5, b"hook_embed"])
def test_hook_selector_of_a_wrong_type(model, selector):
    # TransformerLens raises ValueError or TypeError; refgpt a RefGPTError naming the selector
    with raises("run_with_cache names_filter: expected a hook name, a list of names, a predicate"):
        model.run_with_cache([1, 2], names_filter=selector)
    with raises("add_hook: expected a hook name"):
        model.add_hook(selector, lambda a, hook: None)
    with raises("fwd_hooks: expected a hook name"):
        model.run_with_hooks([1, 2], fwd_hooks=[(selector, lambda a, hook: None)])


def test_hook_returning_wrong_shape_or_dtype(model):
    with raises(r"hook at blocks.0.hook_resid_pre: returned shape \[1, 2, 7\], expected \[1, 2, 8\]"):
        model.run_with_hooks([1, 2], fwd_hooks=[("blocks.0.hook_resid_pre", lambda a, n: a[..., :7])])
    with raises("returned float32, expected float64 \\(refgpt does not cast silently\\)"):
        model.run_with_hooks([1, 2], fwd_hooks=[("blocks.0.hook_resid_pre", lambda a, n: a.astype(np.float32))])


# ---- ambiguous checkpoints (issue 12) ------------------------------------------------------------


def test_a_weight_stored_with_and_without_the_prefix_is_ambiguous(tmp_path, model):
    tensors = {k: v.astype(np.float32) for k, v in hf_tensors(model).items()}
    tensors["ln_f.bias"] = tensors["transformer.ln_f.bias"] + 1  # a second, different copy
    ckpt = save_checkpoint(model, tmp_path / "m", tensors=tensors)
    with raises(r"tensor '(transformer\.)?ln_f.bias' is stored twice: also as '(transformer\.)?ln_f.bias'; which copy is meant is ambiguous"):
        refgpt.load(ckpt)  # in the same file: no second file named


def sharded(tmp_path, model, mutate=lambda shards, index: None):
    """A two-shard checkpoint with an index, after ``mutate(shards, index)``."""
    from safetensors.numpy import save_file

    directory = save_checkpoint(model, tmp_path / "s")
    (directory / "model.safetensors").unlink()
    (directory / "refgpt-manifest.json").unlink()  # re-sharded by other hands: no longer refgpt.save's directory
    tensors = {k: v.astype(np.float32) for k, v in hf_tensors(model).items()}
    names = sorted(tensors)
    shards = {"a.safetensors": {k: tensors[k] for k in names[::2]},
              "b.safetensors": {k: tensors[k] for k in names[1::2]}}
    index = {"metadata": {}, "weight_map": {k: f for f, part in shards.items() for k in part}}
    mutate(shards, index)
    for f, part in shards.items():
        save_file(part, str(directory / f))
    (directory / "model.safetensors.index.json").write_text(
        index if isinstance(index, str) else json.dumps(index))
    return directory


def test_a_sharded_checkpoint_loads(tmp_path, model):
    loaded = refgpt.load(sharded(tmp_path, model), tokenizer=False)
    assert np.array_equal(loaded.params["blocks.1.mlp.W_in"], model.params["blocks.1.mlp.W_in"].astype(np.float32))


def _in_both(shards, index):
    shards["b.safetensors"]["transformer.wte.weight"] = shards["a.safetensors"].get(
        "transformer.wte.weight", shards["b.safetensors"].get("transformer.wte.weight"))
    shards["a.safetensors"]["transformer.wte.weight"] = shards["b.safetensors"]["transformer.wte.weight"]


def _bare_copy_in_the_other_shard(shards, index):
    """ln_f.bias beside transformer.ln_f.bias, in the other shard, both listed in the index."""
    holder = next(f for f, part in shards.items() if "transformer.ln_f.bias" in part)
    other = ({"a.safetensors", "b.safetensors"} - {holder}).pop()
    shards[other]["ln_f.bias"] = shards[holder]["transformer.ln_f.bias"]
    index["weight_map"]["ln_f.bias"] = other


@pytest.mark.parametrize("mutate,match", [
    (_in_both, r"holds tensor 'transformer.wte.weight', which the shard index places in"),
    (_bare_copy_in_the_other_shard, r"[ab]\.safetensors: tensor '(transformer\.)?ln_f.bias' is stored twice: also as "
                                    r"'(transformer\.)?ln_f.bias' in \S+/[ab]\.safetensors; which copy is meant is ambiguous"),
    (lambda s, i: i["weight_map"].update({"transformer.h.0.ln_1.weight": "c.safetensors"}), "names shard 'c.safetensors', which does not exist"),
    (lambda s, i: i.update(weight_map={}), "'weight_map' must be a non-empty object"),
    (lambda s, i: i.update(weight_map=[]), "'weight_map' must be a non-empty object"),
    (lambda s, i: i["weight_map"].update({"transformer.wte.weight": 3}), r"weight_map\['transformer.wte.weight'\] must be a file name"),
    (lambda s, i: i["weight_map"].update({"transformer.wte.weight": "../a.safetensors"}), "must be a file name beside the index"),
    (lambda s, i: i["weight_map"].update({"extra.tensor": "a.safetensors"}), "lists tensor 'extra.tensor', but the shard does not hold it"),
    (lambda s, i: s["a.safetensors"].update(stray=np.zeros(1, np.float32)), "holds tensor 'stray', which the shard index does not list"),
])
def test_shard_index_problems_are_errors(tmp_path, model, mutate, match):
    with raises(match):
        refgpt.load(sharded(tmp_path, model, mutate), tokenizer=False)


@pytest.mark.parametrize("text,match", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"weight_map": {"a": "a.safetensors", "a": "b.safetensors"}}', "key 'a' appears twice"),
    ("\xff", "not a valid shard index: not valid JSON \\(not UTF-8 text"),
])
def test_broken_shard_index_json(tmp_path, model, text, match):
    with raises(match):
        refgpt.load(_with_index(tmp_path, model, text))


def _with_index(tmp_path, model, text):
    directory = sharded(tmp_path, model)
    (directory / "model.safetensors.index.json").write_text(text, encoding="latin-1")
    return directory


@pytest.mark.filterwarnings("ignore:overflow encountered in matmul:RuntimeWarning")  # the overflow tested
def test_logits_that_overflow_in_the_unembedding_are_refused_naming_the_logits(model):
    """Every hook point finite, the logits not: the unembedding's sum overflowed (float32 here)."""
    params = dict(model.params)
    params["ln_final.w"] = np.zeros(CFG.d_model)
    params["ln_final.b"] = np.ones(CFG.d_model)  # the final stream: all ones
    params["unembed.W_U"] = np.full((CFG.d_model, CFG.d_vocab), 1e38)  # 8 · 1e38 > float32's max
    big = refgpt.Model(CFG, params, dtype="float32")
    with raises(r"the forward pass produced inf in the logits \(index \[0, 0, 0\]\) from finite input: "
                "the unembedding overflowed"):
        big(np.array([[1, 2]]))


@pytest.mark.parametrize("tokens", [[[1, 2], [3]], [[1, 2], 3]])
def test_ragged_token_lists_are_refused(model, tokens):
    with raises("tokens: not a rectangular integer array"):
        model(tokens)
