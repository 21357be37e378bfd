"""Differential fuzzing of the safetensors reader against the reference ``safetensors`` package.

Mutations of real checkpoint bytes (the header length ± k, edits of the header JSON — duplicate
keys, offsets, dtypes, shapes, dropped tensors —, trailing bytes, truncation, random byte flips).
The oracle: refgpt accepts a file iff ``safetensors.safe_open`` accepts it and no JSON object in
its header repeats a key (refgpt's one stricter rule, see refgpt/files/safetensors_file.py), refuses
with a ``RefGPTError`` and nothing else, and when both accept reads byte-identical arrays.
"""

from __future__ import annotations

import json
import re
import struct

import numpy as np
import pytest
import safetensors
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import load_file, save

from fuzzing import fuzz_settings
from random_models import hf_tensors, random_model
from refgpt import Config, RefGPTError
from refgpt.files.safetensors_file import SafetensorsFile, SafetensorsWriter, header_bytes

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


@pytest.mark.slow
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


# ---- the diagnosis: which fault a refused file is refused for ---------------------------------------
# The reference decides whether a file is refused; refgpt's own diagnosis (SafetensorsFile._diagnose)
# words the refusal, naming the tensor at fault. One file per cause, and the boundaries of each check.


def U8(shape, offsets):
    return {"dtype": "U8", "shape": shape, "data_offsets": offsets}


