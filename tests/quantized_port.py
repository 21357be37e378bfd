"""A small quantized GPT-2 port in NumPy, computing as ggml's CPU backend does — the candidate the
quantized-port tests (tests/oracle/test_quantized.py) judge, with kernel bugs that can be planted.

It reads a GGUF file itself (through refgpt's container reader, for the bytes only) and multiplies
ggml's way: activation rows quantized to Q8_0 blocks (d = max|x|/127 as a float32, stored as f16;
q = x·(127/max) rounded half to even, as ggml's AVX2 quantizer does), integer dot products per
block, each block's sum times d_w·d_x in float32, blocks added in float32. F32 and F16 weights
multiply float32 (F16: activations rounded to f16 first). Everything else in float32.

Planted bugs (``bugs=``):
- ``"nibble_order"``: Q4_0 weights unpacked with the nibbles swapped (element j from the high nibble);
- ``"misaligned_block"``: activation blocks start one element late (the last element wraps round);
- ``"scale_rounded_twice"``: each activation block's scale rounded to bfloat16 before f16;
- ``"attention_scale"``: the scores scaled by 1/d_head instead of 1/√d_head;
- ``"key_dropped"``: the first key not seen by the later queries (a causal mask off by one).

Attention is ggml-cpu's flash attention over an F16 KV cache (``flash_attention``).
"""

from __future__ import annotations

import numpy as np

from refgpt.files.gguf_file import GGUFFile

BUGS = ("nibble_order", "misaligned_block", "scale_rounded_twice", "attention_scale", "key_dropped")


def _bf16(x: np.ndarray) -> np.ndarray:
    bits = x.astype(np.float32).view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return rounded.astype(np.uint32).view(np.float32)


