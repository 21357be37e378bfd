"""refgpt/files/torch_zip.py: torch.save's zip files read and written without torch, and a pickle
never run.

With torch as the judge (the peers extra): whatever state dict torch.save writes — every dtype a
lens or checkpoint holds, views, shared storages, a Module's state_dict with its _metadata — refgpt
reads back bit for bit; whatever refgpt writes, torch.load reads back (weights_only True and False,
mmap). Like an attacker: a params.pt whose pickle calls os.system is refused by name and the
command never runs; other globals and opcodes, values that are not tensors, storages of the wrong
size, strides outside the storage, truncation at every byte, flipped bytes, repeated or compressed
members — each a one-line RefGPTError naming the member.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings, refused_cleanly
from refgpt import RefGPTError
from refgpt.files.torch_zip import read_state_dict, read_state_dict_bytes, state_dict_bytes, write_state_dict


def tensors_example() -> OrderedDict:
    rng = np.random.default_rng(0)
    return OrderedDict([
        ("0.weight", rng.standard_normal((3, 3))), ("0.bias", rng.standard_normal(3).astype(np.float32)),
        ("half", rng.standard_normal(4).astype(np.float16)), ("ids", np.arange(5, dtype=np.int64)),
        ("mask", np.array([True, False])), ("scalar", np.array(2.5)), ("empty", np.zeros((0, 3), np.float32)),
        ("bytes", np.arange(4, dtype=np.uint8)), ("i8", np.arange(-2, 2, dtype=np.int8)),
    ])


def assert_same(read, expected):
    assert list(read) == list(expected)
    for key, array in expected.items():
        assert read[key].dtype == np.asarray(array).dtype and read[key].shape == np.shape(array), key
        assert np.array_equal(read[key], array), key


def test_refgpt_reads_back_what_it_writes_and_writes_the_same_bytes_twice(tmp_path):
    tensors = tensors_example()
    path = write_state_dict(tmp_path / "params.pt", tensors)
    assert_same(read_state_dict(path), tensors)
    first = path.read_bytes()
    write_state_dict(path, tensors)
    assert path.read_bytes() == first  # deterministic: no timestamps, no random serialization id
    names = zipfile.ZipFile(path).namelist()
    assert names[0] == "params/data.pkl" and "params/byteorder" in names and "params/version" in names
    for info in zipfile.ZipFile(path).infolist():  # torch aligns every member's data to 64 bytes
        header = first[info.header_offset:info.header_offset + 30]
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        assert (info.header_offset + 30 + name_length + extra_length) % 64 == 0, info.filename


@pytest.mark.peer
def test_torch_reads_what_refgpt_writes(tmp_path):
    torch = pytest.importorskip("torch", reason="peer test: needs torch (the 'peers' extra)")
    tensors = tensors_example()
    path = write_state_dict(tmp_path / "params.pt", tensors)
    for kwargs in ({"weights_only": True}, {"weights_only": False}, {"weights_only": True, "mmap": True}):
        loaded = torch.load(path, **kwargs)
        assert type(loaded) is OrderedDict and list(loaded) == list(tensors)
        for key, array in tensors.items():
            assert np.array_equal(loaded[key].numpy(), array) and tuple(loaded[key].shape) == array.shape, (key, kwargs)
            assert loaded[key].numpy().dtype == array.dtype


@st.composite
def torch_state_dicts(draw):
    """Random state dicts as torch holds them: dtypes, shapes, views, storages shared between keys."""
    import torch

    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool]
    base = torch.arange(60, dtype=torch.float64).reshape(6, 10) / 7 - 3
    state = OrderedDict()
    for i in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["plain", "view", "transpose", "scalar", "empty"]))
        dtype = draw(st.sampled_from(dtypes))
        if kind == "plain":
            shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
            t = torch.linspace(-5, 5, int(np.prod(shape)), dtype=torch.float64).reshape(shape)
        elif kind == "view":  # a slice of a shared storage: offset and strides, saved with the whole storage
            t = base[draw(st.integers(0, 3)):, draw(st.integers(0, 5))::draw(st.integers(1, 3))]
        elif kind == "transpose":
            t = base.t()
        elif kind == "scalar":
            t = torch.tensor(1.25, dtype=torch.float64)
        else:
            t = torch.zeros(0, 3)
        state[f"{i}.{kind}"] = t if t.dtype == dtype else t.to(dtype)
    if draw(st.booleans()):  # two keys on one storage (torch.save writes it once)
        state["shared"] = base[1:3]
        state["shared_again"] = base[2:]
    return state


def _numpy(t):
    import torch

    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


@pytest.mark.peer
@fuzz_settings(25)
@given(torch_state_dicts())
def test_refgpt_reads_what_torch_writes(state):
    torch = pytest.importorskip("torch", reason="peer test: needs torch (the 'peers' extra)")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    read = read_state_dict_bytes(buffer.getvalue())
    assert list(read) == list(state)
    for key, t in state.items():
        assert read[key].shape == tuple(t.shape) and np.array_equal(read[key], _numpy(t)), key
        read[key][...] = 0  # each array is refgpt's own copy: no two keys share memory
    assert all(np.array_equal(read[k], np.zeros_like(read[k])) for k in read)


@pytest.mark.peer
def test_a_module_state_dict_with_its_metadata_and_legacy_names(tmp_path):
    """nn.ModuleList's state_dict (what the tuned-lens package saves) carries _metadata (BUILD)."""
    torch = pytest.importorskip("torch", reason="peer test: needs torch (the 'peers' extra)")
    modules = torch.nn.ModuleList([torch.nn.Linear(3, 3) for _ in range(2)])
    torch.save(modules.state_dict(), tmp_path / "params.pt")
    read = read_state_dict(tmp_path / "params.pt")
    assert list(read) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert np.array_equal(read["1.weight"], modules[1].weight.detach().numpy())


