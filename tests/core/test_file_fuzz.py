"""Fuzzing the files a checkpoint directory holds: config.json, the shard index, vocab.json and
merges.txt. Whatever the mutation, ``refgpt.load`` gives a model or a one-line RefGPTError —
never another exception (the safetensors bytes have their own differential fuzz test)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import save_file

import refgpt
from fuzzing import fuzz_settings, json_values, refused_cleanly, text_mutation
from random_models import random_model
from refgpt import Config
from refgpt.files.saving import hf_tensors
from refgpt.gpt2.tokenizer import Tokenizer, bytes_to_unicode

CFG = Config(d_model=4, n_layers=2, n_heads=2, d_mlp=8, d_vocab=260, n_ctx=5, tie_word_embeddings=False)
SYMBOLS = [bytes_to_unicode()[b] for b in range(256)]
TOKENIZER = Tokenizer({**{c: i for i, c in enumerate(SYMBOLS)}, "ab": 256, "abc": 257, "Ġt": 258, "<|endoftext|>": 259},
                      [("a", "b"), ("ab", "c"), ("Ġ", "t")])
OUTCOMES: dict[str, dict[str, int]] = {}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A saved checkpoint with a tokenizer, and a two-shard copy of it."""
    model = random_model(CFG, seed=5)
    model.tokenizer = TOKENIZER
    single = refgpt.save(model, tmp_path_factory.mktemp("single"))
    sharded = tmp_path_factory.mktemp("sharded")
    for name in ("config.json", "vocab.json", "merges.txt"):
        shutil.copy(single / name, sharded / name)
    tensors = {k: np.ascontiguousarray(v, np.float32) for k, v in hf_tensors(CFG, model.params).items()}
    names = sorted(tensors)
    index = {}
    for shard, part in (("a.safetensors", names[::2]), ("b.safetensors", names[1::2])):
        save_file({k: tensors[k] for k in part}, str(sharded / shard))
        index.update({k: shard for k in part})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    return single, sharded


def count(test: str, outcome: str):
    OUTCOMES.setdefault(test, {}).setdefault(outcome, 0)
    OUTCOMES[test][outcome] += 1


@st.composite
def json_file_mutation(draw, original: dict, keys: list[str], text=True):
    """The JSON text of ``original`` with one key set to any JSON value, removed, or the text mutated."""
    kind = draw(st.sampled_from(["value", "value", "remove"] + (["text"] if text else [])))
    data = json.loads(json.dumps(original))
    if kind == "text":
        return text_mutation(draw, json.dumps(original, indent=1))
    key = draw(st.sampled_from(keys))
    if kind == "remove":
        data.pop(key, None)
    else:
        data[key] = draw(json_values())
    return json.dumps(data)


CONFIG_KEYS = ["n_embd", "n_layer", "n_head", "n_inner", "vocab_size", "n_positions", "layer_norm_epsilon",
               "activation_function", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
               "reorder_and_upcast_attn", "tie_word_embeddings", "add_cross_attention", "model_type"]


@pytest.mark.slow
@fuzz_settings(120)
@given(data=st.data())
def test_any_config_json_loads_or_is_refused_in_one_line(base, tmp_path, data):
    single, _ = base
    directory = tmp_path / "m"
    shutil.copytree(single, directory, dirs_exist_ok=True)
    original = json.loads((single / "config.json").read_text())
    (directory / "config.json").write_text(data.draw(json_file_mutation(original, CONFIG_KEYS)))
    count("config.json", refused_cleanly(lambda: refgpt.load(directory)))


@pytest.mark.slow
@fuzz_settings(80)
@given(data=st.data())
def test_any_shard_index_loads_or_is_refused_in_one_line(base, tmp_path, data):
    _, sharded = base
    directory = tmp_path / "s"
    shutil.copytree(sharded, directory, dirs_exist_ok=True)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    kind = data.draw(st.sampled_from(["top", "entry", "text"]))
    if kind == "top":
        text = data.draw(json_file_mutation(index, ["weight_map", "metadata"]))
    elif kind == "entry":
        text = json.dumps({**index, "weight_map": json.loads(data.draw(json_file_mutation(
            index["weight_map"], [*index["weight_map"], "transformer.extra", "wte.weight"], text=False)))})
    else:
        text = text_mutation(data.draw, json.dumps(index, indent=1))
    (directory / "model.safetensors.index.json").write_text(text)
    count("shard index", refused_cleanly(lambda: refgpt.load(directory)))


@pytest.mark.slow
@fuzz_settings(120)
@given(data=st.data())
def test_any_vocab_or_merges_loads_or_is_refused_in_one_line(base, tmp_path, data):
    single, _ = base
    which = data.draw(st.sampled_from(["vocab.json", "merges.txt"]))
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(single / name, tmp_path / name)
    text = (single / which).read_text(encoding="utf-8")
    if which == "vocab.json" and data.draw(st.booleans()):
        vocab = json.loads(text)
        text = data.draw(json_file_mutation(vocab, [*list(vocab)[250:], "new", "<|endoftext|>"], text=False))
    else:
        text = text_mutation(data.draw, text)
    encoding = data.draw(st.sampled_from(["utf-8", "utf-16", "latin-1"]))
    (tmp_path / which).write_bytes(text.encode(encoding, errors="replace"))
    count(which, refused_cleanly(lambda: Tokenizer.from_dir(tmp_path)))


def test_the_fuzzers_saw_both_outcomes():
    if not OUTCOMES:
        pytest.skip("run together with the fuzz tests")
    for what, outcomes in OUTCOMES.items():
        assert outcomes.get("refused", 0) >= 5, (what, outcomes)