class QuantizedPort:
    def __init__(self, path, bugs=()):
        assert set(bugs) <= set(BUGS), bugs
        self.bugs = set(bugs)
        self.g = GGUFFile(path)
        meta = self.g.metadata
        self.n_layers = meta["gpt2.block_count"]
        self.n_heads = meta["gpt2.attention.head_count"]
        self.eps = np.float32(meta["gpt2.attention.layer_norm_epsilon"])

    def _f32(self, name):
        entry = self.g.tensors[name]
        raw = self.g.raw(name)
        if entry.kind.name == "F32":
            return raw.view("<f4").reshape(entry.shape)
        assert entry.kind.name == "F16", entry.kind.name
        return raw.view("<f2").astype(np.float32).reshape(entry.shape)

    def _quantize_rows(self, x):
        """[T, n] float32 → (q int32 [T, nb, 32], d float32 [T, nb]) as ggml's Q8_0, with the bugs."""
        if "misaligned_block" in self.bugs:
            x = np.roll(x, -1, axis=1)
        blocks = x.reshape(x.shape[0], -1, 32)  # [T, nb, 32]
        amax = np.abs(blocks).max(axis=2)  # [T, nb]
        d = amax / np.float32(127)
        with np.errstate(divide="ignore"):
            inverse = np.where(amax == 0, np.float32(0), np.float32(127) / amax).astype(np.float32)
        q = np.rint(blocks * inverse[..., None]).astype(np.int32)  # [T, nb, 32]
        if "scale_rounded_twice" in self.bugs:
            d = _bf16(d)
        d16 = d.astype(np.float16).astype(np.float32)
        if "misaligned_block" in self.bugs:  # the values go back to their places, their blocks' scales do not
            q = np.roll(q.reshape(x.shape[0], -1), 1, axis=1).reshape(q.shape)
        return q, d16

    def _weight_blocks(self, name):
        """(q int32 [out, nb, 32], d float32 [out, nb]) of a Q8_0 or Q4_0 weight."""
        entry = self.g.tensors[name]
        out, n = entry.shape
        blocks = self.g.raw(name).reshape(out, n // 32, entry.kind.type_size)  # [out, nb, bytes]
        d = np.ascontiguousarray(blocks[..., :2]).view("<f2")[..., 0].astype(np.float32)  # [out, nb]
        if entry.kind.name == "Q8_0":
            q = blocks[..., 2:].view(np.int8).astype(np.int32)
        else:
            qs = blocks[..., 2:]
            low, high = qs & 0x0F, qs >> 4
            if "nibble_order" in self.bugs:
                low, high = high, low
            q = np.concatenate([low, high], axis=-1).astype(np.int32) - 8
        return q, d

    def linear(self, x, weight, bias=None):
        """x [T, d_in] float32 @ the GGUF weight ([out, in]) + bias, as ggml computes it."""
        kind = self.g.tensors[weight].kind.name
        if kind in ("F32", "F16"):
            W = self._f32(weight)  # [out, in]
            xs = x.astype(np.float16).astype(np.float32) if kind == "F16" else x
            y = (xs @ W.T).astype(np.float32)
        else:
            qx, dx = self._quantize_rows(x)
            qw, dw = self._weight_blocks(weight)
            sums = np.einsum("tbj,obj->tob", qx, qw)  # [T, out, nb], exact integers
            scaled = sums.astype(np.float32) * (dx[:, None, :] * dw[None, :, :])  # [T, out, nb]
            y = np.zeros(scaled.shape[:2], np.float32)
            for b in range(scaled.shape[2]):
                y += scaled[:, :, b]
        if bias is not None:
            y = y + self._f32(bias)
        return y.astype(np.float32)

    def _layer_norm(self, x, name):
        mean = x.mean(axis=-1, keepdims=True, dtype=np.float32)
        centred = x - mean
        var = (centred * centred).mean(axis=-1, keepdims=True, dtype=np.float32)
        return (centred / np.sqrt(var + self.eps) * self._f32(name + ".weight") + self._f32(name + ".bias")).astype(np.float32)

    def run(self, tokens) -> dict[str, np.ndarray]:
        """Every activation of one sequence [pos], under refgpt's golden names (batch 1)."""
        tokens = np.asarray(tokens)
        T = len(tokens)
        E = self._f32_any("token_embd.weight")
        acts = {"hook_embed": E[tokens], "hook_pos_embed": self._f32("position_embd.weight")[:T]}
        x = acts["hook_embed"] + acts["hook_pos_embed"]
        H = self.n_heads
        for L in range(self.n_layers):
            a, blk = f"blocks.{L}.", f"blk.{L}."
            acts[a + "hook_resid_pre"] = x
            h = acts[a + "ln1.out"] = self._layer_norm(x, blk + "attn_norm")
            qkv = self.linear(h, blk + "attn_qkv.weight", blk + "attn_qkv.bias")  # [T, 3·d]
            d = x.shape[1]
            q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(T, H, d // H) for i in range(3))  # [T, head, d_head]
            acts[a + "attn.hook_q"], acts[a + "attn.hook_k"], acts[a + "attn.hook_v"] = q, k, v
            z = acts[a + "attn.hook_z"] = flash_attention(q, k, v, self.bugs)  # [T, head, d_head]
            attn_out = acts[a + "hook_attn_out"] = self.linear(z.reshape(T, d), blk + "attn_output.weight", blk + "attn_output.bias")
            x = acts[a + "hook_resid_mid"] = x + attn_out
            h = acts[a + "ln2.out"] = self._layer_norm(x, blk + "ffn_norm")
            pre = acts[a + "mlp.hook_pre"] = self.linear(h, blk + "ffn_up.weight", blk + "ffn_up.bias")
            c = np.float32(np.sqrt(2 / np.pi))
            post = acts[a + "mlp.hook_post"] = (np.float32(0.5) * pre * (1 + np.tanh(c * (pre + np.float32(0.044715) * pre ** 3)))).astype(np.float32)
            mlp_out = acts[a + "hook_mlp_out"] = self.linear(post, blk + "ffn_down.weight", blk + "ffn_down.bias")
            x = acts[a + "hook_resid_post"] = x + mlp_out
        h = acts["ln_final.out"] = self._layer_norm(x, "output_norm")
        acts["logits"] = self.linear(h, "output.weight" if "output.weight" in self.g.tensors else "token_embd.weight")
        return {name: value[None] for name, value in acts.items()}  # batch 1

    def _f32_any(self, name):
        """A weight of any type as float32 (embedding rows are read, not multiplied): ggml's get_rows dequantizes."""
        return self.g.tensor(name)


def flash_attention(q, k, v, bugs=()) -> np.ndarray:
    """z [T, head, d_head] float32 from causal q, k, v [T, head, d_head] float32 as ggml-cpu's flash
    attention vec kernel computes it (ops.cpp, ``ggml_compute_forward_flash_attn_ext_f16_one_chunk``):
    K and V in an F16 cache, q rounded to f16, float32 scores, one pass over the keys with an online
    softmax whose accumulator is f16 (rescaled by expf(M_old − M) at a new maximum), S in float32,
    z = VKQ·(1/S). Bugs: ``BUGS``' attention ones."""
    T, H, e = q.shape
    scale = np.float32(1) / (np.float32(e) if "attention_scale" in bugs else np.sqrt(np.float32(e)))
    q16, k16, v16 = (t.astype(np.float16).astype(np.float32) for t in (q, k, v))  # [T, head, d_head]
    M = np.full((T, H), -np.inf, np.float32)  # [query, head]
    S = np.zeros((T, H), np.float32)  # [query, head]
    acc = np.zeros((T, H, e), np.float16)  # [query, head, d_head]: VKQ16
    for key in range(T):
        rows = slice(0, 1) if key == 0 and "key_dropped" in bugs else slice(key, T)  # the queries that see it
        s = (np.einsum("qhe,he->qh", q16[rows], k16[key]).astype(np.float32) * scale).astype(np.float32)  # [query, head]
        new = s > M[rows]
        top = np.where(new, s, M[rows])  # [query, head]
        with np.errstate(invalid="ignore"):
            ms = np.where(new, np.exp(M[rows] - top), np.float32(1)).astype(np.float32)  # [query, head]
        vs = np.where(new, np.float32(1), np.exp(s - top)).astype(np.float32)  # [query, head]
        acc[rows] = (acc[rows].astype(np.float32) * ms[..., None]).astype(np.float16)
        acc[rows] = (acc[rows].astype(np.float32) + v16[key][None] * vs[..., None]).astype(np.float16)
        S[rows] = S[rows] * ms + vs
        M[rows] = top
    return (acc.astype(np.float32) * (np.float32(1) / S)[..., None]).astype(np.float32)


def ct2_int8_product(q, a, W_q, w_scale, bias=None, saturate=False) -> np.ndarray:
    """CTranslate2's int8 product, computed as its CPU kernels do, of activation rows rounded to
    integers q [rows, d_in] with scales a [rows] (refgpt.oracle.quantized.int8_rows), by int8 weights
    W_q [d_out, d_in] of row scales w_scale [d_out]: int32 sums, then y = c·(1/a) / w_scale (+ bias)
    in float32. ``saturate``: the planted kernel bug of a u8×s8 GEMM without VNNI (AVX2's
    ``vpmaddubsw``), the activations shifted to q + 128 and each pair's sum of products saturated to
    int16 before the int32 sum (the shift's 128·ΣW_q then taken off)."""
    q = np.asarray(q, np.int64)  # [rows, d_in]
    W = np.asarray(W_q, np.int64)  # [d_out, d_in]
    if saturate:
        shifted = q + 128  # [rows, d_in]: u8
        pairs = shifted[:, None, :] * W[None, :, :]  # [rows, d_out, d_in]
        pair_sums = np.clip(pairs[..., 0::2] + pairs[..., 1::2], -32768, 32767)  # [rows, d_out, d_in/2]
        c = pair_sums.sum(axis=-1) - 128 * W.sum(axis=1)  # [rows, d_out]
    else:
        c = q @ W.T  # [rows, d_out]
    inverse_a = (np.float32(1) / np.asarray(a, np.float32))[:, None]  # [rows, 1]
    y = (c.astype(np.float32) * inverse_a) / np.asarray(w_scale, np.float32)  # [rows, d_out]
    return y if bias is None else (y + np.asarray(bias, np.float32)).astype(np.float32)
