"""Checking a quantized port: quantization error and implementation error, two numbers.

A quantized runtime (llama.cpp at Q8_0 or Q4_0) differs from float64 GPT-2 for two reasons: its
weights are not GPT-2's (the **quantization error**, which is the file's, not the runtime's), and
its arithmetic is not exact (the **implementation error**: float32 rounding, the runtime's own
quantization of activations — and bugs). refgpt separates them with two goldens:

- the float golden, of the float checkpoint (``refgpt golden --model gpt2/``);
- the quantized golden, the float64 GPT-2 of exactly the file's weights, dequantized as ggml
  defines them (``refgpt golden --model gpt2.Q4_0.gguf``); its metadata records each tensor's
  type (``quantization``).

``split`` reports, per tensor, the quantization error (float golden vs quantized golden) and the
implementation error (candidate vs quantized golden), each as NMSE = Σ(x − r)² / Σr² and
SNR = −10·log10(NMSE) dB; and judges every matrix product the candidate exposes locally, on the
candidate's own input, against a derived bound (``linear_bound``; W_O's as the span ending at
resid_mid when nothing after W_O is named), every GELU (``gelu_bound``) and the attention's z
on the candidate's own q, k, v (``attention_bound``: ggml's f16 KV cache and f16 accumulator). CTranslate2's int8
product has its own bound (``int8_linear_bound``). A planted kernel bug (a swapped
nibble order, an activation block misaligned by one, a scale rounded twice) is then named at its
op and layer as an implementation error, never as quantization.

**The bound of a quantized matrix product.** ggml does not multiply the float activations by the
dequantized weights: it first rounds the activations to its ``vec_dot_type`` — Q8_0 blocks for
Q8_0, Q4_0 and Q5_0 weights, Q8_1 (the same values, plus s = d·Σq) for Q4_1 and Q5_1, F16 for F16,
BF16 for BF16, none for F32. That rounding is not an error to allow for: refgpt computes it, bit
for bit as ggml does (refgpt/files/ggml_blocks.py: d = max|x|/127 in float32, q = roundf(x/d), d
stored as f16), and the reference product is x̂·W + b in float64 with x̂ the rounded activations and
W the dequantized weights. What is left is

    |y − (x̂·W + b)|  ≤  γ_n · Σ_j |x̂_j·W_jo|  +  Σ_{j near a tie} d_j·|W_jo|  +  u·(2|y_ref| + |b|)  [+ Q8_1's s term]

— γ_n = n·u/(1 − n·u) with u = 2⁻²⁴ bounds a float32 dot product of n roundings in any order
(n = the number of blocks + 4 for block types, whose in-block sums are exact integers; the row
length + 2 for F32, F16, BF16); an element whose x/d lies within 8u·|x/d| of a half may round either
way in a SIMD quantizer (which computes 127/max rather than 1/(max/127) and rounds half to even;
the two x/d differ by at most 8u relative: ``TIE``),
costing one step d_j; the last term is the bias addition and the float32 result. Q8_1's s is
stored as f16: with Q4_1/Q5_1 weights, m·(s − d·Σq) adds ≤ 2⁻¹¹·|m|·|d·Σq| per block. Nothing
here is chosen to pass: each term is a rounding the runtime makes (docs/oracle.md, "Checking a
quantized port").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import RefGPTError
from ..files.ggml_blocks import TYPES, dequantize, quantize
from ..reference import bounds, local
from ..reference.compare import UNIT_ROUNDOFF
from ..reference.gpt2 import gelu_new

U = UNIT_ROUNDOFF["float32"]  # float32's unit roundoff: the products accumulate in float32
U16 = 2.0**-11  # float16's
TIE = 8 * U  # relative: how far two correct quantizers' x/d may differ (each computes it in ≤ 4 roundings)

#: The activations' type for each weight type (ggml-cpu's type traits, ``vec_dot_type``)
VEC_DOT_TYPE = {"F32": "F32", "F16": "F16", "BF16": "BF16", "Q8_0": "Q8_0", "Q4_0": "Q8_0", "Q5_0": "Q8_0",
                "Q4_1": "Q8_1", "Q5_1": "Q8_1"}


def nmse(reference, x) -> float:
    """Σ(x − r)² / Σr² in float64 (0 for two equal tensors; inf when r is 0 and x is not)."""
    r = np.asarray(reference, np.float64)
    d = np.asarray(x, np.float64) - r
    num, den = float(np.vdot(d, d)), float(np.vdot(r, r))
    return 0.0 if num == 0 else (num / den if den else math.inf)


def snr_db(nmse_value: float) -> float:
    """−10·log10(NMSE): the signal-to-noise ratio in decibels (inf for no error)."""
    return math.inf if nmse_value == 0 else -10 * math.log10(nmse_value)


def round_activations(x: np.ndarray, vec_dot_type: str) -> tuple[np.ndarray, np.ndarray | None]:
    """ggml's rounding of activation rows [rows, n] to ``vec_dot_type``, back as float64, and the
    per-element step d (block types) or None."""
    x32 = np.ascontiguousarray(x, dtype=np.float32)  # [rows, n]
    if vec_dot_type == "F32":
        return x32.astype(np.float64), None
    if vec_dot_type in ("F16", "BF16"):
        kind = TYPES[vec_dot_type]
        return dequantize(quantize(x32, kind), kind, x32.size).reshape(x32.shape).astype(np.float64), None
    kind = TYPES["Q8_0"]  # Q8_1's values are Q8_0's
    if x32.shape[-1] % 32:
        raise RefGPTError(f"activation rows of {x32.shape[-1]} numbers are not whole 32-number blocks")
    x_hat = dequantize(quantize(x32, kind), kind, x32.size).reshape(x32.shape)  # [rows, n]
    blocks = x32.reshape(x32.shape[0], -1, 32)  # [rows, blocks, 32]
    step = (np.abs(blocks).max(axis=2, keepdims=True) / np.float32(127)).astype(np.float64)  # [rows, blocks, 1]
    step = np.broadcast_to(step, blocks.shape).reshape(x32.shape)  # [rows, n]
    return x_hat.astype(np.float64), step


def linear_bound(x: np.ndarray, W: np.ndarray, b: np.ndarray | None, weight_type: str,
                 m: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(reference, bound) for a ggml product of activation rows x [rows, d_in] with weights
    W [d_in, d_out] (dequantized, float64) of ``weight_type``, plus bias b [d_out]: the module
    docstring's formula. ``m``: Q4_1/Q5_1's per-block minimum [d_out, d_in/32] (its s term)."""
    vdt = VEC_DOT_TYPE.get(weight_type)
    if vdt is None:
        raise RefGPTError(f"no bound for a product with {weight_type} weights (supported: {', '.join(VEC_DOT_TYPE)})")
    x_hat, step = round_activations(x, vdt)  # [rows, d_in]
    bias = np.zeros(W.shape[1]) if b is None else np.asarray(b, np.float64)  # [d_out]
    reference = x_hat @ W + bias  # [rows, d_out]
    d_in = W.shape[0]
    n = d_in // 32 + 4 if step is not None else d_in + 2
    gamma = float(bounds.gamma(n, U))  # Higham's γ_n at float32's u
    absW = np.abs(W)  # [d_in, d_out]
    bound = gamma * (np.abs(x_hat) @ absW) + U * (2 * np.abs(reference) + np.abs(bias))  # [rows, d_out]
    if step is not None:
        ratio = np.asarray(x, np.float32).astype(np.float64) / np.where(step == 0, 1, step)  # [rows, d_in]
        near_tie = np.abs(np.abs(ratio - np.trunc(ratio)) - 0.5) <= TIE * np.abs(ratio)  # [rows, d_in]
        bound += (np.where(near_tie, step, 0)) @ absW
        if vdt == "Q8_1" and m is not None:
            block_sum = np.abs(x_hat.reshape(x_hat.shape[0], -1, 32).sum(axis=2))  # [rows, blocks]
            bound += U16 * block_sum @ np.abs(m).T  # [rows, d_out]
    return reference, bound