_ONE = json.dumps({"a": U8([1], [0, 1])}).encode()  # unpadded: its length is what the file says
DIAGNOSES = {
    "7 bytes": (b"\x01" * 7, "truncated: 7 bytes, too short for the 8-byte header length"),
    "just the length": (struct.pack("<Q", 0), re.compile(r"header is not valid JSON \(.+\): not a safetensors file")),
    "length over the limit": (struct.pack("<Q", 100_000_001) + b"{}",
                              "header length 100000001 exceeds 100000000 bytes: not a safetensors file"),
    "length's top byte set": (struct.pack("<Q", 2**56 + len(_ONE)) + _ONE + b"x",  # all 8 bytes are the length
                              f"header length {2**56 + len(_ONE)} exceeds 100000000 bytes: not a safetensors file"),
    "length at the limit": (struct.pack("<Q", 100_000_000) + b"{}",
                            "header length 100000000 runs past the end of the file (10 bytes): "
                            "truncated, or not a safetensors file"),
    "length one past the end": (struct.pack("<Q", len(_ONE) + 2) + _ONE + b"x",
                                f"header length {len(_ONE) + 2} runs past the end of the file ({len(_ONE) + 9} bytes): "
                                "truncated, or not a safetensors file"),
    "not JSON": (struct.pack("<Q", 2) + b"{x", re.compile(r"header is not valid JSON \(.+\): not a safetensors file")),
    "not an object": (with_header("[1]", b""), "header is a JSON list, expected an object"),
    "entry not an object": (with_header({"a": 5}, b""),
                            "tensor 'a': header entry must have dtype, shape and data_offsets, found 5"),
    "entry without offsets": (with_header({"a": {"dtype": "U8", "shape": [1]}}, b"x"),
                              "tensor 'a': header entry must have dtype, shape and data_offsets, "
                              "found {'dtype': 'U8', 'shape': [1]}"),
    "negative dimension": (with_header({"a": U8([-1], [0, 0])}, b""),
                           "tensor 'a': shape must be a list of integers in [0, 2^64), found [-1]"),
    "dimension 2^64": (with_header({"a": U8([2**64], [0, 0])}, b""),
                       f"tensor 'a': shape must be a list of integers in [0, 2^64), found [{2**64}]"),
    "float dimension": (with_header({"a": U8([1.0], [0, 1])}, b"x"),
                        "tensor 'a': shape must be a list of integers in [0, 2^64), found [1.0]"),
    "dimension 2^63": (with_header({"a": U8([2**63], [0, 0])}, b""),
                       f"tensor 'a': data_offsets [0, 0] hold 0 bytes, but U8 [{2**63}] needs {2**63}"),
    "offset 2^63": (with_header({"a": U8([1], [2**63, 2**63 + 1])}, b"x"),
                    f"tensor 'a': truncated: its data ends at byte {2**63 + 1} of the data section, which has only 1 bytes"),
    "float offset": (with_header({"a": U8([1], [0, 1.0])}, b"x"), "tensor 'a': data_offsets must be [begin, end], found [0, 1.0]"),
    "one offset": (with_header({"a": U8([1], [0])}, b"x"), "tensor 'a': data_offsets must be [begin, end], found [0]"),
    "negative offset": (with_header({"a": U8([1], [-1, 0])}, b"x"),
                        "tensor 'a': data_offsets must be [begin, end], found [-1, 0]"),
    "offset 2^64": (with_header({"a": U8([0], [0, 2**64])}, b""),
                    f"tensor 'a': data_offsets must be [begin, end], found [0, {2**64}]"),
    "empty tensor holding a byte": (with_header({"a": U8([0], [0, 1])}, b"x"),
                                    "tensor 'a': data_offsets [0, 1] hold 1 bytes, but U8 [0] needs 0"),
    "F32 short": (with_header({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"1234"),
                  "tensor 'a': data_offsets [0, 4] hold 4 bytes, but F32 [2] needs 8"),
    "tensor past the data": (with_header({"a": U8([200], [0, 200])}, b"1234"),
                             "tensor 'a': truncated: its data ends at byte 200 of the data section, which has only 4 bytes"),
    "hole": (with_header({"__metadata__": {"k": "v"}, "a": U8([1], [1, 2])}, b"xy"),
             "tensor 'a': data_offsets [1, 2] leaves a hole at byte 0"),
    "overlap": (with_header({"a": U8([2], [0, 2]), "b": U8([1], [1, 2])}, b"xy"),
                "tensor 'b': data_offsets [1, 2] overlaps the tensor before it"),
    "trailing byte": (with_header({"a": U8([1], [0, 1])}, b"xy"),
                      "1 bytes after the last tensor's data: truncated header length or trailing bytes"),
    "unknown dtype (the reference's words)": (with_header({"a": {"dtype": "X", "shape": [1], "data_offsets": [0, 1]}}, b"x"),
                                              re.compile(r"not a valid safetensors file \(.+\)")),
}


@pytest.mark.parametrize("name", sorted(DIAGNOSES))
def test_a_refused_file_is_refused_for_its_own_fault(tmp_path, name):
    data, message = DIAGNOSES[name]
    path = tmp_path / "f.safetensors"
    path.write_bytes(data)
    assert reference(path) is None  # the reference refuses it: refgpt only words why
    with pytest.raises(RefGPTError) as error:
        SafetensorsFile(path)
    pattern = message if isinstance(message, re.Pattern) else re.compile(re.escape(message))
    assert re.fullmatch(re.escape(f"{path}: ") + pattern.pattern, str(error.value)), str(error.value)


# ---- what is read, and as what -------------------------------------------------------------------


@pytest.mark.parametrize("dtype, code", [(np.int64, "I64"), (np.int32, "I32"), (np.int16, "I16"), (np.int8, "I8"),
                                         (np.uint64, "U64"), (np.uint32, "U32"), (np.uint16, "U16"),
                                         (np.uint8, "U8"), (np.bool_, "BOOL")])
def test_integer_and_bool_tensors_are_read_raw_but_never_as_floats(tmp_path, dtype, code):
    path = tmp_path / "f.safetensors"
    values = np.array([0, 1, 1], dtype)
    path.write_bytes(save({"x": values}))
    f = SafetensorsFile(path)
    assert f.stored_dtype("x") == code and np.array_equal(f.raw("x"), values)
    with pytest.raises(RefGPTError, match=f"'x' is {code}, expected a float tensor"):
        f.float_tensor("x", np.float64)


def test_float_tensors_widen_exactly_and_bf16_is_a_float32s_top_half(tmp_path):
    values = np.array([1.5, -2.0, 3.140625, 0.0], np.float32)  # each exact in bfloat16 (low 16 bits zero)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    path = tmp_path / "f.safetensors"
    path.write_bytes(with_header({"b": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}, bf16))
    f = SafetensorsFile(path)
    assert f.float_tensor("b", np.float64).tolist() == values.tolist()
    assert f.float_tensor("b", np.float32).dtype == np.float32
    path.write_bytes(save({"h": values.astype(np.float16), "d": values.astype(np.float64)}))
    f = SafetensorsFile(path)
    for name in ("h", "d"):
        assert f.float_tensor(name, np.float64).tolist() == values.tolist()


def test_a_zero_size_tensor_numpy_can_hold_is_read(tmp_path):
    """[0, 2⁶³ − 1] of one-byte elements: no bytes, and NumPy can make the (empty) array."""
    path = tmp_path / "f.safetensors"
    path.write_bytes(with_header({"e": U8([0, 2**63 - 1], [0, 0])}, b""))
    assert check_agreement(path) == "both accept"
    assert SafetensorsFile(path).raw("e").shape == (0, 2**63 - 1)


def _resident_file_kb() -> int | None:
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("RssFile:"))
    except (OSError, StopIteration):
        return None


