"""ggml's tensor types: how a row of numbers is stored in blocks, and read back as float32.

A GGUF tensor of type T stores each row (GGUF's ``ne[0]``, the fastest-varying dimension) as
blocks of ``block_size`` numbers in ``type_size`` bytes. refgpt reads these types itself, in NumPy,
as ggml defines them (``dequantize_row_*`` in ggml-quants.c): every product and sum in float32,
one rounding each, in ggml's order — so a dequantized weight is the float32 ggml computes, which
refgpt then holds in float64 exactly. tests/core/test_gguf.py checks every type bit for bit
against the ``gguf`` package (ggml's own Python) on random and adversarial blocks.

    F32, F16, BF16    one number per element (BF16: the top 16 bits of a float32)
    Q8_0   32 numbers: d (f16), 32 × int8 q                    x = q·d
    Q4_0   32 numbers: d (f16), 16 bytes of 4-bit q            x = (q − 8)·d
    Q4_1   32 numbers: d, m (f16), 16 bytes of 4-bit q         x = q·d + m
    Q5_0   32 numbers: d (f16), qh (u32), 16 bytes             x = (q − 16)·d, q = 4 low bits | 1 high bit
    Q5_1   32 numbers: d, m (f16), qh (u32), 16 bytes          x = q·d + m

In the 4-bit types, byte j of a block holds element j in its low nibble and element j + 16 in its
high one; in the 5-bit types bit j of qh is element j's fifth bit. Every other ggml type (the
K-quants, the IQ types, …) is refused by name. ``quantize`` is ggml's reference quantizer for the
same types (what ``refgpt.save(model, "m.gguf", type="Q8_0")`` writes). Both are pure NumPy: the
``gguf`` package is their judge in the tests (the ``gguf`` extra), never imported here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import RefGPTError


@dataclass(frozen=True)
class BlockType:
    name: str
    code: int  # ggml_type
    block_size: int  # numbers per block
    type_size: int  # bytes per block

    def nbytes(self, n: int) -> int:
        """Bytes of ``n`` numbers (n a multiple of block_size)."""
        return n // self.block_size * self.type_size


#: The types refgpt reads (and writes), by name.
TYPES = {t.name: t for t in (
    BlockType("F32", 0, 1, 4), BlockType("F16", 1, 1, 2), BlockType("Q4_0", 2, 32, 18),
    BlockType("Q4_1", 3, 32, 20), BlockType("Q5_0", 6, 32, 22), BlockType("Q5_1", 7, 32, 24),
    BlockType("Q8_0", 8, 32, 34), BlockType("BF16", 30, 1, 2),
)}
BY_CODE = {t.code: t for t in TYPES.values()}

#: ggml's other types, by code: named when refused.
OTHER_NAMES = {
    9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
    24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}


def type_named(name) -> BlockType:
    """The BlockType called ``name`` ('Q8_0', 'q8_0'), or a RefGPTError listing the supported ones."""
    found = TYPES.get(name.upper()) if isinstance(name, str) else None
    if found is None:
        raise RefGPTError(f"GGUF type {name!r} is not one refgpt reads and writes; supported: {', '.join(TYPES)}")
    return found


def _f16(column: np.ndarray) -> np.ndarray:
    """Two bytes per block (little-endian IEEE half) → float32, exactly."""
    return np.ascontiguousarray(column).view("<f2").astype(np.float32)  # [blocks, 1]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes per block → 32 4-bit values: low nibbles are elements 0..15, high ones 16..31."""
    return np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1)  # [blocks, 32]


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """4 bytes (a little-endian u32) per block → bit j for element j, as 0 or 16."""
    bits = np.unpackbits(np.ascontiguousarray(qh), axis=1, bitorder="little")  # [blocks, 32]
    return bits << np.uint8(4)


