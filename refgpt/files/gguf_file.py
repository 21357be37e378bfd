"""GGUF, llama.cpp's model file: a GPT-2 read from one and written as one.

    model = refgpt.load("gpt2.Q8_0.gguf")            # every tensor dequantized as ggml defines it
    refgpt.save(model, "gpt2.Q4_0.gguf", type="Q4_0")  # what llama.cpp's converter would write

**The container** (GGUF v2/v3, little-endian) is parsed here, not by the ``gguf`` package: a header
that lies cannot make refgpt allocate or read past the file. Every count is checked against the
bytes left before anything is built (each key/value takes ≥ 13 bytes, each tensor entry ≥ 24, each
array element its size, each string its 8-byte length), strings must be UTF-8, keys and tensor
names unique, ``general.alignment`` a power of two; each tensor has 1–4 dimensions of ≥ 1, a row
a whole number of blocks, an aligned offset, and lies inside the data section without overlapping
another. The tensors' types are refgpt/files/ggml_blocks.py's; any other is refused by name.

**GPT-2's names and layouts**, as llama.cpp's converter (convert_hf_to_gguf.py, GPT2Model) writes
them: ``token_embd``, ``position_embd``; per block ``blk.L.attn_norm``, ``attn_qkv``,
``attn_output``, ``ffn_norm``, ``ffn_up``, ``ffn_down`` (each ``.weight`` and ``.bias``);
``output_norm``, ``output`` (absent when tied: the converter of llama-cpp-python 0.3.36 writes
GPT-2's tied wte once; a file that repeats it as ``output`` is read as tied too). HF's
Conv1D weights ([in, out]) are stored transposed, as [out, in] row-major, i.e. GGUF dims [in, out]
(GGUF lists ``ne[0]``, the row length, first). The hyperparameters are ``gpt2.block_count``,
``context_length``, ``embedding_length``, ``feed_forward_length``, ``attention.head_count``,
``attention.layer_norm_epsilon`` (a float32: refgpt reads it as the shortest decimal that is that
float32, so 1e-5 stays 1e-5); the tokenizer is ``tokenizer.ggml.tokens`` (GPT-2's byte-level
strings, id order) and ``tokenizer.ggml.merges`` ("a b" lines), which must match the vocabulary.

**Writing** follows the converter: 2-D weights at the chosen type (a row that is not a whole
number of blocks falls back to F16, as the converter's does), 1-D tensors and ``position_embd`` in
F32, the weights rounded to float32 first. The file is written atomically.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import RefGPTError, as_path
from ..gpt2.config import Config
from ..gpt2.tokenizer import Tokenizer
from .atomic_write import refuse_temporary, write_atomically
from .whole_file import refusal
from .ggml_blocks import BY_CODE, OTHER_NAMES, TYPES, BlockType, dequantize, quantize, type_named

MAGIC = b"GGUF"
ALIGNMENT = 32  # GGUF's default, when general.alignment is absent
MAX_DIMS = 4  # GGML_MAX_DIMS

# GGUF value types: code → (name, struct format or None)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
UINT32, INT32, FLOAT32 = 4, 5, 6

#: llama.cpp's file_type (LLAMA_FTYPE_ALL_F32, MOSTLY_F16, …) of a file whose weights are of one type
FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "BF16": 32}


@dataclass(frozen=True)
class TensorEntry:
    kind: BlockType
    shape: tuple[int, ...]  # NumPy order: GGUF's dims reversed (the row last)
    offset: int  # in the file
    nbytes: int


class GGUFFile:
    """One GGUF file, parsed and checked: ``metadata`` (key → value: int, float, bool, str, a
    list of str, or a read-only 1-D array) and ``tensors`` (name → TensorEntry), memory-mapped."""

    def __init__(self, path):
        self.path = as_path(path, "GGUF path")
        refuse_temporary(self.path)
        try:
            self._file = open(self.path, "rb")  # kept: its size is checked before every tensor is read
            if os.fstat(self._file.fileno()).st_size == 0:
                self._file.close()
                raise RefGPTError(f"{self.path}: GGUF file is empty")
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as error:
            raise refusal(self.path, "GGUF file", error) from None
        self._at = 0
        try:
            self._parse()
        except _Short as short:
            raise RefGPTError(f"{self.path}: truncated GGUF file: {short} at byte {self._at} runs past its "
                              f"end ({len(self._map)} bytes)") from None

    def __del__(self):
        file = getattr(self, "_file", None)
        if file is not None:
            file.close()

    # ---- the header ----------------------------------------------------------------------------------

    def _parse(self):
        magic = self._take(4, "the magic")
        if magic != MAGIC:
            raise RefGPTError(f"{self.path}: not a GGUF file (starts with {magic!r}, not b'GGUF')")
        version = self._scalar("<I", "the version")
        if version in (0x02000000, 0x03000000):
            raise RefGPTError(f"{self.path}: a big-endian GGUF file; refgpt reads little-endian GGUF only")
        if version not in (2, 3):
            raise RefGPTError(f"{self.path}: GGUF version {version}; refgpt reads versions 2 and 3")
        n_tensors = self._scalar("<Q", "the tensor count")
        n_kv = self._scalar("<Q", "the key/value count")
        self._check_count(n_kv, 13, "key/value pairs")
        self.metadata = {}
        for _ in range(n_kv):
            key = self._string("a key")
            if key in self.metadata:
                raise RefGPTError(f"{self.path}: metadata key {key!r} appears twice")
            self.metadata[key] = self._value(self._scalar("<I", f"the type of {key!r}"), key)
        self._check_count(n_tensors, 24, "tensors")
        infos = []
        for _ in range(n_tensors):
            infos.append(self._tensor_info())
        alignment = self.metadata.get("general.alignment", ALIGNMENT)
        if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
            raise RefGPTError(f"{self.path}: general.alignment must be a power of two, found {alignment!r}")
        data_start = -(-self._at // alignment) * alignment
        self.tensors = {}
        spans = []
        for name, kind, shape, offset in infos:
            if name in self.tensors:
                raise RefGPTError(f"{self.path}: tensor {name!r} appears twice")
            nbytes = kind.nbytes(int(np.prod(shape, dtype=object)))
            if offset % alignment:
                raise RefGPTError(f"{self.path}: tensor {name!r}: offset {offset} is not a multiple of the "
                                  f"alignment {alignment}")
            begin = data_start + offset
            if begin + nbytes > len(self._map):
                raise RefGPTError(f"{self.path}: tensor {name!r} ({kind.name}, shape {list(shape)}, {nbytes} bytes "
                                  f"at offset {offset}) runs past the end of the file ({len(self._map)} bytes)")
            self.tensors[name] = TensorEntry(kind, shape, begin, nbytes)
            spans.append((begin, begin + nbytes, name))
        spans.sort()
        for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
            if begin < end:
                raise RefGPTError(f"{self.path}: tensors {first!r} and {second!r} overlap in the file")

    def _check_count(self, count: int, least: int, what: str):
        left = len(self._map) - self._at
        if count > left // least:
            raise RefGPTError(f"{self.path}: the header says {count} {what}, more than the {left} bytes "
                              f"left could hold")

    def _take(self, n: int, what: str) -> bytes:
        if n > len(self._map) - self._at:
            raise _Short(what)
        data = self._map[self._at:self._at + n]
        self._at += n
        return data

    def _scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self._take(struct.calcsize(fmt), what))[0]

    def _string(self, what: str) -> str:
        n = self._scalar("<Q", f"the length of {what}")
        data = self._take(n, what)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise RefGPTError(f"{self.path}: {what} at byte {self._at - n} is not UTF-8: {data[:40]!r}") from None

    def _value(self, code: int, key: str, in_array: bool = False):
        if code in _SCALARS:
            value = self._scalar(_SCALARS[code], f"the value of {key!r}")
            return float(value) if code in (6, 12) else value
        if code == STRING:
            return self._string(f"the value of {key!r}")
        if code == ARRAY and not in_array:
            element = self._scalar("<I", f"the element type of {key!r}")
            n = self._scalar("<Q", f"the length of {key!r}")
            if element == STRING:
                self._check_count(n, 8, f"strings in {key!r}")
                return [self._string(f"element {i} of {key!r}") for i in range(n)]
            if element not in _SCALARS:
                raise RefGPTError(f"{self.path}: {key!r} is an array of GGUF type {element}, which refgpt does not read")
            dtype = np.dtype(_SCALARS[element].replace("?", "u1"))
            self._check_count(n, dtype.itemsize, f"elements in {key!r}")
            return np.frombuffer(self._take(n * dtype.itemsize, key), dtype=dtype)
        if code == ARRAY:
            raise RefGPTError(f"{self.path}: {key!r} is an array of arrays, which refgpt does not read")
        raise RefGPTError(f"{self.path}: {key!r} has unknown GGUF value type {code}")

    def _tensor_info(self):
        name = self._string("a tensor name")
        n_dims = self._scalar("<I", f"the dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise RefGPTError(f"{self.path}: tensor {name!r} has {n_dims} dimensions; GGUF allows 1 to {MAX_DIMS}")
        dims = [self._scalar("<Q", f"the dimensions of {name!r}") for _ in range(n_dims)]
        code = self._scalar("<I", f"the type of {name!r}")
        offset = self._scalar("<Q", f"the offset of {name!r}")
        kind = BY_CODE.get(code)
        if kind is None:
            known = OTHER_NAMES.get(code)
            raise RefGPTError(f"{self.path}: tensor {name!r} is of type "
                              + (f"{known}, which refgpt does not read" if known else f"{code}, not a ggml type")
                              + f" (refgpt reads {', '.join(TYPES)})")
        if min(dims) < 1 or int(np.prod(dims, dtype=object)) > len(self._map) * max(1, kind.block_size):
            raise RefGPTError(f"{self.path}: tensor {name!r} has absurd dimensions {dims} for a "
                              f"{len(self._map)}-byte file")
        if dims[0] % kind.block_size:
            raise RefGPTError(f"{self.path}: tensor {name!r} ({kind.name}) has rows of {dims[0]} numbers, not a "
                              f"whole number of {kind.block_size}-number blocks")
        return name, kind, tuple(reversed(dims)), offset

    # ---- tensors ---------------------------------------------------------------------------------------

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as stored: a read-only uint8 view of the mapped file. A file that
        shrank since it was mapped (rewritten in place) is an error, not a SIGBUS (docs/files.md)."""
        size = os.fstat(self._file.fileno()).st_size
        if size < len(self._map):
            raise RefGPTError(f"{self.path}: the file shrank from {len(self._map)} to {size} bytes while refgpt was "
                              "reading it: another process truncated or rewrote it in place")
        entry = self.tensors[name]
        return np.frombuffer(self._map, dtype=np.uint8, count=entry.nbytes, offset=entry.offset)

    def tensor(self, name: str) -> np.ndarray:
        """The tensor dequantized as ggml does, float32 in NumPy order; non-finite values refused."""
        entry = self.tensors[name]
        values = dequantize(self.raw(name), entry.kind, int(np.prod(entry.shape))).reshape(entry.shape)
        if not np.isfinite(values).all():
            bad = np.argwhere(~np.isfinite(values))[0]
            raise RefGPTError(f"{self.path}: tensor {name!r} ({entry.kind.name}) holds a non-finite value at "
                              f"{list(bad)}: {values[tuple(bad)]}")
        return values


