"""torch's checkpoint file (``torch.save``'s zip layout), read and written without torch, and
without ever running the pickle inside it.

A file ``torch.save(state_dict, "params.pt")`` writes is an uncompressed zip archive whose members
all sit in one folder (``params/`` here; any name):

    params/data.pkl             a pickle (protocol 2) of the object; every tensor in it is the call
                                torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
                                requires_grad, backward_hooks), its storage a *persistent id*
                                ('storage', torch.FloatStorage, key, location, numel)
    params/data/KEY             storage KEY's raw bytes: numel elements, C order, no header
    params/byteorder            "little" or "big" (the storages' byte order; absent = little)
    params/version              the archive format, "3\\n" (torch writes 1–3)
    params/.format_version, params/.storage_alignment, params/.data/serialization_id   (informative)

and torch aligns every storage's bytes to 64 in the file (padding in the local header's extra
field), so it can map them.

**Reading never unpickles.** ``data.pkl`` is read opcode by opcode (``pickletools.genops`` parses
without executing) by a small stack machine that knows the few opcodes a state dict needs and
exactly three callables: ``torch._utils._rebuild_tensor_v2``, ``collections.OrderedDict`` and the
storage types ``torch.{Float,Double,Half,BFloat16,Long,Int,Short,Char,Byte,Bool}Storage`` (these
only as a persistent id's type, never called). Any other global (``os.system``, ``builtins.eval``,
``torch._utils._rebuild_parameter``), any other opcode (``INST``, ``OBJ``, ``NEWOBJ``, ``EXT1``, …)
is refused by name, with the byte it sits at. A tensor is rebuilt by refgpt from its storage's
bytes, after checking that the storage holds exactly numel elements and that offset, size and
stride stay inside it. The object must be a flat mapping of str keys to tensors, which is what a
``state_dict`` is; anything else (a number, a string, a nested dict, ``None``) is refused naming
its key. ``OrderedDict``'s attribute state (``_metadata``, which ``Module.state_dict`` attaches)
is read and dropped.

**The archive is checked member by member.** Entries must be stored (torch never compresses; a
compressed entry could be a zip bomb), unencrypted, named once, under one folder; zipfile checks
each CRC-32. A truncated file has lost its central directory (it is at the end): the error names
the last member whose local header is still there.

**Writing** produces what torch 2.x writes, byte-compatible with ``torch.load`` (``weights_only``
True and False, ``mmap=True``) and deterministic (fixed timestamps, storages in key order, no
random serialization id): the same tensors give the same bytes. One storage per tensor, C order.

    tensors = read_state_dict("params.pt")          # {"0.weight": ndarray, ...}, in file order
    write_state_dict("params.pt", tensors)          # atomically (refgpt.files.atomic_write)
"""

from __future__ import annotations

import io
import pickletools
import re
import struct
import zipfile
import zlib
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..dtypes import widen_bfloat16
from ..errors import RefGPTError, as_path
from .atomic_write import write_atomically
from .whole_file import read_bytes

#: torch storage type → NumPy dtype of its elements (little-endian; "big" byteorder swaps them).
#: BFloat16 is read as uint16 words and widened to float32 exactly (refgpt/dtypes.py).
STORAGE_DTYPES = {
    "FloatStorage": np.dtype("<f4"), "DoubleStorage": np.dtype("<f8"), "HalfStorage": np.dtype("<f2"),
    "BFloat16Storage": np.dtype("<u2"), "LongStorage": np.dtype("<i8"), "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"), "CharStorage": np.dtype("i1"), "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"),
}
#: NumPy dtype → the storage type torch writes for it.
STORAGE_OF = {np.dtype(np.float32): "FloatStorage", np.dtype(np.float64): "DoubleStorage",
              np.dtype(np.float16): "HalfStorage", np.dtype(np.int64): "LongStorage",
              np.dtype(np.int32): "IntStorage", np.dtype(np.int16): "ShortStorage", np.dtype(np.int8): "CharStorage",
              np.dtype(np.uint8): "ByteStorage", np.dtype(np.bool_): "BoolStorage"}
REBUILD_TENSOR = ("torch._utils", "_rebuild_tensor_v2")
ORDERED_DICT = ("collections", "OrderedDict")
ALLOWED = "torch._utils._rebuild_tensor_v2, collections.OrderedDict and torch.<Type>Storage"
VERSIONS = (b"1", b"2", b"3")
ALIGNMENT = 64


# ---- reading ------------------------------------------------------------------------------------


