"""Reading the safetensors format: validated by the reference library, then memory-mapped.

A ``.safetensors`` file is:

    8 bytes      N, the header's length, little-endian unsigned 64-bit
    N bytes      a JSON object: {name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
                                 "__metadata__": {str: str}  (optional)}
    the rest     the tensors' bytes, little-endian, C order; offsets count from the end of the header

**Who decides whether a file is valid.** The reference ``safetensors`` package (a runtime
dependency anyway) does: refgpt accepts a file if and only if ``safetensors.safe_open`` accepts
it, with one stricter rule (below). An earlier hand-written parser here accepted files the reference
refuses — a header length 4 short (the header ends in padding spaces, so it still parsed and every
tensor was read one float early), overlapping offsets, holes, trailing bytes — and a reference
implementation should not carry a weaker copy of a well-kept library. The reference checks, in
order: the file holds the 8-byte length; N ≤ 100,000,000 and the header lies inside the file; the
header is UTF-8 JSON (serde's grammar: no NaN, no ``2e0`` for an integer, no trailing garbage) of
the right shape (dtype one of its names, shape a list of unsigned 64-bit integers, data_offsets
two of them, ``__metadata__`` string → string); the tensors, sorted by offset, cover the data
section exactly — each begins where the previous ended, so no holes, overlaps or trailing bytes;
shape × dtype size (without overflow) equals the bytes each holds. It enforces no alignment.

**The one stricter rule.** The reference keeps the *last* of two tensors with the same name (and
of two equal keys in ``__metadata__``). refgpt refuses such a file: which copy is meant is a
guess, and refgpt never guesses. (``tests/core/test_safetensors_fuzz.py`` checks "refgpt accepts
iff the reference accepts and no key repeats" on mutated checkpoints, and byte-identical arrays.)

**What refgpt does itself.** It reads the header once more with Python's ``json`` (only after the
reference accepted it, so both parse the same document) to learn the offsets the reference does not
expose, and maps the file: a tensor stored in the dtype we compute in is a view of the mapped file,
never a copy. BF16, which NumPy has no dtype for, is widened to float32 exactly (a bfloat16 is the
top half of a float32). When the reference refuses a file, refgpt's own diagnosis names the tensor
at fault where it can, and the reference's reason otherwise.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
from pathlib import Path

import numpy as np
import safetensors

from .. import strict_json
from ..dtypes import widen_bfloat16
from ..errors import RefGPTError, as_path
from .atomic_write import AtomicFile, cannot_write, refuse_temporary, reserve

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

MAX_HEADER = 100_000_000  # the reference implementation's limit (MAX_HEADER_SIZE in tensor.rs)


class SafetensorsFile:
    """One safetensors file, validated and memory-mapped. ``names`` lists its tensors."""

    def __init__(self, path: str | Path):
        self.path = as_path(path, "safetensors path")
        if not self.path.is_file():
            raise RefGPTError(f"{self.path}: weights file not found")
        refuse_temporary(self.path)
        self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)  # kept: its size is checked before every read
        try:
            self._open()
        except BaseException:
            self.__del__()
            raise

    def __del__(self):
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _open(self):
        if os.fstat(self._fd).st_size == 0:
            raise RefGPTError(f"{self.path}: weights file is empty")
        self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
        refusal = _reference_refusal(self.path)
        if refusal is not None:
            raise RefGPTError(f"{self.path}: {self._diagnose() or refusal}")
        n = int.from_bytes(self._map[:8], "little")
        header = strict_json.loads(bytes(self._map[8 : 8 + n]), f"{self.path}: header")
        self.metadata = header.pop("__metadata__", None) or {}
        self._data_start = 8 + n
        self._entries = {
            name: (entry["dtype"], tuple(entry["shape"]), entry["data_offsets"][0])
            for name, entry in header.items()
        }
        ends = sorted(entry["data_offsets"] for entry in header.values())
        if sum(end - begin for begin, end in ends) != len(self._map) - self._data_start:
            raise RefGPTError(f"{self.path}: the file changed while it was being read")

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def stored_dtype(self, name: str) -> str:
        return self._entries[name][0]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1]

    def check_size(self) -> None:
        """A RefGPTError if the file is now shorter than when it was mapped: reading the lost pages
        would end the process with SIGBUS (docs/files.md, "Files that change while refgpt reads them")."""
        try:
            size = os.fstat(self._fd).st_size
        except (OSError, TypeError):
            return
        if size < len(self._map):
            raise RefGPTError(f"{self.path}: the file shrank from {len(self._map)} to {size} bytes while refgpt was "
                              "reading it: another process truncated or rewrote it in place")

    def raw(self, name: str) -> np.ndarray:
        """The tensor exactly as stored: a read-only view of the mapped file (BF16 as uint16)."""
        self.check_size()
        code, shape, begin = self._entries[name]
        if code not in DTYPES:
            raise RefGPTError(f"{self.path}: tensor {name!r} is {code}, which refgpt does not read")
        too_large = RefGPTError(f"{self.path}: tensor {name!r} has shape {list(shape)}, too large for NumPy")
        if any(d > np.iinfo(np.intp).max for d in shape):
            raise too_large
        count = int(np.prod(shape, dtype=object))
        if count == 0:
            try:  # NumPy refuses shapes whose byte count overflows, even with no elements
                return np.empty(shape, DTYPES[code][0])
            except ValueError:
                raise too_large from None
        flat = np.frombuffer(self._map, dtype=DTYPES[code][0], count=count, offset=self._data_start + begin)
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
        if not DTYPES.get(code, (None, False))[1]:
            raise RefGPTError(f"{self.path}: tensor {name!r} is {code}, expected a float tensor")
        stored = self.raw(name)
        if code == "BF16":
            stored = widen_bfloat16(stored)
        with np.errstate(over="ignore"):
            array = stored if stored.dtype == dtype else stored.astype(dtype)
        if not np.isfinite(array).all():
            bad = np.argwhere(~np.isfinite(array))[0]
            value = array[tuple(bad)]
            raise RefGPTError(f"{self.path}: tensor {name!r} holds {value} at index {tuple(int(i) for i in bad)}"
                              + (" (too large for float32)" if np.isfinite(stored[tuple(bad)]) else ""))
        return array

    def _diagnose(self) -> str | None:
        """Why the reference refused the file, in refgpt's words when we can name the tensor."""
        size = len(self._map)
        if size < 8:
            return f"truncated: {size} bytes, too short for the 8-byte header length"
        n = int.from_bytes(self._map[:8], "little")
        if n > MAX_HEADER:
            return f"header length {n} exceeds {MAX_HEADER} bytes: not a safetensors file"
        if n > size - 8:
            return (f"header length {n} runs past the end of the file ({size} bytes): "
                    "truncated, or not a safetensors file")
        try:
            header = strict_json.loads(bytes(self._map[8 : 8 + n]), "header")
        except RefGPTError as error:
            return f"header is not valid JSON ({str(error).removeprefix('header: ')}): not a safetensors file"
        if not isinstance(header, dict):
            return f"header is a JSON {type(header).__name__}, expected an object"
        header.pop("__metadata__", None)
        data_size, covered = size - 8 - n, 0
        entries = []
        for name, entry in header.items():
            if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
                return f"tensor {name!r}: header entry must have dtype, shape and data_offsets, found {entry!r}"
            code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
            if not (isinstance(shape, list) and all(type(d) is int and 0 <= d < 2**64 for d in shape)):
                return f"tensor {name!r}: shape must be a list of integers in [0, 2^64), found {shape!r}"
            if not (isinstance(offsets, list) and len(offsets) == 2
                    and all(type(o) is int and 0 <= o < 2**64 for o in offsets)):
                return f"tensor {name!r}: data_offsets must be [begin, end], found {offsets!r}"
            if code in DTYPES:
                nbytes = int(np.prod(shape, dtype=object)) * DTYPES[code][0].itemsize
                if offsets[1] - offsets[0] != nbytes:
                    return (f"tensor {name!r}: data_offsets {offsets} hold {offsets[1] - offsets[0]} "
                            f"bytes, but {code} {shape} needs {nbytes}")
            if offsets[1] > data_size:
                return (f"tensor {name!r}: truncated: its data ends at byte {offsets[1]} of the data "
                        f"section, which has only {data_size} bytes")
            entries.append((offsets, name))
        for (begin, end), name in sorted(entries):
            if begin != covered:
                what = "overlaps the tensor before it" if begin < covered else f"leaves a hole at byte {covered}"
                return f"tensor {name!r}: data_offsets [{begin}, {end}] {what}"
            covered = end
        if covered != data_size:
            return f"{data_size - covered} bytes after the last tensor's data: truncated header length or trailing bytes"
        return None