def dequantize(raw: np.ndarray, kind: BlockType, n: int) -> np.ndarray:
    """``n`` numbers stored as ``kind`` in the bytes ``raw`` ([kind.nbytes(n)] uint8) → float32 [n]."""
    raw = np.asarray(raw, dtype=np.uint8)
    if kind.name == "F32":
        return raw.view("<f4").astype(np.float32)
    if kind.name == "F16":
        return raw.view("<f2").astype(np.float32)
    if kind.name == "BF16":
        return (raw.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # a non-finite scale: the reader refuses the result
        return _dequantize_blocks(raw.reshape(n // kind.block_size, kind.type_size), kind, n)


def _dequantize_blocks(blocks: np.ndarray, kind: BlockType, n: int) -> np.ndarray:
    d = _f16(blocks[:, 0:2])  # [blocks, 1]
    if kind.name == "Q8_0":
        x = blocks[:, 2:].view(np.int8).astype(np.float32) * d  # [blocks, 32]
    elif kind.name == "Q4_0":
        x = (_nibbles(blocks[:, 2:]).astype(np.int8) - np.int8(8)).astype(np.float32) * d
    elif kind.name == "Q4_1":
        x = _nibbles(blocks[:, 4:]).astype(np.float32) * d + _f16(blocks[:, 2:4])
    elif kind.name == "Q5_0":
        q = _nibbles(blocks[:, 6:]) | _fifth_bits(blocks[:, 2:6])  # [blocks, 32], 0..31
        x = (q.astype(np.int8) - np.int8(16)).astype(np.float32) * d
    elif kind.name == "Q5_1":
        q = _nibbles(blocks[:, 8:]) | _fifth_bits(blocks[:, 4:8])  # [blocks, 32]
        x = q.astype(np.float32) * d + _f16(blocks[:, 2:4])
    else:  # pragma: no cover - TYPES and this function are one list
        raise RefGPTError(f"GGUF type {kind.name}: no dequantizer")
    return x.reshape(n)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C's roundf: to the nearest integer, halves away from zero (exact: v − trunc(v) is exact)."""
    t = np.trunc(v)
    return t + np.where(np.abs(v - t) >= np.float32(0.5), np.sign(v), np.float32(0))


def _scale(extreme: np.ndarray, levels: float) -> tuple[np.ndarray, np.ndarray]:
    """d = extreme / levels and its inverse (0 where d is 0), both float32 [blocks, 1]."""
    d = (extreme / np.float32(levels)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inverse = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    return d, inverse


def _signed_max(blocks: np.ndarray) -> np.ndarray:
    """Per block, the element of largest magnitude, with its sign (the first, on a tie)."""
    return np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)  # [blocks, 1]


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """[blocks, 32] values 0..15 → [blocks, 16] bytes: element j low, element j + 16 high."""
    return (q[:, :16] & np.uint8(0x0F)) | (q[:, 16:] << np.uint8(4))


def _f16_bytes(d: np.ndarray) -> np.ndarray:
    """float32 [blocks, 1] → its IEEE half (nearest, ties to even) as 2 bytes [blocks, 2]."""
    return d.astype("<f2").view(np.uint8)


def quantize(values: np.ndarray, kind: BlockType) -> np.ndarray:
    """float32 numbers [n] (n a multiple of the block size) → the bytes of ``kind`` [kind.nbytes(n)].

    ggml's reference quantizer (``quantize_row_*_ref``), every step in float32 as it computes it:
    Q8_0 d = max|x| / 127, q = roundf(x / d) (by the float32 inverse 1/d); Q4_0 and Q5_0 take the
    element of largest magnitude m, d = m / −8 (−16), q = min(15 (31), trunc(x·(1/d) + 8.5 (16.5)));
    Q4_1 and Q5_1 d = (max − min) / 15 (31), q = min(15 (31), trunc((x − min)·(1/d) + 0.5)),
    m = min; d and m stored as f16, rounded once. F16 rounds to nearest, ties to even, as ggml;
    BF16 likewise (weights are finite: no NaN case). Checked bit for bit against the ``gguf``
    package's quantizer, which ggml tests against its C (tests/core/test_gguf.py)."""
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    if kind.name == "F32":
        return values.astype("<f4").view(np.uint8)
    if kind.name == "F16":
        return values.astype("<f2").view(np.uint8)
    if kind.name == "BF16":
        bits = values.view(np.uint32).astype(np.uint64)  # [n]
        rounded = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
        return rounded.astype("<u2").view(np.uint8)
    blocks = values.reshape(-1, kind.block_size)  # [blocks, 32]
    if kind.name == "Q8_0":
        d, inverse = _scale(np.abs(blocks).max(axis=1, keepdims=True), 127)
        q = _round_half_away(blocks * inverse).astype(np.int8).view(np.uint8)  # [blocks, 32]
        parts = [_f16_bytes(d), q]
    elif kind.name in ("Q4_0", "Q5_0"):
        top = 15 if kind.name == "Q4_0" else 31
        d, inverse = _scale(_signed_max(blocks), -(top + 1) / 2)
        q = np.minimum(np.trunc(blocks * inverse + np.float32((top + 1) / 2 + 0.5)), top).astype(np.uint8)  # [blocks, 32]
        parts = [_f16_bytes(d)] + ([] if top == 15 else [_pack_fifth_bits(q)]) + [_pack_nibbles(q)]
    elif kind.name in ("Q4_1", "Q5_1"):
        top = 15 if kind.name == "Q4_1" else 31
        low = blocks.min(axis=1, keepdims=True)  # [blocks, 1]
        d, inverse = _scale(blocks.max(axis=1, keepdims=True) - low, top)
        q = np.minimum(np.trunc((blocks - low) * inverse + np.float32(0.5)), top).astype(np.uint8)  # [blocks, 32]
        parts = [_f16_bytes(d), _f16_bytes(low)] + ([] if top == 15 else [_pack_fifth_bits(q)]) + [_pack_nibbles(q)]
    else:  # pragma: no cover - TYPES and this function are one list
        raise RefGPTError(f"GGUF type {kind.name}: no quantizer")
    return np.concatenate(parts, axis=1).reshape(-1)


def _pack_fifth_bits(q: np.ndarray) -> np.ndarray:
    """[blocks, 32] values 0..31 → their fifth bits as a little-endian u32 [blocks, 4]: bit j, element j."""
    return np.packbits(q >> np.uint8(4), axis=1, bitorder="little")


__all__ = ["BY_CODE", "BlockType", "OTHER_NAMES", "TYPES", "dequantize", "quantize", "type_named"]