def read_state_dict(path) -> "OrderedDict[str, np.ndarray]":
    """The tensors of a ``torch.save`` zip file, by key in the file's order, as NumPy arrays
    (bfloat16 widened to float32). A RefGPTError names the file and the member at fault."""
    path = as_path(path, "torch checkpoint")
    return read_state_dict_bytes(read_bytes(path, "torch checkpoint file"), str(path))


def read_state_dict_bytes(raw: bytes, where: str = "torch checkpoint") -> "OrderedDict[str, np.ndarray]":
    """``read_state_dict`` of a file's bytes; ``where`` names it in errors."""
    archive = _Archive(raw, where)
    state = _Interpreter(archive.read("data.pkl"), f"{where}: {archive.name('data.pkl')}", archive).run()
    return state


class _Archive:
    """The zip archive, checked: one folder, stored members named once, a known byteorder and version."""

    def __init__(self, raw: bytes, where: str):
        self.where = where
        if raw[:4] != b"PK\x03\x04":
            hint = (" (a legacy pre-1.6 torch.save file: load it with torch and save it again)"
                    if raw[:2] == b"\x80\x02" or raw[:1] == b"\x80" else "")
            raise RefGPTError(f"{where}: not a torch zip checkpoint: it does not start with a zip member{hint}")
        try:
            self.zip = zipfile.ZipFile(io.BytesIO(raw))
            infos = self.zip.infolist()
        except Exception as error:  # zipfile raises BadZipFile, struct.error, ValueError, … on damage
            raise RefGPTError(f"{where}: damaged zip archive{_truncated_at(raw)} ({type(error).__name__}: {error})") from None
        names = [info.filename for info in infos]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise RefGPTError(f"{where}: member {repeated[0]!r} appears more than once; which copy is meant is a guess")
        folders = {n.split("/", 1)[0] for n in names}
        if len(folders) != 1 or any("/" not in n for n in names):
            raise RefGPTError(f"{where}: the members must sit in one folder, as torch.save writes them; "
                              f"found {sorted(folders)[:4]}")
        self.prefix = folders.pop() + "/"
        self.infos = {info.filename: info for info in infos}
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED:
                raise RefGPTError(f"{where}: member {info.filename!r} is compressed (method {info.compress_type}); "
                                  "torch.save stores every member uncompressed")
            if info.flag_bits & 0x1:
                raise RefGPTError(f"{where}: member {info.filename!r} is encrypted")
        if self.name("data.pkl") not in self.infos:
            raise RefGPTError(f"{where}: member {self.name('data.pkl')!r} is missing: not a torch.save file")
        order = self.read("byteorder", optional=True)
        if order not in (None, b"little", b"big"):
            raise RefGPTError(f"{where}: member {self.name('byteorder')!r} holds {order[:20]!r}, expected 'little' or 'big'")
        self.big_endian = order == b"big"
        version = self.read("version", optional=True)
        if version is not None and version.strip() not in VERSIONS:
            raise RefGPTError(f"{where}: member {self.name('version')!r} holds {version[:20]!r}: archive format "
                              f"versions {', '.join(v.decode() for v in VERSIONS)} are known, so this file is "
                              "from a torch refgpt cannot read")
        self.storages: dict[str, tuple[str, np.ndarray]] = {}

    def name(self, member: str) -> str:
        return self.prefix + member

    def read(self, member: str, optional: bool = False, size: int | None = None):
        name = self.name(member)
        info = self.infos.get(name)
        if info is None:
            if optional:
                return None
            raise RefGPTError(f"{self.where}: member {name!r} is missing")
        if size is not None and info.file_size != size:
            raise RefGPTError(f"{self.where}: member {name!r} holds {info.file_size} bytes, but data.pkl declares "
                              f"{size} for it")
        try:
            return self.zip.read(info)
        except Exception as error:  # a bad CRC, a truncated member, a damaged local header
            raise RefGPTError(f"{self.where}: member {name!r} is damaged ({type(error).__name__}: {error})") from None

    def storage(self, kind: str, key, numel) -> np.ndarray:
        """Storage ``key``'s elements [numel] (bytes checked against numel; read once per key)."""
        if not isinstance(key, str) or not re.fullmatch(r"[0-9A-Za-z_]{1,64}", key):
            raise RefGPTError(f"{self.where}: a storage key must be a short name of letters and digits, found {key!r:.60}")
        if type(numel) is not int or numel < 0:
            raise RefGPTError(f"{self.where}: storage {key!r} has element count {numel!r:.60}, expected a whole number ≥ 0")
        if key in self.storages:
            seen_kind, seen = self.storages[key]
            if seen_kind != kind or len(seen) != numel:
                raise RefGPTError(f"{self.where}: storage {key!r} is declared twice, as {seen_kind} of {len(seen)} "
                                  f"and as {kind} of {numel} elements")
            return seen
        dtype = STORAGE_DTYPES[kind]
        data = self.read(f"data/{key}", size=numel * dtype.itemsize)
        array = np.frombuffer(data, dtype=dtype.newbyteorder(">") if self.big_endian and dtype.itemsize > 1 else dtype)
        array = array.astype(dtype.newbyteorder("="), copy=True)  # native order, writeable, ours
        if kind == "BFloat16Storage":
            array = widen_bfloat16(array)
        self.storages[key] = (kind, array)
        return array