def _reference_refusal(path: Path) -> str | None:
    """The reference library's reason for refusing the file, or None if it accepts it."""
    try:
        with safetensors.safe_open(str(path), framework="np"):
            return None
    except safetensors.SafetensorError as error:
        return f"not a valid safetensors file ({str(error).removeprefix('Error while deserializing header: ')})"
    except OSError as error:
        return f"cannot read ({error.strerror or error})"

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

    Every tensor's name, dtype and shape is given up front (``layout``, in file order), so every
    offset is known; ``write(name, array)`` then puts each tensor's bytes at its place, in any
    order. ``header_length`` leaves room in the header: ``metadata`` may then be replaced until
    ``close``. The file is written as refgpt.files.atomic_write writes every output: under a
    temporary name beside ``path``, renamed onto it only by ``close`` (or the end of a ``with``
    block) once every tensor is there; any error removes it, whichever call failed. Until ``close``
    the header's bytes stay zero, so a temporary cut short (a kill, a full disk) is not a
    safetensors file any reader accepts. Errors name ``path``, never the temporary::

        with SafetensorsWriter(path, {"x": (np.float64, (2, 3))}, {"note": "…"}) as w:
            w.write("x", x)
    """

    def __init__(self, path, layout: dict, metadata: dict | None = None, header_length: int = 0):
        self.path = as_path(path, "safetensors path")
        self._layout = {name: (np.dtype(dtype), tuple(shape)) for name, (dtype, shape) in layout.items()}
        self.metadata = self._written_metadata = dict(metadata or {})
        header = header_bytes(self._layout, self.metadata, header_length)
        self._header_length = len(header)
        self._offsets, offset = {}, len(header)
        for name, (dtype, shape) in self._layout.items():
            self._offsets[name] = offset
            offset += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self._out = AtomicFile(self.path, "safetensors path")
        self._file = None
        try:
            self._file = open(self._out.tmp, "r+b", buffering=0)  # unbuffered: each error at its own write
            reserve(self._file.fileno(), offset)  # a full disk fails now, not after the work
            self._file.truncate(offset)
        except OSError as error:
            self._fail(error)
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
        if self._file is None:
            raise RefGPTError(f"{self.path}: the writer is closed")
        data = np.ascontiguousarray(array, dtype=dtype.newbyteorder("<"))  # a copy only if strided
        try:
            self._write_at(self._offsets[name], memoryview(data.reshape(-1)).cast("B"))
        except OSError as error:
            self._fail(error)
        self._pending.discard(name)

    def _write_at(self, offset: int, data) -> None:
        self._file.seek(offset)
        while data:  # an unbuffered write may take only part
            data = data[self._file.write(data):]

    def _fail(self, error: OSError):
        self.abort()
        raise cannot_write(self.path, error) from error

    def close(self) -> Path:
        """Finish the file: every tensor must have been written. Then the header, then the switch."""
        if self._file is None:
            raise RefGPTError(f"{self.path}: the writer is closed")
        if self._pending:
            self.abort()
            missing = [n for n in self._layout if n in self._pending]
            raise RefGPTError(f"{self.path}: {len(missing)} tensor(s) never written, e.g. {missing[:3]}")
        header = header_bytes(self._layout, self.metadata, self._header_length)
        if len(header) != self._header_length:
            self.abort()
            raise RefGPTError(f"{self.path}: the metadata outgrew the room left for it in the header "
                              f"({len(header)} > {self._header_length} bytes)")
        try:
            self._write_at(0, memoryview(header))
            file, self._file = self._file, None
            file.close()
        except OSError as error:
            self._fail(error)
        return self._out.commit()

    def abort(self) -> None:
        """Give up: close and remove the temporary file. Never raises."""
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()
        self._out.abort()

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.close()
        else:
            self.abort()
        return False