class _Short(Exception):
    """A read past the end of the file (reported as one RefGPTError by GGUFFile)."""


# ---- GPT-2 in GGUF ---------------------------------------------------------------------------------------

#: GGUF name → (HF GPT2LMHeadModel key, transposed?, shape in NumPy order from (d_model, d_mlp)) for
#: block L; GGUF stores HF's Conv1D weights transposed, as [out, in].
_BLOCK = {
    "attn_norm.weight": ("ln_1.weight", False, lambda d, m: (d,)), "attn_norm.bias": ("ln_1.bias", False, lambda d, m: (d,)),
    "attn_qkv.weight": ("attn.c_attn.weight", True, lambda d, m: (3 * d, d)),
    "attn_qkv.bias": ("attn.c_attn.bias", False, lambda d, m: (3 * d,)),
    "attn_output.weight": ("attn.c_proj.weight", True, lambda d, m: (d, d)),
    "attn_output.bias": ("attn.c_proj.bias", False, lambda d, m: (d,)),
    "ffn_norm.weight": ("ln_2.weight", False, lambda d, m: (d,)), "ffn_norm.bias": ("ln_2.bias", False, lambda d, m: (d,)),
    "ffn_up.weight": ("mlp.c_fc.weight", True, lambda d, m: (m, d)), "ffn_up.bias": ("mlp.c_fc.bias", False, lambda d, m: (m,)),
    "ffn_down.weight": ("mlp.c_proj.weight", True, lambda d, m: (d, m)),
    "ffn_down.bias": ("mlp.c_proj.bias", False, lambda d, m: (d,)),
}
_GLOBAL = {"token_embd.weight": "wte.weight", "position_embd.weight": "wpe.weight",
           "output_norm.weight": "ln_f.weight", "output_norm.bias": "ln_f.bias", "output.weight": "lm_head.weight"}
