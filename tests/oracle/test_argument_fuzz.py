"""Fuzzing the oracle's readers with hostile *arguments* and hostile *archives* (issue 24): the
llm.c readers' B, T, V, start and token ids drawn at every integer type's edges (tests/fuzzing.py
``edge_numbers``), and .npz candidates whose members are anything a zip can hold. Whatever is drawn,
the reader gives an answer or a one-line RefGPTError — never another exception, and never an
answer read with the wrong shape: when a reader accepts, what it returns is checked against the
arguments."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import edge_integer_arrays, edge_numbers, fuzz_settings, refused_cleanly
from random_models import random_params
from refgpt import Config, Model
from refgpt.oracle import comparison as oracle
from refgpt.oracle import golden, llmc, llmc_dump

CFG = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=32, d_vocab=11, n_ctx=6)
TOKENS = np.array([[1, 2, 3, 4]])
OUTCOMES: dict[str, dict[str, int]] = {}
pytestmark = pytest.mark.filterwarnings("ignore:Duplicate name:UserWarning")  # zips with a name twice, on purpose


def count(what, outcome):
    OUTCOMES.setdefault(what, {}).setdefault(outcome, 0)
    OUTCOMES[what][outcome] += 1


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    p = random_params(CFG, 3)
    p["unembed.W_U"] = p["embed.W_E"].T
    model = Model(CFG, p)
    d = tmp_path_factory.mktemp("args")
    g = golden.make(model, TOKENS[:, :3])
    shard = d / "shard.bin"
    shard.write_bytes(llmc._header(llmc.SHARD_MAGIC, 1, 20) + np.arange(20, dtype="<u2").tobytes())
    tokenizer = type("T", (), {"vocab_size": 3, "eot_token": 2,
                               "decode_bytes": lambda self, ids: [b"a", b"bc", b"<eot>"][ids[0]]})()
    return _Files({"model": model, "golden": g, "golden_path": golden.write(d / "g.safetensors", g),
            "state": llmc.write_debug_state(d / "state.bin", model, TOKENS),
            "state_no_grads": llmc.write_debug_state(d / "state0.bin", model, TOKENS, grads=False),
            "acts": llmc.write_activations(d / "acts.bin", g.tensors, CFG), "shard": shard,
            "tokenizer": llmc.read_tokenizer(llmc.write_tokenizer(d / "tok.bin", tokenizer))})


class _Files(dict):
    def __repr__(self):  # hypothesis prints the arguments of a failing example: not the whole golden
        return "files"


READERS = ["debug_state", "debug_state_cfg", "activations", "data_shard", "decode", "decode_array", "write_model"]


@fuzz_settings(60)
@given(data=st.data())
def test_llmc_readers_take_any_argument_or_refuse_it_in_one_line(files, tmp_path, data):
    which = data.draw(st.sampled_from(READERS))
    a, b, c = (data.draw(edge_numbers()) for _ in range(3))
    B, T = TOKENS.shape[0], TOKENS.shape[1] - 1  # the debug state's x is tokens[:, :-1]

    def read():
        if which == "debug_state":
            s = llmc.read_debug_state(files["state_no_grads"], a)
            assert int(a) == CFG.d_vocab and s.logits.shape == (B, T, CFG.d_vocab)  # any V that does not fit: refused
        elif which == "debug_state_cfg":
            s = llmc.read_debug_state(files[data.draw(st.sampled_from(["state", "state_no_grads"]))], a, CFG)
            assert int(a) == CFG.d_vocab and s.logits.shape == (B, T, CFG.d_vocab)  # any other V is refused
        elif which == "activations":
            acts = llmc.read_activations(files["acts"], CFG, a, b)
            assert acts["encoded"].shape == (int(a), int(b), CFG.d_model)
        elif which == "data_shard":
            x, y = llmc.read_data_shard(files["shard"], a, b, c)
            assert x.shape == y.shape == (int(a), int(b)) and x[0, 0] == int(c)
        elif which == "decode":
            out = files["tokenizer"].decode_bytes([a])
            assert out == [b"a", b"bc", b"<eot>"][int(a)] and 0 <= int(a) < 3
        elif which == "decode_array":
            ids = data.draw(edge_integer_arrays())
            out = files["tokenizer"].decode_bytes(ids)
            assert np.ndim(ids) == 1 and out == b"".join([b"a", b"bc", b"<eot>"][int(i)] for i in ids)
        else:
            llmc.write_model(tmp_path / "m.bin", files["model"], padded_vocab_size=a)
            assert llmc.read_model(tmp_path / "m.bin").cfg == CFG

    count(which, refused_cleanly(read))


def npz_member(draw):
    """(name, bytes) of one archive member: a real .npy of any dtype, or something else under an
    .npy name (truncated, a header declaring terabytes, random bytes, a pickled object array)."""
    name = draw(st.sampled_from(["logits", "tokens", "log_probs", "blocks.0.hook_resid_pre", "dir/logits",
                                 "x" * 200, "é"]))
    kind = draw(st.sampled_from(["npy", "npy", "no_suffix", "truncated", "huge_header", "random", "object",
                                 "strings", "empty"]))
    buffer = io.BytesIO()
    if kind in ("npy", "no_suffix", "truncated"):
        dtype = draw(st.sampled_from(["float64", "float32", "float16", "int64", "uint64", "bool", "complex64"]))
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
        np.save(buffer, np.ones(shape, dtype=dtype))
        raw = buffer.getvalue()
        if kind == "truncated":
            raw = raw[: draw(st.integers(0, len(raw) - 1))] if raw else raw
        return (name if kind == "no_suffix" else name + ".npy"), raw
    if kind == "huge_header":
        header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }"
        header += " " * (-(len(header) + 11) % 64) + "\n"
        return name + ".npy", b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()
    if kind == "object":
        return name + ".npy", b"\x93NUMPY\x01\x00v\x00{'descr': '|O', 'fortran_order': False, 'shape': (1,), }" + b" " * 50 + b"\n"
    if kind == "strings":
        np.save(buffer, np.array(["a", "b"]))
        return name + ".npy", buffer.getvalue()
    if kind == "empty":
        return name + ".npy", b""
    return name + ".npy", draw(st.binary(max_size=64))


@fuzz_settings(60)
@given(data=st.data())
def test_npz_candidates_with_any_members_compare_or_are_refused_in_one_line(files, tmp_path, data):
    path = tmp_path / "c.npz"
    members = [npz_member(data.draw) for _ in range(data.draw(st.integers(1, 4)))]
    compression = data.draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))
    with zipfile.ZipFile(path, "w", compression) as z:
        if data.draw(st.booleans()):  # a real candidate's arrays too, so that something can be compared
            for name, array in files["golden"].tensors.items():
                with z.open(name + ".npy", "w") as f:
                    np.save(f, np.asarray(array))
        for name, raw in members:
            z.writestr(name, raw)

    def read():
        tensors, _, _ = oracle.load(path)
        assert all(type(a) is np.ndarray and a.dtype.kind in "biuf" for a in tensors.values())
        oracle.compare(files["golden_path"], path)

    count("npz", refused_cleanly(read))


def test_the_argument_fuzzers_saw_both_outcomes():
    if not OUTCOMES:
        pytest.skip("run together with the fuzz tests")
    assert OUTCOMES.get("npz", {}).get("refused", 0) >= 3, OUTCOMES
    accepted = sum(o.get("accepted", 0) for o in OUTCOMES.values())
    assert accepted >= 3, OUTCOMES


def test_a_dump_reads_back_what_was_written(files, tmp_path):
    """The dump writer goes through atomic_write now: what it writes reads back."""
    g = files["golden"].tensors
    acts = llmc.read_activations(llmc.write_activations(tmp_path / "a.bin", g, CFG), CFG, *np.asarray(g["tokens"]).shape)
    path = llmc_dump.write_dump(tmp_path / "d.bin", CFG, {"tokens": g["tokens"], **acts})
    back = llmc_dump.read_dump(path, CFG)
    assert np.array_equal(back["tokens"], g["tokens"]) and np.array_equal(back["encoded"], acts["encoded"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "d.bin"]
