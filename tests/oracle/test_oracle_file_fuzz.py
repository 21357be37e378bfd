"""Fuzzing the oracle's files: golden files (metadata and tensors) and llm.c's checkpoint,
tokenizer, debug-state and activation files. Whatever the mutation, reading (and comparing)
gives an answer or a one-line RefGPTError — never another exception."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings, json_values, refused_cleanly, text_mutation
from random_models import random_params
from refgpt import Config, Model
from refgpt.oracle import comparison as oracle
from refgpt.oracle import golden, llmc
from refgpt.gpt2.tokenizer import Tokenizer, bytes_to_unicode

CFG = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=32, d_vocab=258, n_ctx=4)
TOKENS = np.array([[1, 2, 97]])
OUTCOMES: dict[str, dict[str, int]] = {}

# A reference value near float64's limit makes the float32-ulp column overflow (reported as inf).
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")


def count(what, outcome):
    OUTCOMES.setdefault(what, {}).setdefault(outcome, 0)
    OUTCOMES[what][outcome] += 1


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    p = random_params(CFG, 1)
    p["unembed.W_U"] = p["embed.W_E"].T  # llm.c ties W_U to W_E
    model = Model(CFG, p)
    symbols = [bytes_to_unicode()[b] for b in range(256)]
    tokenizer = Tokenizer({**{c: i for i, c in enumerate(symbols)}, "ab": 256, "<|endoftext|>": 257}, [("a", "b")])
    d = tmp_path_factory.mktemp("oracle")
    g = golden.make(model, TOKENS)
    return {
        "golden": (golden.write(d / "g.safetensors", g).read_bytes(), g),
        "model.bin": llmc.write_model(d / "m.bin", model).read_bytes(),
        "tokenizer.bin": llmc.write_tokenizer(d / "t.bin", tokenizer).read_bytes(),
        "state.bin": llmc.write_debug_state(d / "s.bin", model, TOKENS, grads=False).read_bytes(),
        "acts.bin": llmc.write_activations(d / "a.bin", g.tensors, CFG).read_bytes(),
    }


def byte_mutation(draw, data: bytes) -> bytes:
    kind = draw(st.sampled_from(["truncate", "flip", "append", "header_int"]))
    if kind == "truncate":
        return data[: draw(st.integers(0, len(data) - 1))]
    if kind == "append":
        return data + draw(st.binary(min_size=1, max_size=16))
    if kind == "header_int":  # llm.c headers are 256 int32s: set one to an extreme value
        i = draw(st.integers(0, 15))
        value = draw(st.sampled_from([0, -1, 1, 2**31 - 1, -(2**31), 3, 1024, 50257]))
        return data[: 4 * i] + struct.pack("<i", value) + data[4 * i + 4:]
    i = draw(st.integers(0, len(data) - 1))
    return data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]


@pytest.mark.slow
@fuzz_settings(100)
@given(data=st.data())
def test_llmc_files_read_or_are_refused_in_one_line(files, tmp_path, data):
    which = data.draw(st.sampled_from(["model.bin", "tokenizer.bin", "state.bin", "acts.bin"]))
    path = tmp_path / which
    path.write_bytes(byte_mutation(data.draw, files[which]))
    read = {"model.bin": lambda: llmc.read_model(path),
            "tokenizer.bin": lambda: llmc.read_tokenizer(path),
            "state.bin": lambda: llmc.read_debug_state(path, CFG.d_vocab),
            "acts.bin": lambda: llmc.read_activations(path, CFG, *TOKENS.shape)}[which]
    count(which, refused_cleanly(read))


GOLDEN_KEYS = ["config", "conditioning", "format", "dtype"]


@pytest.mark.slow
@fuzz_settings(100)
@given(data=st.data())
def test_golden_files_compare_or_are_refused_in_one_line(files, tmp_path, data):
    raw, g = files["golden"]
    path = tmp_path / "g.safetensors"
    kind = data.draw(st.sampled_from(["metadata_json", "metadata_text", "tensor", "bytes"]))
    if kind == "bytes":
        path.write_bytes(byte_mutation(data.draw, raw))
    else:
        metadata, tensors = dict(g.metadata), dict(g.tensors)
        if kind == "metadata_json":
            metadata[data.draw(st.sampled_from(GOLDEN_KEYS))] = json.dumps(data.draw(json_values()))
        elif kind == "metadata_text":
            key = data.draw(st.sampled_from(["config", "conditioning"]))
            metadata[key] = text_mutation(data.draw, metadata[key])
        else:
            name = data.draw(st.sampled_from(sorted(tensors)))
            a = np.array(tensors[name])
            if a.dtype.kind == "f" and a.size:
                a.flat[data.draw(st.integers(0, a.size - 1))] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e300]))
            else:
                a = a[..., :0] if data.draw(st.booleans()) else a.astype(np.float32)
            tensors[name] = a
        golden.write(path, golden.Golden(tensors, metadata))
    count("golden", refused_cleanly(lambda: oracle.compare(path, g.tensors)))


def test_the_fuzzers_saw_both_outcomes():
    if not OUTCOMES:
        pytest.skip("run together with the fuzz tests")
    for what, outcomes in OUTCOMES.items():
        assert outcomes.get("refused", 0) >= 3, (what, outcomes)