def test_release_returns_the_tensors_pages(tmp_path):
    """release(name) drops the mapped pages of that tensor (and they come back, the same, when read)."""
    if _resident_file_kb() is None:
        pytest.skip("needs Linux's /proc/self/status RssFile")
    big = np.arange(1 << 20, dtype=np.float64)  # 8 MiB, after a 1 MiB tensor
    path = tmp_path / "f.safetensors"
    path.write_bytes(save({"a": np.zeros(1 << 17), "big": big}))
    f = SafetensorsFile(path)
    mapped = f.raw("big")
    assert np.array_equal(mapped, big)  # every page touched
    before = _resident_file_kb()
    f.release("big")
    assert before - _resident_file_kb() >= 6 * 1024  # of 8 MiB
    assert np.array_equal(mapped, big)


def test_the_writers_header_is_padded_to_eight_bytes_and_little_endian_whatever_the_byte_order(tmp_path):
    """header_bytes pads the JSON with spaces to a multiple of 8 (so every tensor starts aligned,
    as the reference writer does) and writes any byte order's dtype as its little-endian code;
    what SafetensorsWriter writes, the reference reads back value for value."""
    for k in range(1, 17):
        header = header_bytes({"x" * k: (np.float64, (1,))}, {})
        assert len(header) % 8 == 0 and int.from_bytes(header[:8], "little") == len(header) - 8
    layout = {"a": (np.dtype(">f8"), (2,)), "h": (np.dtype(">f2"), (1,)), "i": (np.dtype(">i2"), (1,)),
              "u": (np.dtype("u1"), (1,)), "b": (np.dtype("?"), (1,))}
    entries = json.loads(header_bytes(layout, {})[8:])
    assert {name: (e["dtype"], e["data_offsets"]) for name, e in entries.items()} == {
        "a": ("F64", [0, 16]), "h": ("F16", [16, 18]), "i": ("I16", [18, 20]), "u": ("U8", [20, 21]), "b": ("BOOL", [21, 22])}
    values = {"a": np.array([1.5, -2.0], ">f8"), "h": np.array([0.25], ">f2"), "i": np.array([-3], ">i2"),
              "u": np.array([7], "u1"), "b": np.array([True])}
    with SafetensorsWriter(tmp_path / "w.safetensors", layout) as w:
        for name, value in values.items():
            w.write(name, value)
    read = load_file(tmp_path / "w.safetensors")
    assert all(read[name].tolist() == value.tolist() for name, value in values.items())