#: kept in F32 whatever the file's type, as the converter keeps them
_ALWAYS_F32 = {"position_embd.weight"}


def _shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every GGUF tensor of a GPT-2 with this config → its shape in NumPy order (GGUF's dims reversed)."""
    d, m = cfg.d_model, cfg.d_mlp
    shapes = {"token_embd.weight": (cfg.d_vocab, d), "position_embd.weight": (cfg.n_ctx, d), "output_norm.weight": (d,),
              "output_norm.bias": (d,), "output.weight": (cfg.d_vocab, d)}
    for L in range(cfg.n_layers):
        shapes.update({f"blk.{L}.{name}": shape(d, m) for name, (_, _, shape) in _BLOCK.items()})
    return shapes


def gguf_names(n_layers: int) -> dict[str, tuple[str, bool]]:
    """Every GGUF tensor name of a GPT-2 → (HF key, transposed?)."""
    names = {name: (hf, False) for name, hf in _GLOBAL.items()}
    for L in range(n_layers):
        names.update({f"blk.{L}.{name}": (f"h.{L}.{hf}", t) for name, (hf, t, _) in _BLOCK.items()})
    return names


def _hyperparameter(g: GGUFFile, key: str, kind=int):
    value = g.metadata.get(key)
    if value is None:
        raise RefGPTError(f"{g.path}: metadata key {key!r} is missing (a GPT-2 GGUF has it)")
    if isinstance(value, bool) or not isinstance(value, kind if kind is float else int):
        raise RefGPTError(f"{g.path}: {key} must be {'a number' if kind is float else 'an integer'}, found {value!r:.60}")
    return value


def read_model(path, dtype: np.dtype, tokenizer: bool = True):
    """(cfg, HF-keyed tensors in ``dtype``, tokenizer or None, {GGUF name: type}) of a GPT-2 GGUF."""
    g = GGUFFile(path)
    arch = g.metadata.get("general.architecture")
    if arch != "gpt2":
        raise RefGPTError(f"{g.path}: general.architecture is {arch!r:.60}; refgpt reads GPT-2 ('gpt2') only")
    if "token_embd.weight" not in g.tensors:
        raise RefGPTError(f"{g.path}: tensor 'token_embd.weight' is missing")
    eps32 = _hyperparameter(g, "gpt2.attention.layer_norm_epsilon", float)
    try:
        cfg = Config(d_model=_hyperparameter(g, "gpt2.embedding_length"), n_layers=_hyperparameter(g, "gpt2.block_count"),
                     n_heads=_hyperparameter(g, "gpt2.attention.head_count"),
                     d_mlp=_hyperparameter(g, "gpt2.feed_forward_length"),
                     d_vocab=g.tensors["token_embd.weight"].shape[0], n_ctx=_hyperparameter(g, "gpt2.context_length"),
                     eps=float(np.format_float_positional(np.float32(eps32), unique=True)) if eps32 > 0 else eps32,
                     tie_word_embeddings="output.weight" not in g.tensors)
    except RefGPTError as error:
        raise RefGPTError(f"{g.path}: {str(error).removeprefix('config: ')}") from None
    least = len(_GLOBAL) - 1 + len(_BLOCK) * cfg.n_layers  # output.weight may be absent (tied)
    if len(g.tensors) < least:  # checked before the block_count-long list of names is built
        raise RefGPTError(f"{g.path}: holds {len(g.tensors)} tensors, but a GPT-2 with gpt2.block_count="
                          f"{cfg.n_layers} has at least {least}: block_count disagrees with the tensors")
    names = gguf_names(cfg.n_layers)
    for name in g.tensors:
        if name not in names:
            raise RefGPTError(f"{g.path}: unexpected tensor {name!r}: not part of a GPT-2 with "
                              f"gpt2.block_count={cfg.n_layers}")
    cfg.check_fits_in_memory(dtype.itemsize, source=str(g.path))
    shapes = _shapes(cfg)
    tensors, types = {}, {}
    for name, (hf, transposed) in names.items():
        if name not in g.tensors:
            if name == "output.weight":
                continue
            raise RefGPTError(f"{g.path}: tensor {name!r} is missing from the GGUF file")
        entry = g.tensors[name]
        stored = shapes[name]
        if entry.shape != stored:
            raise RefGPTError(f"{g.path}: tensor {name!r} has shape {list(entry.shape)} (GGUF dims "
                              f"{list(reversed(entry.shape))}), expected {list(stored)} from the hyperparameters")
        values = g.tensor(name)
        tensors[hf] = (values.T if transposed else values).astype(dtype)
        types[name] = entry.kind.name
    if not cfg.tie_word_embeddings and np.array_equal(tensors["lm_head.weight"], tensors["wte.weight"]):
        del tensors["lm_head.weight"]  # the converter's copy of GPT-2's tied wte: one matrix
        cfg = Config(**{**_fields(cfg), "tie_word_embeddings": True})
    return cfg, tensors, (_tokenizer(g, cfg) if tokenizer else None), types


def untied(cfg: Config) -> Config:
    """``cfg`` with its own lm_head (what a GGUF file stores as ``output``)."""
    return Config(**{**_fields(cfg), "tie_word_embeddings": False})


def _fields(cfg: Config) -> dict:
    return {name: getattr(cfg, name) for name in ("d_model", "n_layers", "n_heads", "d_mlp", "d_vocab", "n_ctx", "eps")}


def _tokenizer(g: GGUFFile, cfg: Config):
    tokens, merges = g.metadata.get("tokenizer.ggml.tokens"), g.metadata.get("tokenizer.ggml.merges")
    if tokens is None and merges is None:
        return None
    model = g.metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise RefGPTError(f"{g.path}: tokenizer.ggml.model is {model!r:.60}; refgpt reads GPT-2's byte-level BPE ('gpt2')")
    if not isinstance(tokens, list) or not isinstance(merges, list):
        raise RefGPTError(f"{g.path}: tokenizer.ggml.tokens and tokenizer.ggml.merges must both be arrays of strings")
    if len(tokens) != cfg.d_vocab:
        raise RefGPTError(f"{g.path}: tokenizer.ggml.tokens has {len(tokens)} tokens but token_embd has "
                          f"{cfg.d_vocab} rows: the tokenizer does not match the vocabulary")
    encoder = {}
    for i, token in enumerate(tokens):
        if token in encoder:
            raise RefGPTError(f"{g.path}: tokenizer.ggml.tokens: token {token!r:.60} is both id {encoder[token]} and id {i}")
        encoder[token] = i
    pairs = []
    for i, line in enumerate(merges):
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise RefGPTError(f"{g.path}: tokenizer.ggml.merges[{i}] is {line!r:.60}, not two symbols separated by one space")
        pairs.append((parts[0], parts[1]))
    try:
        return Tokenizer(encoder, pairs)
    except RefGPTError as error:
        raise RefGPTError(f"{g.path}: tokenizer: {error}") from None


def write_model(model, path, hf: dict[str, np.ndarray], type: str = "F32") -> Path:
    """Write ``model`` as llama.cpp's GPT-2 GGUF with its weight matrices of ``type``; returns the path.
    ``hf``: its tensors under bare HF keys and layouts, ``lm_head.weight`` included
    (refgpt/files/checkpoint.py, ``hf_tensors`` of the untied config)."""
    kind = type_named(type)
    cfg, p = model.cfg, model.params
    if (cfg.act_fn, cfg.use_attn_scale, cfg.scale_attn_by_inverse_layer_idx) != ("gelu_new", True, False):
        raise RefGPTError("save: llama.cpp's GPT-2 computes gelu_new and scores scaled by 1/√d_head only; this model "
                          f"has activation {cfg.act_fn!r}, scale_attn_weights={cfg.use_attn_scale}, "
                          f"scale_attn_by_inverse_layer_idx={cfg.scale_attn_by_inverse_layer_idx}")
    if "unembed.b_U" in p and np.any(p["unembed.b_U"]):
        raise RefGPTError("save: the model has an unembedding bias b_U, which a GPT-2 GGUF cannot hold")
    tensors = []
    for name, (key, transposed) in gguf_names(cfg.n_layers).items():
        if name == "output.weight" and cfg.tie_word_embeddings:
            continue  # one matrix, token_embd, as the converter writes a tied GPT-2
        values = np.asarray(hf[key], dtype=np.float32)  # the converter rounds to float32 first
        values = np.ascontiguousarray(values.T if transposed else values)  # [out, in]: GGUF dims [in, out]
        chosen = kind if values.ndim == 2 and name not in _ALWAYS_F32 else TYPES["F32"]
        if values.shape[-1] % chosen.block_size:
            chosen = TYPES["F16"]
        tensors.append((name, chosen, values.shape, quantize(values, chosen)))
    metadata = [
        ("general.architecture", STRING, "gpt2"), ("general.name", STRING, "refgpt GPT-2"),
        ("general.file_type", UINT32, FILE_TYPE[kind.name]), ("general.quantization_version", UINT32, 2),
        ("gpt2.block_count", UINT32, cfg.n_layers), ("gpt2.context_length", UINT32, cfg.n_ctx),
        ("gpt2.embedding_length", UINT32, cfg.d_model), ("gpt2.feed_forward_length", UINT32, cfg.d_mlp),
        ("gpt2.attention.head_count", UINT32, cfg.n_heads),
        ("gpt2.attention.layer_norm_epsilon", FLOAT32, cfg.eps),
    ]
    tok = model.tokenizer
    if tok is not None:
        if tok.vocab_size != cfg.d_vocab:
            raise RefGPTError(f"save: the tokenizer has {tok.vocab_size} tokens but the model {cfg.d_vocab}; "
                              "llama.cpp needs one token per row of token_embd")
        tokens = sorted(tok.encoder, key=tok.encoder.get)
        kinds = np.array([3 if t in tok.special_tokens else 1 for t in tokens], dtype="<i4")  # CONTROL, NORMAL
        metadata += [("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.tokens", (ARRAY, STRING), tokens),
                     ("tokenizer.ggml.token_type", (ARRAY, INT32), kinds),
                     ("tokenizer.ggml.merges", (ARRAY, STRING), [f"{a} {b}" for a, b in tok.merges])]
        if tok.eot_token is not None:
            metadata += [("tokenizer.ggml.bos_token_id", UINT32, tok.eot_token),
                         ("tokenizer.ggml.eos_token_id", UINT32, tok.eot_token)]
    return write_atomically(as_path(path, "save: path"), lambda tmp: _write_file(tmp, metadata, tensors))


def _encode(code, value) -> bytes:
    if isinstance(code, tuple):
        _, element = code
        out = [struct.pack("<IQ", element, len(value))]
        if element == STRING:
            out += [_encode(STRING, v) for v in value]
        else:
            out.append(np.ascontiguousarray(value).tobytes())
        return b"".join(out)
    if code == STRING:
        data = value.encode("utf-8")
        return struct.pack("<Q", len(data)) + data
    return struct.pack(_SCALARS[code], value)


def _write_file(path: Path, metadata, tensors) -> None:
    header = [MAGIC, struct.pack("<IQQ", 3, len(tensors), len(metadata))]
    for key, code, value in metadata:
        header += [_encode(STRING, key), struct.pack("<I", code[0] if isinstance(code, tuple) else code), _encode(code, value)]
    offset = 0
    offsets = []
    for name, kind, shape, data in tensors:
        dims = list(reversed(shape))
        header += [_encode(STRING, name), struct.pack("<I", len(dims)), struct.pack(f"<{len(dims)}Q", *dims),
                   struct.pack("<IQ", kind.code, offset)]
        offsets.append(offset)
        offset += -(-data.nbytes // ALIGNMENT) * ALIGNMENT
    head = b"".join(header)
    with open(path, "wb") as f:
        f.write(head + b"\0" * (-len(head) % ALIGNMENT))
        for (_, _, _, data), begin in zip(tensors, offsets):
            f.write(data.tobytes())
            f.write(b"\0" * (-data.nbytes % ALIGNMENT))


__all__ = ["GGUFFile", "TensorEntry", "gguf_names", "read_model", "untied", "write_model"]