def int8_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CTranslate2's int8 rounding of activation rows x [rows, n] (its CPU ``quantize_s8``): per row
    a = 127 / max|x| in float32 (1 for a zero row), q = round(x·a) half to even, the product x·a
    rounded to float32 first. Returns (q as float64 integers [rows, n], a [rows] float32)."""
    x32 = np.ascontiguousarray(x, dtype=np.float32)  # [rows, n]
    amax = np.abs(x32).max(axis=-1)  # [rows]
    a = np.where(amax != 0, np.float32(127) / np.where(amax != 0, amax, 1), 1).astype(np.float32)  # [rows]
    return np.rint(x32 * a[:, None]).astype(np.float64), a


def int8_linear_bound(q: np.ndarray, a: np.ndarray, W_q: np.ndarray, w_scale: np.ndarray,
                      b: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(reference, bound) for CTranslate2's int8 product of activation rows already rounded to
    integers q [rows, d_in] with row scales a [rows] (``int8_rows``), by int8 weights W_q [d_out, d_in]
    with row scales w_scale [d_out] (the weight stands for W_q / w_scale), plus bias b [d_out].

    CTranslate2 accumulates c = Σ q·W_q in int32 — exactly (|c| ≤ 127²·d_in < 2³¹) — and its epilogue
    (``dequantize_gemm_output``) computes y = fl(fl(fl(c)·fl(1/a)) / w_scale) (+ b, one more rounding):
    four float32 roundings of c/(a·w_scale), none of a sum. The reference is c/(a·w_scale) + b in
    float64 (= x̂·W + b with x̂ = q/a: the product of the activations it rounded), and

        |y − reference|  ≤  (γ_4 + 2⁻⁵¹)·|c/(a·w_scale)|  [+ u·(|reference| + γ_4·|c/(a·w_scale)|) with a bias]

    (2⁻⁵¹: the reference's own two float64 roundings). The activations' rounding is not in it:
    with the rows' q and a the product is fixed to the last bit but these four roundings."""
    c = np.asarray(q, np.float64) @ np.asarray(W_q, np.float64).T  # [rows, d_out]: integers, exact in float64
    exact = c / (np.asarray(a, np.float64)[:, None] * np.asarray(w_scale, np.float64))  # [rows, d_out]
    bound = (float(bounds.gamma(4, U)) + 2.0**-51) * np.abs(exact)  # [rows, d_out]
    if b is None:
        return exact, bound
    reference = exact + np.asarray(b, np.float64)  # [rows, d_out]
    return reference, bound + U * (np.abs(reference) + bound)