def test_the_writer_takes_any_array_like(tmp_path):
    """write(name, array) reads ``array`` with np.asarray: a list of the header's dtype and shape is written too."""
    with SafetensorsWriter(tmp_path / "w.safetensors", {"a": (np.float64, (2,)), "i": (np.int64, (1,))}) as w:
        w.write("a", [1.5, -2.0])
        w.write("i", [3])
    read = load_file(tmp_path / "w.safetensors")
    assert read["a"].tolist() == [1.5, -2.0] and read["i"].tolist() == [3]
    assert SafetensorsFile(tmp_path / "w.safetensors").metadata == {}
    path = tmp_path / "m.safetensors"
    path.write_bytes(BASES[0])
    assert SafetensorsFile(path).metadata == {"format": "pt"}


def test_a_file_that_changes_after_the_reference_read_it_is_refused(tmp_path, monkeypatch):
    """The reference validates the file, refgpt maps it: if the bytes mapped are not the ones
    validated (here: the reference is told to accept a file with a trailing byte), refgpt refuses."""
    import refgpt.files.safetensors_file as module

    path = tmp_path / "f.safetensors"
    path.write_bytes(with_header({"a": U8([1], [0, 1])}, b"xy"))
    monkeypatch.setattr(module, "_reference_refusal", lambda path: None)
    with pytest.raises(RefGPTError, match="f.safetensors: the file changed while it was being read$"):
        SafetensorsFile(path)


def test_what_numpy_cannot_hold_or_refgpt_cannot_read_is_refused_by_name(tmp_path):
    path = tmp_path / "f.safetensors"
    path.write_bytes(with_header({"e": U8([0, 2**63], [0, 0]),
                                  "f8": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}}, b"x"))
    assert check_agreement(path) == "both accept"
    f = SafetensorsFile(path)
    with pytest.raises(RefGPTError, match=r"tensor 'e' has shape \[0, 9223372036854775808\], too large for NumPy"):
        f.raw("e")
    with pytest.raises(RefGPTError, match="tensor 'f8' is F8_E4M3, which refgpt does not read"):
        f.raw("f8")
    with pytest.raises(RefGPTError, match="tensor 'f8' is F8_E4M3, expected a float tensor"):
        f.float_tensor("f8", np.float64)


def test_a_non_finite_weight_is_named_by_its_first_index(tmp_path):
    path = tmp_path / "f.safetensors"
    path.write_bytes(save({"w": np.array([1.0, np.inf, np.nan, 1e300])}))
    f = SafetensorsFile(path)
    with pytest.raises(RefGPTError, match=r"tensor 'w' holds inf at index \(1,\)$"):
        f.float_tensor("w", np.float64)
    path.write_bytes(save({"w": np.array([1.0, 1e300, -1e300])}))
    with pytest.raises(RefGPTError, match=r"tensor 'w' holds inf at index \(1,\) \(too large for float32\)$"):
        SafetensorsFile(path).float_tensor("w", np.float32)


def test_the_writers_header_is_no_longer_than_asked(tmp_path):
    """The JSON padded with fewer than 8 spaces (the reference writer's padding), or to the
    multiple of 8 at or after ``length``; metadata as given; a dtype without a code is refused."""
    for k in range(1, 17):
        header = header_bytes({"x" * k: (np.float64, (1,))}, {"k": "v"})
        assert len(header) - 8 - len(header[8:].rstrip(b" ")) < 8
    layout = {"x": (np.float64, (1,))}
    assert len(header_bytes(layout, {}, length=200)) == 200 and len(header_bytes(layout, {}, length=201)) == 208
    with SafetensorsWriter(tmp_path / "w.safetensors", layout, {"k": "v"}) as w:
        w.write("x", np.ones(1))
    with safetensors.safe_open(str(tmp_path / "w.safetensors"), "np") as f:
        assert f.metadata() == {"k": "v"}
    with pytest.raises(RefGPTError, match="tensor 'c': dtype complex64 has no safetensors code"):
        header_bytes({"c": (np.complex64, (1,))}, {})