def _truncated_at(raw: bytes) -> str:
    """Where a zip without a readable central directory was cut: the last local header left."""
    last = None
    for match in re.finditer(rb"PK\x03\x04", raw):
        start = match.start()
        if start + 30 > len(raw):
            break
        name_length = struct.unpack_from("<H", raw, start + 26)[0]
        name = raw[start + 30:start + 30 + name_length]
        if len(name) == name_length and re.fullmatch(rb"[\x20-\x7e]+", name):
            last = name.decode("ascii")
    if last is None:
        return ""
    return f": truncated or cut at or after member {last!r} (the central directory at the end is gone)"


class _Global:
    """A global the pickle named, one of the allowed ones (never imported, never called by Python)."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def __repr__(self):
        return f"{self.module}.{self.name}"


class _Storage:
    def __init__(self, kind: str, array: np.ndarray):
        self.kind, self.array = kind, array


class _Tensor:
    def __init__(self, array: np.ndarray):
        self.array = array


class _Dict(OrderedDict):
    """A dict the pickle built (OrderedDict() or EMPTY_DICT): hashable by identity for the memo."""

    __hash__ = object.__hash__


_MARK = object()


class _Interpreter:
    """The few pickle opcodes a state dict needs, interpreted without running anything."""

    def __init__(self, data: bytes, where: str, archive: _Archive):
        self.data, self.where, self.archive = data, where, archive
        self.stack: list = []
        self.memo: dict = {}

    def fail(self, position, message):
        raise RefGPTError(f"{self.where}: byte {position}: {message}")

    def pop_mark(self, position) -> list:
        try:
            mark = max(i for i, item in enumerate(self.stack) if item is _MARK)
        except ValueError:
            self.fail(position, "an item list ends without its MARK")
        items = self.stack[mark + 1:]
        del self.stack[mark:]
        return items

    def pop(self, position, n: int = 1) -> list:
        if len(self.stack) < n or any(item is _MARK for item in self.stack[len(self.stack) - n:]):
            self.fail(position, "the pickle's stack runs short")
        items = self.stack[len(self.stack) - n:]
        del self.stack[len(self.stack) - n:]
        return items

    def run(self):
        try:
            ops = list(pickletools.genops(self.data))
        except Exception as error:  # genops parses only: a truncated or malformed opcode stream
            raise RefGPTError(f"{self.where}: not a readable pickle ({type(error).__name__}: {error})") from None
        for op, arg, position in ops:
            name = op.name
            if name == "STOP":
                break
            handler = getattr(self, "op_" + name, None)
            if handler is None:
                self.fail(position, f"opcode {name} is refused: it is not one a torch state dict needs "
                                    "(refgpt never runs a pickle)")
            handler(arg, position)
        (result,) = self.pop(len(self.data))
        if self.stack:
            self.fail(len(self.data), "the pickle leaves items on its stack")
        return self.state_dict(result)

    def state_dict(self, result):
        if not isinstance(result, _Dict):
            raise RefGPTError(f"{self.where}: holds a {self.kind(result)}, not a state dict (a mapping of names to tensors)")
        tensors = OrderedDict()
        for key, value in result.items():
            if not isinstance(key, str):
                raise RefGPTError(f"{self.where}: a key is a {self.kind(key)} ({key!r:.40}), not a string")
            if not isinstance(value, _Tensor):
                raise RefGPTError(f"{self.where}: key {key!r} holds a {self.kind(value)}, not a tensor; "
                                  "a state dict holds tensors only")
            tensors[key] = value.array
        return tensors

    @staticmethod
    def kind(value) -> str:
        return {_Dict: "dict", _Tensor: "tensor", _Storage: "bare storage", _Global: "global"}.get(
            type(value), type(value).__name__)

    # -- the opcodes -----------------------------------------------------------------------------

    def op_PROTO(self, arg, position):
        if not 2 <= arg <= 5:
            self.fail(position, f"pickle protocol {arg}; torch.save writes protocol 2")

    def op_FRAME(self, arg, position):
        pass

    def op_GLOBAL(self, arg, position):
        module, _, name = arg.partition(" ")
        self.stack.append(self.allowed_global(module, name, position))

    def op_STACK_GLOBAL(self, arg, position):
        module, name = self.pop(position, 2)
        if not (isinstance(module, str) and isinstance(name, str)):
            self.fail(position, "STACK_GLOBAL needs two strings")
        self.stack.append(self.allowed_global(module, name, position))

    def allowed_global(self, module, name, position):
        if (module, name) in (REBUILD_TENSOR, ORDERED_DICT) or (module == "torch" and name in STORAGE_DTYPES):
            return _Global(module, name)
        self.fail(position, f"refers to {module}.{name}, which is refused: only {ALLOWED} may appear "
                            "in a state dict (refgpt never runs a pickle)")

    def op_INST(self, arg, position):
        self.fail(position, f"opcode INST ({arg.replace(' ', '.')}) is refused: it is not one a torch state dict needs "
                            "(refgpt never runs a pickle)")

    def op_MARK(self, arg, position):
        self.stack.append(_MARK)

    def op_BINPUT(self, arg, position):
        if not self.stack or self.stack[-1] is _MARK:
            self.fail(position, "memoizes an empty stack")
        self.memo[arg] = self.stack[-1]

    op_LONG_BINPUT = op_PUT = op_BINPUT

    def op_MEMOIZE(self, arg, position):
        self.op_BINPUT(len(self.memo), position)

    def op_BINGET(self, arg, position):
        if arg not in self.memo:
            self.fail(position, f"memo entry {arg} was never stored")
        self.stack.append(self.memo[arg])

    op_LONG_BINGET = op_GET = op_BINGET

    def op_EMPTY_TUPLE(self, arg, position):
        self.stack.append(())

    def op_TUPLE(self, arg, position):
        self.stack.append(tuple(self.pop_mark(position)))

    def op_TUPLE1(self, arg, position):
        self.stack.append(tuple(self.pop(position, 1)))

    def op_TUPLE2(self, arg, position):
        self.stack.append(tuple(self.pop(position, 2)))

    def op_TUPLE3(self, arg, position):
        self.stack.append(tuple(self.pop(position, 3)))

    def op_EMPTY_DICT(self, arg, position):
        self.stack.append(_Dict())

    def set_items(self, target, items, position):
        if not isinstance(target, _Dict):
            self.fail(position, f"sets items of a {self.kind(target)}")
        for key, value in zip(items[::2], items[1::2]):
            if not isinstance(key, (str, int)):
                self.fail(position, f"a dict key is a {self.kind(key)}, not a string")
            target[key] = value

    def op_SETITEM(self, arg, position):
        key, value = self.pop(position, 2)
        (target,) = self.pop(position, 1)
        self.set_items(target, [key, value], position)
        self.stack.append(target)

    def op_SETITEMS(self, arg, position):
        items = self.pop_mark(position)
        if len(items) % 2:
            self.fail(position, "SETITEMS with a key and no value")
        (target,) = self.pop(position, 1)
        self.set_items(target, items, position)
        self.stack.append(target)

    def op_BINUNICODE(self, arg, position):
        self.stack.append(arg)

    op_SHORT_BINUNICODE = op_BINUNICODE8 = op_BINUNICODE

    def op_BININT(self, arg, position):
        self.stack.append(arg)

    op_BININT1 = op_BININT2 = op_LONG1 = op_BININT

    def op_BINFLOAT(self, arg, position):
        self.stack.append(arg)

    def op_NEWFALSE(self, arg, position):
        self.stack.append(False)

    def op_NEWTRUE(self, arg, position):
        self.stack.append(True)

    def op_NONE(self, arg, position):
        self.stack.append(None)

    def op_BINPERSID(self, arg, position):
        (pid,) = self.pop(position, 1)
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _Global)
                and pid[1].module == "torch" and pid[1].name in STORAGE_DTYPES and isinstance(pid[3], str)):
            self.fail(position, f"a persistent id must be ('storage', torch.<Type>Storage, key, location, numel), "
                                f"found {pid!r:.80}")
        _, kind, key, _location, numel = pid
        self.stack.append(_Storage(kind.name, self.archive.storage(kind.name, key, numel)))

    def op_REDUCE(self, arg, position):
        function, args = self.pop(position, 2)
        if not isinstance(function, _Global) or not isinstance(args, tuple):
            self.fail(position, f"REDUCE calls a {self.kind(function)}; only {ALLOWED.split(' and ')[0]} may be called")
        if (function.module, function.name) == ORDERED_DICT:
            if args != ():
                self.fail(position, "OrderedDict is called with arguments; torch.save calls it with none")
            self.stack.append(_Dict())
        elif (function.module, function.name) == REBUILD_TENSOR:
            self.stack.append(_Tensor(self.rebuild_tensor(args, position)))
        else:
            self.fail(position, f"REDUCE calls {function!r}: a storage type is never called in a state dict")

    def op_BUILD(self, arg, position):
        (state,) = self.pop(position, 1)
        if not self.stack or not isinstance(self.stack[-1], _Dict) or not isinstance(state, (_Dict, type(None))):
            self.fail(position, "BUILD sets the state of something other than a dict (OrderedDict's _metadata "
                                "is the only state a state dict carries)")
        # A state dict's _metadata (module versions): read, checked to be a dict, and dropped.

    def rebuild_tensor(self, args, position) -> np.ndarray:
        """torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])."""
        if len(args) not in (6, 7):
            self.fail(position, f"_rebuild_tensor_v2 takes 6 or 7 arguments, found {len(args)}")
        storage, offset, size, stride, requires_grad, hooks = args[:6]
        if not isinstance(storage, _Storage):
            self.fail(position, f"a tensor's storage is a {self.kind(storage)}")
        whole = lambda x: type(x) is int and x >= 0  # noqa: E731
        if not (whole(offset) and isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride)
                and all(map(whole, size)) and all(map(whole, stride))):
            self.fail(position, f"a tensor's offset, size and stride must be whole numbers ≥ 0 (size and stride "
                                f"of one length), found {offset!r:.20}, {size!r:.60}, {stride!r:.60}")
        if not isinstance(requires_grad, bool) or not (isinstance(hooks, _Dict) and not hooks):
            self.fail(position, "a tensor's requires_grad must be a bool and its backward hooks an empty OrderedDict")
        if len(args) == 7 and not (args[6] is None or (isinstance(args[6], _Dict) and not args[6])):
            self.fail(position, "tensor metadata (the 7th argument) is not supported")
        array = storage.array
        count = int(np.prod(size, dtype=object))
        last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if count else offset - 1
        if last >= len(array) or (count == 0 and offset > len(array)):
            self.fail(position, f"a tensor of size {list(size)}, stride {list(stride)} at offset {offset} reaches "
                                f"element {last} of a {storage.kind} of {len(array)} elements")
        if count > len(array):
            self.fail(position, f"a tensor of {count} elements over a {storage.kind} of {len(array)} (a stride-0 "
                                "broadcast) is refused: a state dict's tensors hold their own elements")
        if count == 0:
            return np.zeros(size, dtype=array.dtype)
        steps = tuple(0 if n == 1 else s * array.itemsize for n, s in zip(size, stride))  # a length-1 axis never steps
        view = np.lib.stride_tricks.as_strided(array[offset:], shape=size, strides=steps, writeable=False)
        return np.array(view, order="C")  # [size], a copy: tensors never share memory


# ---- writing ------------------------------------------------------------------------------------


def write_state_dict(path, tensors) -> Path:
    """Write {str: ndarray} as ``torch.save`` would (see the module docstring), atomically.

    Float (16/32/64-bit), integer and bool arrays are written in their dtype, C order, one storage
    each, in the mapping's order. ``torch.load(path, weights_only=True)`` gives them back as an
    OrderedDict of tensors."""
    path = as_path(path, "output path")
    blob = state_dict_bytes(tensors, archive=_archive_name(path))
    return write_atomically(path, lambda tmp: tmp.write_bytes(blob))


def _archive_name(path: Path) -> str:
    """The archive's folder: torch uses the file's stem; "archive" if that is not a plain name."""
    stem = path.stem
    return stem if re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", stem) else "archive"


def state_dict_bytes(tensors, archive: str = "archive") -> bytes:
    """The bytes of ``write_state_dict`` (folder ``archive``)."""
    arrays = []
    for key, value in tensors.items():
        if not isinstance(key, str):
            raise RefGPTError(f"write_state_dict: key {key!r:.40} is not a string")
        array = np.asarray(value)
        if array.dtype.newbyteorder("=") not in STORAGE_OF:
            raise RefGPTError(f"write_state_dict: {key!r} is {array.dtype}; torch storages hold "
                              f"{', '.join(sorted(d.name for d in STORAGE_OF))}")
        arrays.append((key, np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")))  # 0-d stays 0-d
    members = [("data.pkl", _pickle(arrays)), (".format_version", b"1"), (".storage_alignment", str(ALIGNMENT).encode()),
               ("byteorder", b"little")]
    members += [(f"data/{i}", array.tobytes()) for i, (_, array) in enumerate(arrays)]
    members.append(("version", b"3\n"))
    return _zip([(f"{archive}/{name}", data) for name, data in members])


def _pickle(arrays) -> bytes:
    """data.pkl for OrderedDict(key → tensor), opcode for opcode the way torch.save spells it."""
    out = bytearray(b"\x80\x02")  # PROTO 2
    ordered_dict = b"ccollections\nOrderedDict\n"  # GLOBAL
    out += ordered_dict + b")R"  # OrderedDict()  (EMPTY_TUPLE, REDUCE)
    out += b"("  # MARK
    for i, (key, array) in enumerate(arrays):
        out += _unicode(key)
        out += b"ctorch._utils\n_rebuild_tensor_v2\n("  # GLOBAL, MARK: its arguments
        storage = STORAGE_OF[array.dtype.newbyteorder("=")]
        out += b"(" + _unicode("storage") + f"ctorch\n{storage}\n".encode() + _unicode(str(i)) + _unicode("cpu")
        out += _int(array.size) + b"tQ"  # TUPLE, BINPERSID
        out += _int(0)  # storage offset
        out += _tuple([_int(n) for n in array.shape])
        out += _tuple([_int(s) for s in _contiguous_strides(array.shape)])
        out += b"\x89"  # NEWFALSE: requires_grad
        out += ordered_dict + b")R"  # backward_hooks = OrderedDict()
        out += b"tR"  # TUPLE, REDUCE: the tensor
    out += b"u."  # SETITEMS, STOP
    return bytes(out)


def _contiguous_strides(shape) -> list[int]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return strides[::-1]


def _unicode(text: str) -> bytes:
    data = text.encode("utf-8")
    return b"X" + struct.pack("<I", len(data)) + data  # BINUNICODE


def _int(n: int) -> bytes:
    if 0 <= n < 256:
        return b"K" + struct.pack("<B", n)  # BININT1
    if 0 <= n < 65536:
        return b"M" + struct.pack("<H", n)  # BININT2
    if -2**31 <= n < 2**31:
        return b"J" + struct.pack("<i", n)  # BININT
    data = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + struct.pack("<B", len(data)) + data  # LONG1


def _tuple(items: list[bytes]) -> bytes:
    if not items:
        return b")"  # EMPTY_TUPLE
    if len(items) <= 3:
        return b"".join(items) + {1: b"\x85", 2: b"\x86", 3: b"\x87"}[len(items)]  # TUPLE1..3
    return b"(" + b"".join(items) + b"t"


DOS_DATE = (1 << 5) | 1  # 1980-01-01: a fixed timestamp, so the bytes depend on the tensors only


def _zip(members) -> bytes:
    """A stored (uncompressed) zip of (name, data), each member's data aligned to 64 bytes in the
    file as torch aligns storages (padding in an "FB" extra field, as torch's writer does)."""
    out, central = bytearray(), bytearray()
    if len(members) > 0xFFFF:
        raise RefGPTError(f"write_state_dict: {len(members)} members are more than a zip without zip64 holds")
    for name, data in members:
        encoded = name.encode("utf-8")
        crc = zlib.crc32(data) & 0xFFFFFFFF
        offset = len(out)
        start = offset + 30 + len(encoded) + 4  # where the data would start with an empty FB field
        pad = -start % ALIGNMENT
        extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
        if offset + 30 + len(encoded) + len(extra) + len(data) > 0xFFFFFFFF:
            raise RefGPTError(f"write_state_dict: {name!r} ends beyond 4 GiB, which a zip without zip64 cannot hold")
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, DOS_DATE, crc, len(data), len(data),
                           len(encoded), len(extra))
        out += encoded + extra + data
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, DOS_DATE, crc, len(data),
                               len(data), len(encoded), 0, 0, 0, 0, 0, offset)
        central += encoded
    directory_at = len(out)
    out += central
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), directory_at, 0)
    return bytes(out)
