"""Reading the safetensors format, checked byte by byte, memory-mapped.

A ``.safetensors`` file is:

    8 bytes      N, the header's length, little-endian unsigned 64-bit
    N bytes      a JSON object: {name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
                                 "__metadata__": {str: str}  (optional)}
    the rest     the tensors' bytes, little-endian, C order; offsets count from the end of the header

refgpt parses this itself rather than through ``safetensors.numpy.load_file`` for three reasons:
every way a file can be broken gets an error that names the file and the tensor; a tensor stored
in the dtype we compute in is a view of the memory-mapped file, never a copy; and BF16, which
NumPy has no dtype for, is widened to float32 exactly (a bfloat16 is the top half of a float32).
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import numpy as np

from .dtypes import widen_bfloat16
from .errors import RefGPTError

# safetensors dtype code → (NumPy dtype of the stored bytes, is it a floating-point format)
DTYPES = {
    "F64": (np.dtype("<f8"), True),
    "F32": (np.dtype("<f4"), True),
    "F16": (np.dtype("<f2"), True),
    "BF16": (np.dtype("<u2"), True),  # stored as raw 16-bit words; see refgpt/dtypes.py
    "I64": (np.dtype("<i8"), False),
    "I32": (np.dtype("<i4"), False),
    "I16": (np.dtype("<i2"), False),
    "I8": (np.dtype("i1"), False),
    "U64": (np.dtype("<u8"), False),
    "U32": (np.dtype("<u4"), False),
    "U16": (np.dtype("<u2"), False),
    "U8": (np.dtype("u1"), False),
    "BOOL": (np.dtype("?"), False),
}

_MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's own limit


class SafetensorsFile:
    """One safetensors file, open and memory-mapped. ``names`` lists its tensors."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise RefGPTError(f"{self.path}: weights file not found")
        size = self.path.stat().st_size
        if size == 0:
            raise RefGPTError(f"{self.path}: weights file is empty")
        if size < 8:
            raise RefGPTError(f"{self.path}: truncated: {size} bytes, too short for the 8-byte header length")
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        n = int.from_bytes(self._map[:8], "little")
        if n > size - 8:
            raise RefGPTError(
                f"{self.path}: header length {n} runs past the end of the file ({size} bytes): "
                "truncated, or not a safetensors file"
            )
        if n > _MAX_HEADER:
            raise RefGPTError(f"{self.path}: header length {n} exceeds {_MAX_HEADER} bytes")
        try:
            header = json.loads(bytes(self._map[8 : 8 + n]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise RefGPTError(f"{self.path}: header is not valid JSON ({error}): not a safetensors file") from None
        if not isinstance(header, dict):
            raise RefGPTError(f"{self.path}: header is a JSON {type(header).__name__}, expected an object")
        self.metadata = header.pop("__metadata__", None) or {}
        self._data_start = 8 + n
        self._data_size = size - self._data_start
        self._entries = {name: self._check_entry(name, entry) for name, entry in header.items()}

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def stored_dtype(self, name: str) -> str:
        return self._entries[name][0]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1]

    def _check_entry(self, name, entry):
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
            raise RefGPTError(f"{where}: header entry must have dtype, shape and data_offsets, found {entry!r}")
        code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if code not in DTYPES:
            raise RefGPTError(f"{where}: unknown dtype {code!r}")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise RefGPTError(f"{where}: shape must be a list of non-negative integers, found {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise RefGPTError(f"{where}: data_offsets must be [begin, end], found {offsets!r}")
        begin, end = offsets
        nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPES[code][0].itemsize
        if not 0 <= begin <= end or end - begin != nbytes:
            raise RefGPTError(
                f"{where}: data_offsets {offsets} hold {end - begin} bytes, "
                f"but {code} {shape} needs {nbytes}"
            )
        if end > self._data_size:
            raise RefGPTError(
                f"{where}: truncated: its data ends at byte {end} of the data section, "
                f"which has only {self._data_size} bytes"
            )
        return code, tuple(shape), begin

    def raw(self, name: str) -> np.ndarray:
        """The tensor exactly as stored: a read-only view of the mapped file (BF16 as uint16)."""
        code, shape, begin = self._entries[name]
        dtype = DTYPES[code][0]
        count = int(np.prod(shape, dtype=np.int64))
        flat = np.frombuffer(self._map, dtype=dtype, count=count, offset=self._data_start + begin)
        return flat.reshape(shape)

    def release(self, name: str) -> None:
        """Drop the tensor's pages from this process's memory; touched again, they are read again
        from the file. (Mapped pages otherwise stay resident until the kernel needs the memory.)"""
        code, shape, begin = self._entries[name]
        start = self._data_start + begin
        end = start + int(np.prod(shape, dtype=np.int64)) * DTYPES[code][0].itemsize
        first = start - start % mmap.PAGESIZE
        if end > first and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED, first, end - first)

    def float_tensor(self, name: str, dtype: np.dtype) -> np.ndarray:
        """The tensor in ``dtype`` (float32 or float64), checked to be a finite float tensor.

        Stored in ``dtype`` already: a view of the file, no copy. Otherwise converted exactly
        (F16 and BF16 widen exactly; F64 → F32 rounds to nearest).
        """
        code = self._entries[name][0]
        if not DTYPES[code][1]:
            raise RefGPTError(f"{self.path}: tensor {name!r} is {code}, expected a float tensor")
        stored = self.raw(name)
        if code == "BF16":
            stored = widen_bfloat16(stored)
        array = stored if stored.dtype == dtype else stored.astype(dtype)
        if not np.isfinite(array).all():
            bad = np.argwhere(~np.isfinite(array))[0]
            value = array[tuple(bad)]
            raise RefGPTError(f"{self.path}: tensor {name!r} holds {value} at index {tuple(int(i) for i in bad)}")
        return array


# ---- writing, one tensor at a time ------------------------------------------------------------

_CODE_OF_DTYPE = {dtype.newbyteorder("<"): code for code, (dtype, _) in DTYPES.items() if code != "BF16"}


def header_bytes(layout: dict[str, tuple[np.dtype, tuple[int, ...]]], metadata: dict[str, str], length=0) -> bytes:
    """The 8-byte length and JSON header of a file holding ``layout`` (name → (dtype, shape)),
    the tensors laid out one after another in the layout's order. The JSON is padded with spaces
    to a multiple of 8 bytes, as the reference writer pads it, so every tensor starts aligned, and
    to at least ``length`` bytes in all (room for metadata known only later)."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, (dtype, shape) in layout.items():
        dtype = np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).itemsize > 1 else np.dtype(dtype)
        if dtype not in _CODE_OF_DTYPE:
            raise RefGPTError(f"tensor {name!r}: dtype {dtype} has no safetensors code")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        header[name] = {"dtype": _CODE_OF_DTYPE[dtype], "shape": [int(d) for d in shape],
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * max(0, length - 8 - len(text))
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


class SafetensorsWriter:
    """Write a safetensors file tensor by tensor, never holding more than the tensor at hand.

    Every tensor's name, dtype and shape is given up front (``layout``, in file order), so the
    header goes first; ``write(name, array)`` then puts each tensor's bytes at its place, in any
    order. ``header_length`` leaves room in the header: ``metadata`` may then be replaced until
    ``close``, which rewrites the header (it must still fit). The file appears under its name only
    when every tensor has been written (``close``, or the end of a ``with`` block); until then it
    is ``NAME.partial``, removed on any error::

        with SafetensorsWriter(path, {"x": (np.float64, (2, 3))}, {"note": "…"}) as w:
            w.write("x", x)
    """

    def __init__(self, path, layout: dict, metadata: dict | None = None, header_length: int = 0):
        self.path = Path(path)
        self._layout = {name: (np.dtype(dtype), tuple(shape)) for name, (dtype, shape) in layout.items()}
        self.metadata = self._written_metadata = dict(metadata or {})
        header = header_bytes(self._layout, self.metadata, header_length)
        self._header_length = len(header)
        self._offsets, offset = {}, len(header)
        for name, (dtype, shape) in self._layout.items():
            self._offsets[name] = offset
            offset += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self._partial = self.path.with_name(self.path.name + ".partial")
        try:
            self._file = open(self._partial, "wb")
        except OSError as error:
            raise RefGPTError(f"{self.path}: cannot write ({error.strerror})") from None
        self._file.write(header)
        self._file.truncate(offset)
        self._pending = set(self._layout)

    def write(self, name: str, array: np.ndarray) -> None:
        """Put ``array``'s bytes (C order, little-endian) at ``name``'s place in the file."""
        if name not in self._layout:
            raise RefGPTError(f"{self.path}: tensor {name!r} is not in the header")
        dtype, shape = self._layout[name]
        array = np.asarray(array)
        if array.dtype != dtype or array.shape != shape:
            raise RefGPTError(f"{self.path}: tensor {name!r} is {array.dtype} {list(array.shape)}, "
                              f"the header says {dtype} {list(shape)}")
        data = np.ascontiguousarray(array, dtype=dtype.newbyteorder("<"))  # a copy only if strided
        self._file.seek(self._offsets[name])
        self._file.write(memoryview(data.reshape(-1)).cast("B"))
        self._pending.discard(name)

    def close(self) -> Path:
        """Finish the file: every tensor must have been written."""
        if self.metadata != self._written_metadata and not self._pending:
            header = header_bytes(self._layout, self.metadata, self._header_length)
            if len(header) != self._header_length:
                self.abort()
                raise RefGPTError(f"{self.path}: the metadata outgrew the room left for it in the header "
                                  f"({len(header)} > {self._header_length} bytes)")
            self._file.seek(0)
            self._file.write(header)
        self._file.close()
        if self._pending:
            self._partial.unlink(missing_ok=True)
            missing = [n for n in self._layout if n in self._pending]
            raise RefGPTError(f"{self.path}: {len(missing)} tensor(s) never written, e.g. {missing[:3]}")
        self._partial.replace(self.path)
        return self.path

    def abort(self) -> None:
        """Give up: close and remove the partial file."""
        self._file.close()
        self._partial.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.close()
        else:
            self.abort()
        return False