@dataclass
class OpVerdict:
    """One matrix product judged on the candidate's own input."""

    op: str  # the candidate's output tensor, e.g. blocks.3.mlp.hook_pre
    weight: str  # the GGUF weight, e.g. blk.3.ffn_up.weight
    weight_type: str
    worst: float  # max |candidate − reference| / bound
    where: tuple[int, ...]  # the index of the worst element
    error: float  # |candidate − reference| there
    allowed: float  # the bound there

    @property
    def ok(self) -> bool:
        return self.worst <= 1


@dataclass
class TensorSplit:
    name: str
    quantization_nmse: float | None  # float golden vs quantized golden (None: not in the float golden)
    implementation_nmse: float | None  # candidate vs quantized golden (None: the candidate lacks it)


@dataclass
class SplitReport:
    tensors: list[TensorSplit]
    ops: list[OpVerdict]
    quantization: dict[str, str] = field(default_factory=dict)

    @property
    def first_failure(self) -> OpVerdict | None:
        return next((op for op in self.ops if not op.ok), None)

    @property
    def ok(self) -> bool:
        return self.first_failure is None

    def to_dict(self) -> dict:
        """Strict JSON's values: a non-finite number as its name ('inf'), as refgpt's JSON writes them."""
        def clean(d):
            return {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}

        return {"ok": self.ok, "quantization": self.quantization,
                "tensors": [clean(t.__dict__) for t in self.tensors], "ops": [clean(dict(o.__dict__, ok=o.ok)) for o in self.ops]}


#: Each matrix product of a GPT-2: (its input, its outputs, the GGUF weight, refgpt's weight and bias names)
def products(n_layers: int, tied: bool) -> list[tuple[str, tuple[str, ...], str, tuple[str, ...], tuple[str, ...]]]:
    ops = []
    for L in range(n_layers):
        a, blk = f"blocks.{L}.", f"blk.{L}."
        ops += [
            (a + "ln1.out", (a + "attn.hook_q", a + "attn.hook_k", a + "attn.hook_v"), blk + "attn_qkv.weight",
             (a + "attn.W_Q", a + "attn.W_K", a + "attn.W_V"), (a + "attn.b_Q", a + "attn.b_K", a + "attn.b_V")),
            (a + "attn.hook_z", (a + "hook_attn_out",), blk + "attn_output.weight", (a + "attn.W_O",), (a + "attn.b_O",)),
            (a + "ln2.out", (a + "mlp.hook_pre",), blk + "ffn_up.weight", (a + "mlp.W_in",), (a + "mlp.b_in",)),
            (a + "mlp.hook_post", (a + "hook_mlp_out",), blk + "ffn_down.weight", (a + "mlp.W_out",), (a + "mlp.b_out",)),
        ]
    ops.append(("ln_final.out", ("logits",), "token_embd.weight" if tied else "output.weight", ("unembed.W_U",), ()))
    return ops


