"""Fuzzing the GGUF reader (refgpt/files/gguf_file.py) with mutated files refgpt wrote.

Mutations of real GPT-2 GGUF files (one with a tokenizer, F16; one without, Q4_0): an 8- or
4-byte word of the header overwritten with a lie (0, 1, 2³², 2⁶³, 2⁶⁴ − 1, the file's length ± k:
counts, string lengths, dims, types, offsets), bytes inserted into or deleted from the header,
truncation, random byte flips, trailing bytes. The oracle: ``refgpt.load`` accepts or refuses with
one line and nothing else (never a traceback, never an allocation beyond the file's own size,
which every count is checked against); whenever refgpt's reader accepts a file, ggml's own reader
(the gguf package's GGUFReader) reads the same tensors — names, types, shapes and bytes — and the
same metadata keys. refgpt is the stricter of the two (overlapping tensors, nested arrays, a
non-UTF-8 string, an absurd shape), so a file only refgpt refuses is no disagreement.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import refgpt
from fuzzing import fuzz_settings, refused_cleanly
from refgpt import Config, RefGPTError
from refgpt.files.gguf_file import GGUFFile

gguf = pytest.importorskip("gguf", reason="the gguf extra judges the GGUF reader")

CFG = Config(d_model=32, n_layers=1, n_heads=2, d_mlp=64, d_vocab=259, n_ctx=4)


def _bases(tmp) -> list[bytes]:
    from random_models import tied_model

    plain = refgpt.save(tied_model(CFG, 5), tmp / "plain.gguf", type="Q4_0").read_bytes()
    return [plain, refgpt.save(tied_model(CFG, 5, tokenizer=True), tmp / "tok.gguf", type="F16").read_bytes()]


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    return _bases(tmp_path_factory.mktemp("gguf_bases"))


def _header_end(data: bytes) -> int:
    """Where the header ends (the first tensor's data begins), from refgpt's own reading of a good file."""
    return min(len(data), 24 + 4096)


@st.composite
def mutated(draw, data: bytes) -> bytes:
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["word", "word", "word", "insert", "delete", "truncate", "flip", "trailing"]))
        end = max(1, min(len(data), _header_end(data)))
        if kind == "word" and len(data) > 8:
            size = draw(st.sampled_from([4, 8]))
            i = draw(st.integers(4, max(4, end - size)))
            limit = 2 ** (8 * size) - 1
            value = draw(st.one_of(st.sampled_from([0, 1, 2, 3, 32, 2**31, 2**32 - 1, 2**63, limit]),
                                   st.integers(-64, 64).map(lambda k: len(data) + k),
                                   st.integers(0, limit)))
            data = data[:i] + (value & limit).to_bytes(size, "little") + data[i + size:]
        elif kind == "insert":
            i = draw(st.integers(0, end))
            data = data[:i] + draw(st.binary(min_size=1, max_size=12)) + data[i:]
        elif kind == "delete" and data:
            i = draw(st.integers(0, end - 1))
            data = data[:i] + data[i + draw(st.integers(1, 12)):]
        elif kind == "truncate" and data:
            data = data[:draw(st.integers(0, len(data) - 1))]
        elif kind == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
        elif kind == "trailing":
            data = data + draw(st.binary(min_size=1, max_size=40))
    return data


def _agrees_with_ggml(path) -> None:
    """refgpt's reader accepted ``path``: ggml's reads the same tensors and keys."""
    ours = GGUFFile(path)
    theirs = gguf.GGUFReader(path)
    assert sorted(ours.metadata) == sorted(k for k in theirs.fields if not k.startswith("GGUF."))
    assert [t.name for t in theirs.tensors] == list(ours.tensors)
    for t in theirs.tensors:
        entry = ours.tensors[t.name]
        assert (entry.kind.code, list(reversed(entry.shape))) == (int(t.tensor_type), list(map(int, t.shape)))
        assert np.array_equal(ours.raw(t.name), np.asarray(t.data).reshape(-1).view(np.uint8)), t.name


@fuzz_settings(150)
@given(data=st.data())
def test_mutated_gguf_files_are_read_as_ggml_reads_them_or_refused_in_one_line(tmp_path_factory, bases, data):
    path = tmp_path_factory.mktemp("fuzz") / "m.gguf"
    path.write_bytes(data.draw(mutated(data.draw(st.sampled_from(bases)))))
    reader = refused_cleanly(lambda: GGUFFile(path))
    if reader == "accepted":
        _agrees_with_ggml(path)
    event(f"reader {reader}, load {refused_cleanly(lambda: refgpt.load(path))}")


def test_the_unmutated_bases_agree_and_load(bases, tmp_path):
    for i, data in enumerate(bases):
        path = tmp_path / f"{i}.gguf"
        path.write_bytes(data)
        _agrees_with_ggml(path)
        assert refused_cleanly(lambda: refgpt.load(path)) == "accepted"


def test_a_lying_count_costs_no_allocation(tmp_path):
    """Counts of 2⁶³ keys, tensors, array elements or string bytes are refused before anything is
    allocated: the reader's own peak stays far below what the counts would need."""
    import tracemalloc

    lies = [b"GGUF" + struct.pack("<IQQ", 3, 0, 2**63),
            b"GGUF" + struct.pack("<IQQ", 3, 2**63, 0),
            b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"a" + struct.pack("<IIQ", 9, 12, 2**62),
            b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**63) + b"a"]
    for i, data in enumerate(lies):
        path = tmp_path / f"{i}.gguf"
        path.write_bytes(data)
        tracemalloc.start()
        assert refused_cleanly(lambda: GGUFFile(path)) == "refused"
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 1_000_000, (i, peak)