# ---- an attacker's files --------------------------------------------------------------------------


def archive(pkl: bytes, storages: dict | None = None, folder: str = "params", extra: dict | None = None) -> bytes:
    """A torch-layout zip around a hand-made data.pkl (stored members, as torch writes them)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{folder}/data.pkl", pkl)
        z.writestr(f"{folder}/byteorder", b"little")
        for key, data in (storages or {}).items():
            z.writestr(f"{folder}/data/{key}", data)
        for name, data in (extra or {}).items():
            z.writestr(f"{folder}/{name}", data)
        z.writestr(f"{folder}/version", b"3\n")
    return buffer.getvalue()


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_params_pt_calling_os_system_is_refused_by_name_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    pkl = pickle.dumps(OrderedDict([("0.weight", Evil(marker))]), protocol=2)
    with pytest.raises(RefGPTError, match=r"params/data\.pkl: byte \d+: refers to posix\.system, which is refused"):
        read_state_dict_bytes(archive(pkl), "params.pt")
    assert not marker.exists()


@pytest.mark.peer
def test_torch_written_hostile_pickle_is_refused_as_torch_refuses_it(tmp_path):
    """The same attack through torch.save itself (a real params.pt): refgpt refuses it by name, and
    torch.load(weights_only=True), the judge, refuses it too."""
    torch = pytest.importorskip("torch", reason="peer test: needs torch (the 'peers' extra)")
    marker = tmp_path / "pwned"
    torch.save({"0.weight": torch.zeros(2), "0.bias": Evil(marker)}, tmp_path / "params.pt")
    with pytest.raises(RefGPTError, match="posix.system"):
        read_state_dict(tmp_path / "params.pt")
    with pytest.raises(Exception):
        torch.load(tmp_path / "params.pt", weights_only=True)
    assert not marker.exists()


REBUILD = b"ctorch._utils\n_rebuild_tensor_v2\n"
ODICT = b"ccollections\nOrderedDict\n)R"


def tensor_pkl(numel=3, size=(3,), stride=(1,), offset=0, storage=b"FloatStorage", key=b"0", value=None) -> bytes:
    """data.pkl for {"w": tensor} with the given rebuild arguments (hand-written opcodes)."""
    def one(x):  # BININT, or LONG1 beyond 32 bits
        return b"J" + struct.pack("<i", x) if -2**31 <= x < 2**31 else b"\x8a\x09" + x.to_bytes(9, "little", signed=True)

    def ints(xs):
        return b"(" + b"".join(one(x) for x in xs) + b"t"

    tensor = (REBUILD + b"((X\x07\x00\x00\x00storage" + b"ctorch\n" + storage + b"\nX" + struct.pack("<I", len(key))
              + key + b"X\x03\x00\x00\x00cpu" + b"J" + struct.pack("<i", numel) + b"tQ" + b"J" + struct.pack("<i", offset)
              + ints(size) + ints(stride) + b"\x89" + ODICT + b"tR")
    return b"\x80\x02" + ODICT + b"(X\x01\x00\x00\x00w" + (tensor if value is None else value) + b"u."


@pytest.mark.parametrize("pkl, storages, message", [
    (tensor_pkl(), {"0": b"\x00" * 12}, None),  # the well-formed base case: accepted
    (tensor_pkl(), {"0": b"\x00" * 8}, r"'params/data/0' holds 8 bytes, but data\.pkl declares 12"),
    (tensor_pkl(numel=4), {"0": b"\x00" * 12}, r"'params/data/0' holds 12 bytes, but data\.pkl declares 16"),
    (tensor_pkl(), {}, r"member 'params/data/0' is missing"),
    (tensor_pkl(size=(3,), stride=(2,)), {"0": b"\x00" * 12}, r"reaches element 4 of a FloatStorage of 3"),
    (tensor_pkl(offset=1), {"0": b"\x00" * 12}, r"reaches element 3"),
    (tensor_pkl(size=(100,), stride=(0,)), {"0": b"\x00" * 12}, r"stride-0 broadcast"),
    (tensor_pkl(stride=(-1,)), {"0": b"\x00" * 12}, r"whole numbers ≥ 0"),
    (tensor_pkl(size=(1,), stride=(2**62,)), {"0": b"\x00" * 12}, None),  # a length-1 axis: any stride
    (tensor_pkl(size=(2,), stride=(2**62,)), {"0": b"\x00" * 12}, r"reaches element 4611686018427387904"),
    (tensor_pkl(storage=b"ComplexFloatStorage"), {"0": b"\x00" * 24}, r"torch\.ComplexFloatStorage, which is refused"),
    (tensor_pkl(key=b"../../etc/passwd"), {}, r"storage key must be a short name"),
    (tensor_pkl(value=b"K\x05"), {}, r"key 'w' holds a int, not a tensor"),
    (tensor_pkl(value=b"X\x02\x00\x00\x00hi"), {}, r"key 'w' holds a str, not a tensor"),
    (tensor_pkl(value=b"N"), {}, r"key 'w' holds a NoneType, not a tensor"),
    (tensor_pkl(value=b"}"), {}, r"key 'w' holds a dict, not a tensor"),
    (tensor_pkl(value=b"]"), {}, r"opcode EMPTY_LIST is refused"),
    (b"\x80\x02cbuiltins\neval\n(X\x01\x00\x00\x001tR.", {}, r"refers to builtins\.eval, which is refused"),
    (b"\x80\x02ctorch._utils\n_rebuild_parameter\n)R.", {}, r"torch\._utils\._rebuild_parameter, which is refused"),
    (b"\x80\x02(X\x02\x00\x00\x00lsios\nsystem\n.", {}, r"opcode INST \(os\.system\) is refused"),
    (b"\x80\x04\x8c\x02os\x8c\x06system\x93.", {}, r"refers to os\.system"),  # STACK_GLOBAL, protocol 4
    (b"\x80\x02ctorch\nFloatStorage\n)R.", {}, r"a storage type is never called"),
    (b"\x80\x02K\x01.", {}, r"holds a int, not a state dict"),
    (b"\x80\x02" + ODICT + b"K\x01K\x02s.", {}, r"a key is a int"),
    (b"\x80\x02" + ODICT + b"(X\x01\x00\x00\x00w", {}, r"not a readable pickle"),  # truncated pickle
    (b"\x80\x02" + ODICT + ODICT + b".", {}, r"leaves items on its stack"),
    (b"\x80\x02h\x07.", {}, r"memo entry 7 was never stored"),
    (b"\x80\x02" + ODICT + b"(X\x01\x00\x00\x00wu.", {}, r"SETITEMS with a key and no value"),
])
def test_hostile_data_pkl_is_refused_by_name(pkl, storages, message):
    raw = archive(pkl, storages)
    if message is None:
        assert read_state_dict_bytes(raw, "params.pt")["w"].shape in ((3,), (1,))
        return
    with pytest.raises(RefGPTError, match=message) as error:
        read_state_dict_bytes(raw, "params.pt")
    assert "\n" not in str(error.value) and str(error.value).startswith("params.pt: ")


def test_hostile_archives_are_refused_by_name(tmp_path):
    good = state_dict_bytes({"w": np.zeros(3, np.float32)}, archive="params")
    cases = {
        "two folders": (_rezip(good, add={"other/x": b""}), "members must sit in one folder"),
        "no folder": (_rezip(good, add={"x": b""}), "members must sit in one folder"),
        "no data.pkl": (_rezip(good, drop="params/data.pkl"), r"'params/data\.pkl' is missing"),
        "repeated member": (_rezip(good, repeat="params/data/0"), r"'params/data/0' appears more than once"),
        "compressed": (_rezip(good, compress="params/data/0"), r"'params/data/0' is compressed"),
        "big version": (_rezip(good, replace={"params/version": b"9\n"}), r"'params/version' holds b'9\\n'"),
        "odd byteorder": (_rezip(good, replace={"params/byteorder": b"middle"}), "expected 'little' or 'big'"),
        "legacy file": (pickle.dumps({"w": 1}, protocol=2), "legacy pre-1.6 torch.save file"),
        "not a zip": (b"hello", "does not start with a zip member"),
    }
    for name, (raw, message) in cases.items():
        with pytest.raises(RefGPTError, match=message):
            read_state_dict_bytes(raw, "params.pt")
    big = _rezip(good, replace={"params/byteorder": b"big", "params/data/0": np.arange(3, dtype=">f4").tobytes()})
    assert np.array_equal(read_state_dict_bytes(big)["w"], np.arange(3))  # big-endian storages are swapped
    for bad in ("missing.pt", "."):
        with pytest.raises(RefGPTError, match="not found|is a directory"):
            read_state_dict(tmp_path / bad if bad != "." else tmp_path)


def _rezip(raw: bytes, drop=None, repeat=None, compress=None, replace=None, add=None) -> bytes:
    source = zipfile.ZipFile(io.BytesIO(raw))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z, __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore")  # zipfile warns about the duplicate name
        for info in source.infolist():
            if info.filename == drop:
                continue
            data = (replace or {}).get(info.filename, source.read(info))
            method = zipfile.ZIP_DEFLATED if info.filename == compress else zipfile.ZIP_STORED
            z.writestr(info.filename, data, compress_type=method)
            if info.filename == repeat:
                z.writestr(info.filename, data)
        for name, data in (add or {}).items():
            z.writestr(name, data)
    return buffer.getvalue()


def test_truncation_at_every_byte_is_refused_naming_where_it_was_cut():
    raw = state_dict_bytes({"0.weight": np.ones((2, 2)), "0.bias": np.ones(2)}, archive="params")
    for cut in range(len(raw)):
        with pytest.raises(RefGPTError) as error:
            read_state_dict_bytes(raw[:cut], "params.pt")
        message = str(error.value)
        assert "\n" not in message and message.startswith("params.pt: ")
        if cut > 64:  # a local header survives: the message names the member the file was cut in or after
            assert "member 'params/" in message, message


@fuzz_settings(60)
@given(st.data())
def test_flipped_bytes_are_refused_or_change_nothing(data):
    """Any byte changed anywhere: a one-line RefGPTError (a bad CRC names its member) or, where the
    byte is padding or a field refgpt does not read, exactly the original tensors."""
    tensors = OrderedDict([("0.weight", np.arange(4.0).reshape(2, 2)), ("0.bias", np.ones(2, np.float32))])
    raw = bytearray(state_dict_bytes(tensors, archive="params"))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255).filter(lambda b, old=raw[i]: b != old))
    result = {}
    if refused_cleanly(lambda: result.update(read_state_dict_bytes(bytes(raw), "params.pt"))) == "accepted":
        assert_same(result, tensors)


def test_writer_refuses_what_torch_cannot_hold(tmp_path):
    with pytest.raises(RefGPTError, match="'c' is complex128"):
        write_state_dict(tmp_path / "p.pt", {"c": np.zeros(2, complex)})
    with pytest.raises(RefGPTError, match="is not a string"):
        write_state_dict(tmp_path / "p.pt", {3: np.zeros(2)})
    assert not (tmp_path / "p.pt").exists()