def _weights(model, weights: tuple[str, ...], biases: tuple[str, ...]):
    p = model.params
    mats = []
    for name in weights:
        W = np.asarray(p[name], np.float64)
        if name.endswith("W_O"):  # [head, d_head, d_model]
            W = W.reshape(-1, W.shape[-1])  # [head·d_head, d_model]
        elif W.ndim == 3:  # W_Q/K/V [head, d_model, d_head]
            W = W.transpose(1, 0, 2).reshape(W.shape[1], -1)  # [d_model, head·d_head]
        mats.append(W)
    W = np.concatenate(mats, axis=1)  # [d_in, d_out]
    b = np.concatenate([np.asarray(p[name], np.float64).reshape(-1) for name in biases]) if biases else None
    return W, b


def gelu_bound(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(reference, bound) for a GELU (gelu_new) of the activations x as ggml computes it in float32
    (ggml-cpu's ``ggml_vec_gelu_f32``): x rounded to float16 (x̃), then a table of
    ``fp16(ggml_gelu_f32(x̃))``, 0 for x ≤ −10 and x for x ≥ 10. The reference is gelu_new(x) in
    float64; the bound, term by term:

        1.13·|x̃ − x|                       the float16 input (sup|gelu_new′| < 1.13; x̃ computed)
      + ε = gelu_new_error(x̃, u) + ½|x̃|·sech²(a)·|a|·γ_2    the float32 formula: the reference's
                                          §7 bound, plus float32's roundings of the two constants
      + U16·(|reference| + 1.13·|x̃ − x| + ε) + 2⁻²⁵       the float16 table entry (2⁻²⁵: half
                                          float16's subnormal step)

    A port computing GELU in float32 without the table is within it too (its x̃ − x and table
    rounding are 0). The clamps at ±10 differ from gelu_new by less than 2⁻²⁵."""
    x = np.asarray(x, np.float64)
    x_tilde = np.where(np.abs(x) < 10, x.astype(np.float32).astype(np.float16).astype(np.float64), x)
    reference = gelu_new(x)  # [..]
    moved = bounds.GELU_LIPSCHITZ * np.abs(x_tilde - x)
    eps = np.zeros_like(x)
    for at in (x, x_tilde):
        a = bounds.SQRT_2_OVER_PI * (at + 0.044715 * at ** 3)  # the tanh argument
        eps = np.maximum(eps, bounds.gelu_new_error(at, U) + 0.5 * np.abs(at) * (1 - np.tanh(a) ** 2) * np.abs(a)
                         * float(bounds.gamma(2, U)))
    return reference, moved + eps + U16 * (np.abs(reference) + moved + eps) + 2.0**-25


def attention_bound(q: np.ndarray, k: np.ndarray, v: np.ndarray, kv_type: str = "F16") -> tuple[np.ndarray, np.ndarray]:
    """(reference, bound) for llama.cpp's attention output z [pos, head, d_head] (``kqv_out-L``) from
    its own causal q, k, v [pos, head, d_head] (``wqkv_b-L``), its KV cache of ``kv_type`` (F16 by
    default; F32).

    What ggml-cpu computes (llama.cpp's build_attn, ops.cpp): K and V are copied to the cache,
    rounded to f16 (k̂, v̂); with flash attention (the default, ``auto``, on the CPU) the vec kernel
    rounds q to f16 (q̂, the dot type of an f16 K), takes each score s = scale·q̂·k̂ in float32, and
    walks the keys once with an online softmax: a new maximum M rescales the accumulator by
    ms = expf(M_old − M), each key adds vs·v̂ with vs = expf(s − M), the accumulator kept **in f16**
    (ggml_vec_mad_f16, ggml_vec_scale_f16: float32 arithmetic, rounded to f16 each step), the sum
    S = S·ms + vs in float32, and z = VKQ·(1/S). From 64 queries a tiled kernel accumulates in float32
    on q unrounded; without flash attention softmax(s) is rounded to f16 and multiplied by v̂ in float32.
    The rounding of k and v is not an error to allow for: the reference is z = softmax(scale·q̂·k̂ᵀ)·v̂
    in float64 (scale = 1/√d_head). What is left, per query (n keys, e = d_head, u = 2⁻²⁴, u₁₆ = 2⁻¹¹,
    P = Σ p·|v̂|, R the range of its scores):

      δ = max_keys [L4 at float32 (local.scores) + scale·|q − q̂|·|k̂|]   the scores (q̂ or q: either kernel)
      softmax(s + Δ) = p·e^θ/Σp·e^θ, |θ| ≤ δ:    |z(s̃) − z| ≤ (e^{2δ} − 1)·P
      η = 2u·(R + 2δ) + 9u·(n + 1)   each weight's expf(s − M) times the later ms's: the subtractions
                                    (u·|s − M|, telescoping over the ms's to ≤ u·R̃), ≤ n + 1 expf at 8u
      a = e^η·(1 + γ_{2n}(u₁₆ + 3u)) − 1   the numerator: ≤ 2n f16 roundings of each term (n adds, ≤ n
                                    rescales), each after ≤ 2 float32 ones
      b = e^η·(1 + γ_{2n}(u)) − 1          the denominator S: 2n float32 roundings
      |N/S − z(s̃)| ≤ (a·e^{2δ}·P + b·(|z| + (e^{2δ} − 1)·P) + 2n·2⁻²⁵·e^η) / (1 − b)
                                    (2⁻²⁵: an f16 rounding below the normal range; S ≥ e^{−η}, the
                                    maximum's weight is 1)
      z = N·(1/S): γ₂(u) of |z| + the above, plus the float64 side's own γ_{2n+e+16}(2⁻⁵³)·(P + |z|).

    The other two kernels' roundings are each within these terms (fewer f16 roundings; float32 sums
    within γ_{2n}(u)). A split of the keys across threads (a single query over ≥ 512 keys) is not
    covered: its partial sums merge by one more rescale each."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))  # [pos, head, d_head]
    kv = {"F16": "float16", "F32": "float32"}.get(kv_type)
    if kv is None:
        raise RefGPTError(f"no attention bound for a {kv_type} KV cache (supported: F16, F32)")
    k_hat, v_hat, q_hat = local.round_to(k, kv), local.round_to(v, kv), local.round_to(q, kv)  # [pos, head, d_head]
    e = q.shape[-1]
    scale = 1 / math.sqrt(e)
    s, ds = local.scores(q_hat, k_hat, scale, local.PRECISIONS["float32"])  # [head, query, key]
    ds = ds + scale * np.einsum("qhe,khe->hqk", np.abs(q - q_hat), np.abs(k_hat))  # [head, query, key]
    allowed = np.isfinite(s)  # [head, query, key]
    delta = np.where(allowed, ds, 0).max(-1, keepdims=True)  # [head, query, 1]
    top = s.max(-1, keepdims=True)  # [head, query, 1]
    spread = top - np.where(allowed, s, np.inf).min(-1, keepdims=True)  # [head, query, 1]: R
    w = np.exp(s - top)  # [head, query, key]
    p = w / w.sum(-1, keepdims=True)  # [head, query, key]
    z = np.einsum("hqk,khe->qhe", p, v_hat)  # [pos, head, d_head]
    P = np.einsum("hqk,khe->qhe", p, np.abs(v_hat))  # [pos, head, d_head]
    n = allowed.sum(-1, keepdims=True)  # [head, query, 1]

    def per_query(x):  # [head, query, 1] → [query, head, 1]
        return np.moveaxis(x, 0, 1)

    delta, spread, n = per_query(delta), per_query(spread), per_query(n)
    eta = 2 * U * (spread + 2 * delta) + 9 * U * (n + 1)  # [query, head, 1]
    a = np.exp(eta) * (1 + bounds.gamma(2 * n, U16 + 3 * U)) - 1
    b = np.exp(eta) * (1 + bounds.gamma(2 * n, U)) - 1
    moved = np.expm1(2 * delta) * P  # [pos, head, d_head]
    inner = (a * np.exp(2 * delta) * P + b * (np.abs(z) + moved) + 2 * n * 2.0**-25 * np.exp(eta)) / (1 - b)
    g2 = float(bounds.gamma(2, U))
    bound = moved + inner + g2 * (np.abs(z) + moved + inner) + bounds.gamma(2 * n + e + 16, 2.0**-53) * (P + np.abs(z))
    return z, bound


def op_verdict(op: str, weight: str, weight_type: str, y, reference, bound) -> OpVerdict:
    """The verdict on ``y`` against (reference, bound): its worst |y − reference| / bound and where
    (an element equal to its reference is within any bound, 0 included)."""
    error = np.abs(y - reference)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(error == 0, 0, error / bound)
    at = np.unravel_index(int(np.nanargmax(np.where(np.isnan(ratio), np.inf, ratio))), ratio.shape)
    return OpVerdict(op, weight, weight_type, float(ratio[at]), tuple(int(i) for i in at), float(error[at]), float(bound[at]))


def layer_norm_bound(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(reference, bound) for a float32 LayerNorm's output w ⊙ x̂ + b [pos, d] on the candidate's
    own input x [pos, d] (ggml: norm, then mul and add): the reference room's L7 at float32
    (refgpt/reference/local.py) — x̂'s bound B — pushed through |w|, plus the output's own rounding
    (``local.layer_norm_out`` on |x̂| + B) and L0's underflow allowance. ggml's 1/σ times ĉ is as
    many roundings as ĉ/σ stored."""
    prec = local.PRECISIONS["float32"]
    x = np.asarray(x, np.float64).reshape(-1, np.shape(x)[-1])  # [rows, d]
    w, b = np.asarray(w, np.float64), np.asarray(b, np.float64)  # [d]
    x_hat, bound = local.layer_norm(x, w, b, eps, prec)["hook_normalized"]  # [rows, d]
    _, out_bound = local.layer_norm_out(np.abs(x_hat) + bound, w, b, prec)  # [rows, d]
    return x_hat * w + b, np.abs(w) * bound + out_bound + prec.tiny


def _resid_pre(candidate: dict, layer: int):
    """The residual stream entering block ``layer``: its hook_resid_pre, or the previous block's
    hook_resid_post (llama.cpp names l_out-(L−1), not the next block's input)."""
    for name in (f"blocks.{layer}.hook_resid_pre", f"blocks.{layer - 1}.hook_resid_post"):
        if name in candidate:
            return np.asarray(candidate[name], np.float64)
    return None


def judge_products(model, candidate: dict, quantization: dict[str, str]) -> list[OpVerdict]:
    """Every matrix product whose input and outputs the candidate holds, judged on its own input,
    in the order GPT-2 computes them; with each block's GELU (``gelu_bound``) after W_in's product.

    W_O's product, when the candidate does not name its output (llama.cpp: kqv_out-L, then
    ffn_inp-L), is judged as the span z → W_O → +b_O → +resid_pre ending at hook_resid_mid, on the
    candidate's own z and resid_pre r: the reference p + r, with p the product's reference, and
    the bound B·(1 + u) + u·|p + r|, B the product's bound (the last addition rounds once, at
    |y + r| ≤ |p + r| + B)."""
    verdicts = []
    n_layers, params = model.cfg.n_layers, model.params
    for x_name, y_names, gguf_name, weights, biases in products(n_layers, "output.weight" not in quantization):
        layer = int(x_name.split(".")[1]) if x_name.startswith("blocks.") else None
        if x_name.endswith(("ln1.out", "ln2.out")) or x_name == "ln_final.out":
            stream = (_resid_pre(candidate, layer) if x_name.endswith("ln1.out") else
                      candidate.get(f"blocks.{layer}.hook_resid_mid") if x_name.endswith("ln2.out") else
                      candidate.get(f"blocks.{n_layers - 1}.hook_resid_post"))
            if stream is not None and x_name in candidate:
                ln = x_name.rsplit(".", 1)[0]
                reference, bound = layer_norm_bound(stream, params[ln + ".w"], params[ln + ".b"], model.cfg.eps)
                y = np.asarray(candidate[x_name], np.float64).reshape(reference.shape)
                verdicts.append(op_verdict(x_name, "(LayerNorm)", "-", y, reference, bound))
        span = (x_name.endswith("attn.hook_z") and y_names[0] not in candidate
                and f"blocks.{layer}.hook_resid_mid" in candidate and _resid_pre(candidate, layer) is not None)
        if span:
            y_names = (f"blocks.{layer}.hook_resid_mid",)
        if x_name not in candidate or not all(n in candidate for n in y_names):
            continue
        weight_type = quantization.get(gguf_name, "F32")
        W, b = _weights(model, weights, biases)
        x = np.asarray(candidate[x_name], np.float64)
        if x.size % W.shape[0] or any(np.size(candidate[n]) * W.shape[0] != x.size * w for n, w in
                                      zip(y_names, [W.shape[1] // len(y_names)] * len(y_names))):
            raise RefGPTError(f"{x_name} {list(x.shape)} → {', '.join(y_names)}: shapes that do not fit a product "
                              f"with {gguf_name} [{W.shape[0]} → {W.shape[1]}]")
        rows = x.reshape(-1, W.shape[0])  # [rows, d_in]
        y = np.concatenate([np.asarray(candidate[n], np.float64).reshape(rows.shape[0], -1) for n in y_names], axis=1)
        reference, bound = linear_bound(rows, W, b, weight_type)  # [rows, d_out]
        if span:
            resid = _resid_pre(candidate, layer).reshape(reference.shape)  # [rows, d_model]
            reference = reference + resid  # [rows, d_model]
            bound = bound * (1 + U) + U * np.abs(reference)
        op = y_names[0] if len(y_names) == 1 else y_names[0].rsplit(".", 1)[0] + ".hook_qkv"
        verdicts.append(op_verdict(op, gguf_name, weight_type, y, reference, bound))
        a = f"blocks.{layer}.attn."
        if y_names[0] == a + "hook_q" and a + "hook_z" in candidate:
            q, k, v = (np.asarray(candidate[a + x], np.float64) for x in ("hook_q", "hook_k", "hook_v"))
            shape = (-1, model.cfg.n_heads, model.cfg.d_model // model.cfg.n_heads)
            reference, bound = attention_bound(q.reshape(shape), k.reshape(shape), v.reshape(shape))
            z = np.asarray(candidate[a + "hook_z"], np.float64).reshape(reference.shape)
            verdicts.append(op_verdict(a + "hook_z", "(attention)", "F16", z, reference, bound))
        pre, post = f"blocks.{layer}.mlp.hook_pre", f"blocks.{layer}.mlp.hook_post"
        if y_names == (pre,) and post in candidate:
            if np.shape(candidate[post]) != np.shape(candidate[pre]):
                raise RefGPTError(f"{post} {list(np.shape(candidate[post]))}: not the shape of {pre} "
                                  f"{list(np.shape(candidate[pre]))}")
            reference, bound = gelu_bound(candidate[pre])
            verdicts.append(op_verdict(post, "(GELU)", "-", np.asarray(candidate[post], np.float64), reference, bound))
        a = f"blocks.{layer}."
        if y_names == (a + "hook_mlp_out",) and all(a + n in candidate for n in ("hook_resid_mid", "hook_resid_post")):
            reference, bound = local.add(np.asarray(candidate[a + "hook_resid_mid"], np.float64).reshape(y.shape), y,
                                         local.PRECISIONS["float32"])
            y_post = np.asarray(candidate[a + "hook_resid_post"], np.float64).reshape(reference.shape)
            verdicts.append(op_verdict(a + "hook_resid_post", "(add)", "-", y_post, reference, bound))
    return verdicts


#: llama.cpp's graph tensor names (what its eval callback, ``cb_eval``, sees) → refgpt's, for GPT-2
#: (llama.cpp's src/models/gpt2.cpp and llama-graph.cpp); ``wqkv_b-L`` is split into q, k and v.
LLAMA_CPP_NAMES = {"attn_norm": "ln1.out", "kqv_out": "attn.hook_z", "ffn_inp": "hook_resid_mid",
                   "ffn_norm": "ln2.out", "ffn_up_b": "mlp.hook_pre", "ffn_gelu": "mlp.hook_post",
                   "ffn_out": "hook_mlp_out", "l_out": "hook_resid_post"}


#: llama.cpp's GPT-2 input tensors: the embedding rows, the position rows, their sum (inpL)
LLAMA_CPP_INPUTS = {"embd": "hook_embed", "pos_embd": "hook_pos_embed", "inpL": "blocks.0.hook_resid_pre"}


def from_llama_cpp(captured: dict[str, np.ndarray], cfg) -> dict[str, np.ndarray]:
    """llama.cpp's tensors of one sequence (name → float32 array [pos, width], as ggml lays out
    ne = [width, pos]) under refgpt's names, batch 1; names refgpt has no counterpart for are left out."""
    out = {}
    d, h = cfg.d_model, cfg.n_heads
    for name, value in captured.items():
        value = np.asarray(value)
        value = value.reshape(-1, value.shape[-1]) if value.ndim > 1 else value  # [pos, width]
        base, _, layer = name.rpartition("-")
        if name in LLAMA_CPP_INPUTS:
            out[LLAMA_CPP_INPUTS[name]] = value[None]
        elif name == "result_norm":
            out["ln_final.out"] = value[None]
        elif name == "result_output":
            out["logits"] = value[None]
        elif base == "wqkv_b" and layer.isdigit():
            for i, x in enumerate("qkv"):
                out[f"blocks.{layer}.attn.hook_{x}"] = value[None, :, i * d:(i + 1) * d].reshape(1, -1, h, d // h)
        elif base in LLAMA_CPP_NAMES and layer.isdigit():
            target = f"blocks.{layer}.{LLAMA_CPP_NAMES[base]}"
            out[target] = value.reshape(1, -1, h, d // h) if base == "kqv_out" else value[None]
    return out


def split(float_golden, quantized_golden, candidate, model) -> SplitReport:
    """The two errors per tensor and the local verdict of every product (module docstring).

    ``float_golden``, ``quantized_golden``: golden files (paths or refgpt.oracle.golden.Golden);
    ``candidate``: a path (.safetensors, .npz) or a mapping of arrays under refgpt's names;
    ``model``: the quantized file's model (``refgpt.load("m.gguf")``), whose weights and
    ``quantization`` the products are judged with."""
    from .comparison import load

    fg, _, _ = load(float_golden)
    qg, _, q_golden = load(quantized_golden)
    cand, _, _ = load(candidate)
    quantization = dict(getattr(model, "quantization", None) or {})
    if q_golden is not None and "quantization" in q_golden.metadata:
        recorded = json.loads(q_golden.metadata["quantization"])
        if recorded != quantization:
            raise RefGPTError("the quantized golden records other tensor types than the model's file: "
                              "make the golden from the same file")
    for what, other in (("the float golden", fg), ("the candidate", cand)):
        if "tokens" in other and "tokens" in qg and not np.array_equal(np.asarray(other["tokens"]), np.asarray(qg["tokens"])):
            raise RefGPTError(f"{what} ran other tokens than the quantized golden: the three must run the same text")
    tensors = []
    for name, r in qg.items():
        if name in ("tokens", "targets") or not np.issubdtype(np.asarray(r).dtype, np.floating):
            continue
        for what, other in (("the float golden", fg), ("the candidate", cand)):
            if name in other and np.shape(other[name]) != np.shape(r):
                raise RefGPTError(f"{name}: {what} has shape {list(np.shape(other[name]))}, the quantized golden "
                                  f"{list(np.shape(r))}")
        finite = np.isfinite(r)
        q_err = nmse(np.where(finite, fg[name], 0), np.where(finite, r, 0)) if name in fg else None
        i_err = nmse(np.where(finite, r, 0), np.where(finite, cand[name], 0)) if name in cand else None
        tensors.append(TensorSplit(name, q_err, i_err))
    return SplitReport(tensors, judge_products(model, cand, quantization), quantization)


def format_split(report: SplitReport, limit: int | None = None) -> str:
    """The report as a table: per tensor the two errors (NMSE, SNR), then each product's verdict."""
    lines = [f"{'tensor':34} {'quantization NMSE':>17} {'SNR dB':>7}   {'implementation NMSE':>19} {'SNR dB':>7}"]
    for t in report.tensors[:limit]:
        q = "" if t.quantization_nmse is None else f"{t.quantization_nmse:17.3e} {snr_db(t.quantization_nmse):7.1f}"
        i = "" if t.implementation_nmse is None else f"{t.implementation_nmse:19.3e} {snr_db(t.implementation_nmse):7.1f}"
        lines.append(f"{t.name:34} {q:>25}   {i:>27}")
    lines.append("")
    lines.append(f"{'product':30} {'weight':26} {'type':5} {'worst error / bound':>20}")
    for op in report.ops:
        lines.append(f"{op.op:30} {op.weight:26} {op.weight_type:5} {op.worst:20.3g}  {'ok' if op.ok else 'IMPLEMENTATION ERROR'}")
    first = report.first_failure

    def what(op: OpVerdict) -> str:
        return op.weight.strip("()") if op.weight.startswith("(") else f"{op.weight}, {op.weight_type}"

    lines.append("")
    lines.append("every product within its bound: the differences from the float golden are the quantization's"
                 if first is None else
                 f"implementation error at {first.op} ({what(first)}): |candidate − reference| = "
                 f"{first.error:.3g} at {list(first.where)}, {first.worst:.3g}× the bound {first.allowed:.3g} for a "
                 f"correct ggml {what(first) if first.weight.startswith('(') else 'product'} — a bug in the kernel, not the quantization")
    return "\n".join(lines)


__all__ = ["LLAMA_CPP_INPUTS", "LLAMA_CPP_NAMES", "OpVerdict", "attention_bound", "from_llama_cpp", "gelu_bound", "int8_linear_bound", "int8_rows", "layer_norm_bound", "op_verdict", "SplitReport", "TensorSplit", "format_split", "judge_products", "linear_bound", "nmse",
           "products", "round_activations", "snr_db", "split"]
