"""Differential fuzzing of the safetensors reader against the reference ``safetensors`` package.

Mutations of real checkpoint bytes (the header length ± k, edits of the header JSON — duplicate
keys, offsets, dtypes, shapes, dropped tensors —, trailing bytes, truncation, random byte flips).
The oracle: refgpt accepts a file iff ``safetensors.safe_open`` accepts it and no JSON object in
its header repeats a key (refgpt's one stricter rule, see refgpt/safetensors_file.py), refuses
with a ``RefGPTError`` and nothing else, and when both accept reads byte-identical arrays.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import safetensors
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import save

from fuzzing import fuzz_settings
from random_models import hf_tensors, random_model
from refgpt import Config, RefGPTError
from refgpt.safetensors_file import SafetensorsFile

CFG = Config(d_model=4, n_layers=1, n_heads=2, d_mlp=6, d_vocab=5, n_ctx=3)


def _bases() -> list[bytes]:
    """A real HF-layout checkpoint (float32, with metadata) and a file of mixed dtypes."""
    model = random_model(CFG, seed=3)
    checkpoint = save({k: v.astype(np.float32) for k, v in hf_tensors(model).items()}, metadata={"format": "pt"})
    rng = np.random.default_rng(0)
    mixed = save({
        "f64": rng.standard_normal((2, 3)), "f16": rng.standard_normal(5).astype(np.float16),
        "i32": rng.integers(-9, 9, (3,), dtype=np.int32), "u8": rng.integers(0, 255, (7,), dtype=np.uint8),
        "b": np.array([True, False]), "scalar": np.array(2.5, np.float32), "empty": np.zeros((0, 4), np.float32),
    })
    return [checkpoint, mixed]


BASES = _bases()


def split(data: bytes) -> tuple[int, bytes, bytes]:
    n = int.from_bytes(data[:8], "little")
    return n, data[8 : 8 + n], data[8 + n :]


def with_header(header: dict | str, body: bytes, pad_to: int = 8) -> bytes:
    text = (header if isinstance(header, str) else json.dumps(header)).encode()
    text += b" " * (-len(text) % pad_to)
    return struct.pack("<Q", len(text)) + text + body


@st.composite
def header_edit(draw, data: bytes) -> bytes:
    """One edit of the header JSON, the header length recomputed (as a writer would)."""
    _, text, body = split(data)
    header = json.loads(text)
    if not isinstance(header, dict):
        return data
    names = [k for k in header if k != "__metadata__" and isinstance(header[k], dict)]
    if not isinstance(header, dict) or not names:
        return data
    name = draw(st.sampled_from(names))
    entry = header[name]
    kind = draw(st.sampled_from(["offset", "dtype", "shape", "drop", "dup", "dup_meta", "swap", "extra", "body"]))
    big = st.sampled_from([0, 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -1])
    if kind == "offset":
        i = draw(st.integers(0, 1))
        entry["data_offsets"][i] = draw(st.one_of(big, st.integers(-8, 8).map(lambda k: entry["data_offsets"][i] + k)))
    elif kind == "dtype":
        entry["dtype"] = draw(st.sampled_from(["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64",
                                               "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "f32", "X"]))
    elif kind == "shape":
        shape = entry["shape"]
        op = draw(st.sampled_from(["bump", "big", "append", "pop", "float"]))
        if op == "bump" and shape:
            i = draw(st.integers(0, len(shape) - 1))
            shape[i] += draw(st.sampled_from([-1, 1, 2]))
        elif op == "big":
            shape.append(draw(big))
        elif op == "append":
            shape.append(draw(st.sampled_from([1, 2])))
        elif op == "pop" and shape:
            shape.pop()
        elif op == "float" and shape:
            shape[0] = float(shape[0])
    elif kind == "drop":
        del header[name]
    elif kind == "swap" and len(names) > 1:
        other = header[draw(st.sampled_from([n for n in names if n != name] ))]
        entry["data_offsets"], other["data_offsets"] = other["data_offsets"], entry["data_offsets"]
    elif kind == "extra":
        entry["comment"] = "x"
    elif kind == "body":
        body = body + bytes(draw(st.integers(1, 16)))
    text = json.dumps(header)
    if kind == "dup":  # the same tensor twice, possibly with other offsets
        copy = dict(entry, data_offsets=draw(st.sampled_from([entry["data_offsets"], [0, 0]])))
        text = text[:-1] + f", {json.dumps(name)}: {json.dumps(copy)}}}"
    elif kind == "dup_meta":
        text = '{"__metadata__": {"a": "1", "a": "2"}, ' + text[1:]
    return with_header(text, body, pad_to=draw(st.sampled_from([1, 8])))


@st.composite
def mutated_file(draw) -> bytes:
    data = draw(st.sampled_from(BASES))
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(["length", "header", "header", "trailing", "truncate", "flip", "none"]))
        if kind == "length":
            n = int.from_bytes(data[:8], "little")
            k = draw(st.one_of(st.integers(-16, 16), st.sampled_from([2**32, 2**63, 2**64 - 1 - n])))
            data = struct.pack("<Q", max(0, min(2**64 - 1, n + k))) + data[8:]
        elif kind == "header":
            try:
                json.loads(split(data)[1])
            except ValueError:
                continue
            data = draw(header_edit(data))
        elif kind == "trailing":
            data += draw(st.binary(min_size=1, max_size=9))
        elif kind == "truncate" and data:
            data = data[: draw(st.integers(0, len(data) - 1))]
        elif kind == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1 :]
    return data


def repeats_a_key(data: bytes) -> bool:
    repeated = False

    def hook(pairs):
        nonlocal repeated
        repeated |= len({k for k, _ in pairs}) != len(pairs)
        return dict(pairs)

    try:
        json.loads(split(data)[1], object_pairs_hook=hook)
    except (ValueError, RecursionError):
        pass
    return repeated


def reference(path) -> dict | None:
    """What the reference reads: {name: (dtype code, shape, bytes or None)}, or None if it refuses."""
    try:
        with safetensors.safe_open(str(path), framework="np") as f:
            out = {}
            for name in f.keys():
                s = f.get_slice(name)
                try:
                    raw = f.get_tensor(name).tobytes()
                except (TypeError, AttributeError):  # BF16/F8: NumPy has no such dtype
                    raw = None
                except ValueError:  # a shape NumPy cannot hold ([0, 4, 2⁶³ − 1]): refgpt must refuse it too
                    raw = ValueError
                out[name] = (s.get_dtype(), tuple(s.get_shape()), raw)
            return out
    except safetensors.SafetensorError:
        return None


def check_agreement(path) -> str:
    expected = reference(path)
    if expected is not None and repeats_a_key(path.read_bytes()):
        expected = None
    try:
        ours = SafetensorsFile(path)
    except RefGPTError as error:
        assert expected is None, f"refgpt refused a file the reference accepts: {error}"
        assert "\n" not in str(error)
        return "both refuse"
    assert expected is not None, "refgpt accepted a file the reference refuses"
    assert sorted(ours.names) == sorted(expected)
    for name, (code, shape, raw) in expected.items():
        assert ours.shape(name) == shape
        if raw is ValueError:
            with pytest.raises(RefGPTError, match="too large for NumPy"):
                ours.raw(name)
        elif raw is not None:
            assert ours.raw(name).tobytes() == raw, name
        elif code == "BF16":
            assert ours.raw(name).nbytes == 2 * int(np.prod(shape))
    return "both accept"


OUTCOMES: dict[str, int] = {}


@fuzz_settings(300)
@given(data=mutated_file())
def test_refgpt_accepts_iff_the_reference_does_and_reads_the_same_bytes(data, tmp_path):
    path = tmp_path / "f.safetensors"
    path.write_bytes(data)
    outcome = check_agreement(path)
    OUTCOMES[outcome] = OUTCOMES.get(outcome, 0) + 1


def test_both_outcomes_were_exercised():
    """The fuzz test above is only worth something if it saw both accepted and refused files."""
    if not OUTCOMES:
        pytest.skip("run together with the fuzz test")
    assert OUTCOMES.get("both accept", 0) >= 10 and OUTCOMES.get("both refuse", 0) >= 10, OUTCOMES


@pytest.mark.parametrize("name,data", [
    ("header length 4 short", (lambda n, h, b: struct.pack("<Q", n - 4) + h + b)(*split(BASES[0]))),
    ("trailing byte", BASES[0] + b"\0"),
    ("duplicate tensor", with_header(split(BASES[1])[1].decode().rstrip()[:-1]
                                     + ', "u8": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}',
                                     split(BASES[1])[2])),
    ("hole", with_header({"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}, b"xy")),
    ("overlap", with_header({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                             "b": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}, b"xy")),
    ("dimension 2^64", with_header({"a": {"dtype": "U8", "shape": [2**64], "data_offsets": [0, 0]}}, b"")),
])
def test_known_bad_files_are_refused_like_the_reference(tmp_path, name, data):
    path = tmp_path / "f.safetensors"
    path.write_bytes(data)
    with pytest.raises(RefGPTError):
        SafetensorsFile(path)
    assert check_agreement(path) == "both refuse"


def test_an_empty_tensor_too_large_for_numpy_is_accepted_but_not_read(tmp_path):
    """Found by the long fuzz run: [0, 4, 2⁶³ − 1] holds no bytes, so the reference accepts the
    file, but NumPy cannot make the array; refgpt reads the rest and refuses that tensor."""
    path = tmp_path / "f.safetensors"
    path.write_bytes(with_header({"e": {"dtype": "F32", "shape": [0, 4, 2**63 - 1], "data_offsets": [0, 0]}}, b""))
    assert check_agreement(path) == "both accept"
    with pytest.raises(RefGPTError, match="too large for NumPy"):
        SafetensorsFile(path).raw("e")


def test_unaligned_and_reordered_files_are_read_like_the_reference(tmp_path):
    """The reference enforces no alignment and sorts tensors by offset: so does refgpt."""
    body = b"\x07" + np.arange(2, dtype="<f4").tobytes()
    path = tmp_path / "f.safetensors"
    path.write_bytes(with_header({"f": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]},
                                  "u": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, body, pad_to=1))
    assert check_agreement(path) == "both accept"
    assert SafetensorsFile(path).float_tensor("f", np.float64).tolist() == [0.0, 1.0]
