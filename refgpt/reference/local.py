"""Local verdicts: each op of a port judged on the port's own inputs, at the port's precision.

``bounds.py`` holds two float64 computations to each other. Here one side is a port — float32,
bfloat16 or float16 storage, float32 or float64 accumulation — and the other is gpt2.py's op in
float64, handed the port's *own* values of the op's inputs (its dumped activations, cast up) and
the checkpoint's weights rounded to the port's storage precision. The two then differ by the
port's rounding of that one op (the float64 side's own rounding is added, ~1e-16 relative), so a
bound on that rounding judges the op on its own: an op over its bound is where the error was
introduced, whatever drift it inherited from upstream.

The precision model, stated (``Precision``): a port stores tensors at unit roundoff u_store
(float32 2⁻²⁴, bfloat16 2⁻⁸, float16 2⁻¹¹), accumulates its sums at u_acc, and does elementwise
steps (exp, tanh, the LayerNorm's centring, …) at u_el = max(u_store, u_acc), the coarser of the
two — so a bfloat16 port that upcasts its softmax to float32 is judged by a looser, still sound,
bound. exp, tanh, pow, sqrt are taken within 4 ulps at u_el (8·u_el, relative), as bounds.py's
LIBM. An op's output may be rounded to u_store up to twice (a matmul's result, then its bias add).

The bounds, one computation of the port (P) plus one of float64 (R), each op's inputs the port's
(M = the sum of the terms' magnitudes, γ_k(u) = k·u/(1 − k·u), U = 2⁻⁵³):

  L0 underflow: every element also gets 4·(half the smallest subnormal) absolute: a probability
     of 3e-8 stored in float16 is 0. A port may flush subnormals to 0 (FTZ and DAZ, as oneDNN's
     bfloat16 matmuls do, and every float32 op of a C port built with -Ofast), so an L3/L6/L11
     output of k products also gets k·(the smallest normal at u_acc) (each may be flushed), a
     subnormal operand, or one whose product with a scale s (L11's ∂q = (s·∂scores)·k) is subnormal,
     counts as the smallest normal pushed through the other operand's |values| (× max(1, s)),
     and a result below the smallest normal may be 0 (L3, L5, L6, L14; L12 and L13 hold it in their
     absolute terms): an -Ofast softmax's exp(s − max) below 2⁻¹²⁶ is 0.
  L1 copy (embedding gathers, a block's resid_pre)   |y_P − y_R| ≤ u_store·|y|   (a change of dtype)
  L2 add (the residual adds, the position add)       ≤ (u_acc + u_store(1 + u_acc) + U)·|y|
  L3 affine y = x·W + b, k terms (q, k, v; attention's output from z with k = n_heads·d_head; the
     MLP's pre and out; the logits):
        g_{k+1}(u_acc)·M·(1 + 2u_store) + u_store(1 + u_store)·(|x·W| + |y|) + γ_{k+1}(U)·M
     (the accumulation, then the product stored and the sum with the bias stored)
  L4 scores s·q·kᵀ, e = d_head     ≤ s·(g_e(u_acc) + 4·u_el + γ_{e+1}(U))·|q|·|k|
     (q·s or √s·q and √s·k scaled first, then the dot, then the output: four roundings at u_el)
  L5 softmax over n keys (bounds.py §6 at the port's precision, for each side):
        p_j·(η_j + Σ p·η + g_{n−1}(u_acc) + u_el) + u_store·p_j,   η = u_el·|s − max s| + 8·u_el
  L6 z = pattern·v over n keys     ≤ (g_n(u_acc)·(1 + 2u_store) + γ_n(U))·|p|·|v| + u_store(1 + u_store)·|z|
  L7 LayerNorm: bounds.py §4 with its sums (Σx, Σĉ²) at u_acc and every other step at u_el, the
     stored mean and mean square one more rounding each at u_el, plus u_store·|value| for the
     stored mean, scale and normalized. Its output w ⊙ x̂ + b from the port's x̂:
     (γ_4(u_el) + γ_2(U))·(|x̂ ⊙ w| + |b|) (product and sum, each at the accumulator and stored).
     Where the port dumped no LayerNorm output (TransformerLens's names have none), the op that
     reads it is judged as a span "ln out → op" from x̂: that bound pushed through |W| is added to L3's.
  L8 gelu_new: bounds.py §7 at u = u_el, plus u_store·|y|.
  L9 log_softmax over n logits, d = x − max x, S = Σ exp d, p = exp y (for each side):
        u_el·(|d_j| + |max x|) + η_j + Σ p·η + g_{n−1}(u_acc) + 9·u_el·(log S + |y_j|) + 2·u_el,
     plus u_store·(1 + |y_j|) once: covers d − log S, x − (max + log S) and log(e/S) (the
     probability stored before its log, where it does not underflow: a log-probability above
     log of the smallest normal), exp and log within 4 ulps. The vocabulary's probs are L5
     with every key allowed.
  L10 a loss −log p from the port's stored probability: (8·u_el + u_store + 8·U)·|y| (from the
     port's log_probs it is L1's negated copy; from its logits, L9 at the target).
  L16 LayerNorm from its input x [n] to its output y = w ⊙ (x − μ)·r + b, r = 1/√(σ² + ε), for ANY
     algorithm whose mean and variance are within (A = max|x|, per position)
        |μ̂ − μ| ≤ e_μ = γ_{2n+8}(u_acc)·A        |σ̂² − σ²| ≤ e_v = γ_{4n+32}(u_acc)·A²
     (``layer_norm_any``: chosen by the caller for a port that says so, never L7's default). What
     gives these: Σx and Σx² or Σ(x − μ̂)² in any order, one pass or two: μ within γ_n·A, σ² within
     (3γ_{n+2} + 3u)·A² (the one-pass E[x²] − μ² is the worst: its μ² carries 2|μ|·e_μ); Welford's
     updates m_k = m + (x_k − m)/k: a convex combination, so step k's rounding (≤ 2u·2A/k + u·A)
     is damped by k/n: μ within u·(n/2 + 5)·A; M2_k = M2 + (x_k − m̂_{k−1})(x_k − m̂_k): n products
     each carrying the running means' errors (≤ 4A·u(k/2 + 5)·A) and three roundings: σ² within
     u·(n + 32)·A² + γ_n·σ². torch's CPU kernel (aten/src/ATen/native/cpu/layer_norm_kernel.cpp,
     moments_utils.h: Welford over chunks, in float32 for bfloat16 and float16, the chunks' states
     merged by Chan's update, itself a convex combination of the means plus δ²·n_a·n_b/n) is
     assumed within the same: stated, measured (benchmarks/RESULTS.md), not derived here.
     L16 is a fused kernel's bound (torch's, any one-kernel LayerNorm): every step at u_acc, only y
     stored. r̂ = 1/√(σ̂² + ε) in three roundings and ≤ 4 ulps (as LIBM) at u_acc: relative error
        ρ = (1 + 8u_acc)(1 + γ_3(u_acc))/√(1 − t) − 1,   t = e_v/(σ² + ε)   (t ≥ 1: no bound, ∞)
     x̂ as (x − μ̂)·r̂ or x·r̂ − μ̂·r̂, FMA or not: |x̂_P − x̂| ≤ E = r·[e_μ(1 + ρ) + |x − μ|·ρ
     + γ_2(u_acc)·(|x| + |μ| + e_μ)(1 + ρ)]; y = x̂·w + b: |w|·E + γ_2(u_acc)·(|x̂ ⊙ w| + |w|·E + |b|),
     stored once (u_store·|y|), plus the float64 side's own (§4's x̂ bound ·|w|, γ_2(U)).
L4 and L5 take the keys ``allowed`` per query: causal by default, the last queries of the keys for a
decode step (its queries read the port's own KV cache), and the pad keys of a padded row masked.

The backward (L11–L15): each op's backward from the port's own upstream gradient and saved forward
values, the same two computations (P and R). Every line is linear in the gradient it is handed:
  L11 a backward product — ∂final = ∂logits·W_Uᵀ (k = d_vocab), ∂post = ∂mlp_out·W_outᵀ, ∂ln2.out =
      ∂pre·W_inᵀ, ∂z = ∂attn_out·W_Oᵀ, ∂pattern = ∂z·vᵀ (k = e; the future keys are not judged),
      ∂v = patternᵀ·∂z (k = pos), ∂q = s·∂scores·k and ∂k = s·∂scoresᵀ·q (k = pos), ∂ln1.out =
      ∂q·W_Qᵀ + ∂k·W_Kᵀ + ∂v·W_Vᵀ (one sum of k = 3·h·e, or three and two adds: 2(u_el + u_store)·M
      more), and every parameter's gradient (k = batch·pos; each product may be stored first: u_el·M
      more, autograd's elementwise multiply before its sum) — is L3 with b = 0; a scale s other
      than 1 is a rounded constant applied to an operand or the product: 2·u_el·M more (U·M for R).
      Each product of the port may underflow: k·(half the smallest subnormal at u_acc) absolute.
  L12 LayerNorm's backward, from the port's ∂out, x̂ and σ (gpt2.py's textbook on the port's values),
      ĝ = ∂out ⊙ w, M = mean|ĝ ⊙ x̂|, K = (|ĝ| + mean|ĝ| + |x̂|·M)/σ:
        (g_{2n}(u_acc) + 8·u_el + γ_{2n+6}(U))·(K + mean K) + (|mean x̂| + u_el·mean|x̂|)·M/σ·(1 + 8u_el)
        + u_store·|∂x| + 2n·(the smallest normal: L0)/σ
      — ĝ, mean ĝ, mean(ĝ ⊙ x̂) (two products, a sum, /n), x̂·that, two subtractions and ×1/σ or /σ
      (σ or rstd rounded): ≤ 8 roundings at u_el on terms bounded by K; a port chaining ∂σ, ∂c, ∂μ
      (refgpt's, autograd's) sums n terms twice (the second: the ∂c's, whose mean is mean K), and
      differs from the textbook by mean(x̂)·mean(ĝ ⊙ x̂)/σ exactly (bounds.py §9), mean(x̂) the port's
      own up to a rounding of each x̂. Added to the residual stream's gradient: L2. A port that dumped
      no x̂ (llm.c) recomputes it as (x − μ)·rstd: two roundings at u_el, pushed through the map.
  L13 the softmax's backward p ⊙ (∂p − Σ p ⊙ ∂p) from the port's pattern and ∂pattern, M = Σ p·|∂p|:
        p·[(E + (2u_el + u_store)·(|∂p| + |Σ p ⊙ ∂p| + E))·(1 + 3u_el) + γ_{n+1}(U)·M + 3U·(…)],
        E = (g_n(u_acc) + 2u_el)·M   (the products and their sum; the difference, ×p, stored)
  L14 the loss's ∂logits = (softmax(logits) − onehot)/count from the port's logits: L5 over the
      vocabulary without the mask, then the subtraction, ×1/count (a rounded constant) and the store:
      (L5 + (3u_el + u_store + 3U)·|p − onehot|)/count; a position without a target: 0.
  L15 ∂W_E, a scatter-add of ∂embed over the positions holding each token (c of them), added up in
      the stored precision (torch's index_add on a bfloat16 tensor):
      (g_c(u_el)·(1 + u_store) + γ_c(U))·Σ|terms| + u_store·|∂W_E|.
  The activations' backward ∂post ⊙ f′(pre): the tanh GELUs by bounds.py §8 at u_el with their three
  constants (c, 0.044715, 3·0.044715) rounded; relu's exact; tanh, silu, quick_gelu and gelu (erf)
  by ``derivative_error``'s |Δf′| at u_el (and at U), ×|∂post|, + (u_el + U)·|∂pre| for the product;
  all + u_store·|∂pre|. The residual stream's copies of a gradient
  (∂mlp_out = ∂resid_post, …, ∂hook_embed = ∂resid_pre₀): L1.
  Where the port dumped no ∂out of a LayerNorm, its reader's backward (W_in, q/k/v, the unembedding)
  and the LayerNorm's are judged as one span, the reader's L11 bound pushed through L12's map.

g is the kind of bound, stated for each op in the report:
  worst          g_k(u) = γ_k(u) = k·u/(1 − k·u): any order, blocking or FMA (Higham §3.1). Blind
                 for long sums: float32 at k = 50,257 allows 3e-3.
  probabilistic  g_k(u) = exp(λ·√k·u + k·u²/(1 − u)) − 1 (Higham & Mary 2019, SIAM J. Sci.
                 Comput. 41(5), Thm 2.4): holds with probability ≥ 1 − 2k·exp(−λ²(1 − u)²/2) if
                 the rounding errors are independent and of mean zero — a model, not a theorem
                 about every order (constant terms summed sequentially break it); λ is chosen
                 here for a stated failure probability per sum (``lambda_for``).

Assumptions a port can break without a bug (so not default everywhere): a LayerNorm done by
Welford's update or with rsqrt is not L7's two-pass computation (L16 is its bound, chosen for such a
port by name: refgpt/oracle/local.py's ``layer_norm="any"``); a port whose dumped tensor is not
the value its next op read (a float32 value dumped as bfloat16) is judged on the dump.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import bounds, gpt2
from .bounds import U, gamma
from .compare import UNIT_ROUNDOFF

#: Half the smallest subnormal: a rounding's absolute error where the value underflows.
UNDERFLOW = {"float64": 2.0 ** -1075, "float32": 2.0 ** -150, "bfloat16": 2.0 ** -134, "float16": 2.0 ** -25}
#: The smallest normal number: a port may read a subnormal input as 0 and flush a subnormal result
#: to 0 (DAZ, FTZ: oneDNN's bfloat16 matmuls do), an absolute error below this.
NORMAL = {"float64": 2.0 ** -1022, "float32": 2.0 ** -126, "bfloat16": 2.0 ** -126, "float16": 2.0 ** -14}


@dataclass(frozen=True)
class Precision:
    """A port's arithmetic: ``store`` the dtype of its tensors and weights, ``acc`` of its sums."""

    store: str
    acc: str

    @property
    def u_store(self) -> float:
        return UNIT_ROUNDOFF[self.store]

    @property
    def u_acc(self) -> float:
        return UNIT_ROUNDOFF[self.acc]

    @property
    def u_el(self) -> float:
        return max(self.u_store, self.u_acc)

    @property
    def tiny(self) -> float:
        """L0: the absolute error allowed every element for underflow: four roundings (the stored
        output and up to three elementwise steps) at half the smallest subnormal of the coarser of
        the two precisions' ranges."""
        return 4 * max(UNDERFLOW[self.store], UNDERFLOW[self.acc])

    def __str__(self):
        return self.store if self.store == self.acc else f"{self.store} (accumulating in {self.acc})"


#: The named precisions: float32 and float64 accumulate in their own precision; the 16-bit ones in
#: float32, as torch's CPU and GPU matmuls do.
PRECISIONS = {
    "float64": Precision("float64", "float64"),
    "float32": Precision("float32", "float32"),
    "bfloat16": Precision("bfloat16", "float32"),
    "float16": Precision("float16", "float32"),
}


def round_to(x, store):
    """x rounded to the nearest value of dtype ``store`` (ties to even), as float64. bfloat16 is
    float32's upper half: x goes through float32 first (values already float32, such as a
    checkpoint's weights, round once)."""
    x = np.asarray(x, np.float64)
    if store == "float64":
        return x
    if store in ("float32", "float16"):
        return x.astype(store).astype(np.float64)
    bits = x.astype(np.float32).view(np.uint32)  # [...] a new array, worked on in place
    tie = (bits >> 16) & 1  # [...] round to nearest even on the low half: +0x7FFF, +1 if the kept part is odd
    bits += 0x7FFF  # no wrap: a finite float32's bits + 0x8000 < 2³²; ∞ and NaN keep their class
    bits += tie
    bits &= 0xFFFF0000
    return bits.view(np.float32).astype(np.float64)


def lambda_for(k, p_fail):
    """λ with 2k·exp(−λ²(1 − u)²/2) ≤ p_fail (u's factor ≤ 1 + 1e-7 is dropped: λ is rounded up)."""
    return math.sqrt(2 * math.log(2 * k / p_fail)) * (1 + 1e-6)


@dataclass(frozen=True)
class Kind:
    """Which bound judges a sum: "worst" (γ_k) or "probabilistic" (Higham & Mary, failure
    probability ``p_fail`` per sum)."""

    name: str = "worst"
    p_fail: float = 1e-9

    def g(self, k, u):
        if self.name == "worst":
            return gamma(k, u)
        k = np.asarray(k, np.float64)
        lam = lambda_for(float(np.max(k)), self.p_fail)
        return np.expm1(lam * np.sqrt(k) * u + k * u * u / (1 - u))

    def __str__(self):
        return "worst case" if self.name == "worst" else f"probabilistic (P(exceed) ≤ {self.p_fail:g} per sum)"


WORST = Kind("worst")


# ---- each op: gpt2.py's value on the port's inputs, and the bound --------------------------------


def copy(y, prec):
    """L1: an embedding gather; the reference is the (rounded) weight's row."""
    return prec.u_store * np.abs(y)


def add(a, b, prec):
    """L2: (a + b, bound)."""
    y = a + b  # [...]
    return y, (prec.u_acc + prec.u_store * (1 + prec.u_acc) + U) * np.abs(y)


def affine(x, W, b, spec, prec, kind=WORST, dx=None, scale=1.0, stored=False):
    """L3: (scale·(x·W) + b by einsum ``spec``, bound); ``dx`` a bound on x's own error (a span's
    input); ``scale`` ≠ 1 (L11's ∂q, ∂k): applied to an operand or the product, and itself a rounded
    constant: two more roundings at u_el for the port, one at U for float64; ``stored``: each
    product may be stored before the sum (autograd's multiply, then sum: L11's ∂w), u_el more."""
    k = int(np.prod([W.shape[i] for i in contracted(spec)]))
    product = scale * np.einsum(spec, x, W, optimize=True)  # [...] (optimize: by BLAS)
    y = product + b  # [...]
    magnitude = abs(scale) * np.einsum(spec, np.abs(x), np.abs(W), optimize=True) + np.abs(b)  # [...]
    g = kind.g(k + 1, prec.u_acc) + ((scale != 1) * 2 + stored) * prec.u_el  # the port's sum, ×scale, products
    bound = (g * magnitude * (1 + 2 * prec.u_store) + rounded(prec, product, y) + gamma(k + 1 + (scale != 1)) * magnitude
             + flushed(y, prec, k))  # L0: products, output
    for operand in (0, 1):  # DAZ: a subnormal operand read as 0; FTZ: an operand times the scale flushed (L0)
        a = (x, W)[operand]
        if np.any((a != 0) & (np.abs(a) * min(1.0, abs(scale)) < NORMAL[prec.store])):  # the operand, or s × it
            read_as_0 = np.where((a != 0) & (np.abs(a) * min(1.0, abs(scale)) < NORMAL[prec.store]), NORMAL[prec.store], 0.0)
            bound = bound + max(1.0, abs(scale)) * np.einsum(  # |W| not kept past its sum (W_U's is 309 MB)
                spec, *((read_as_0, np.abs(W)) if operand == 0 else (np.abs(x), read_as_0)), optimize=True)
    if dx is not None:  # x's own error pushed through |W|, and the port's sums and roundings of it
        spread = g * (1 + 2 * prec.u_store) + 2 * prec.u_store * (1 + prec.u_store)
        bound = bound + (1 + spread) * abs(scale) * np.einsum(spec, dx, np.abs(W), optimize=True)
    return y, bound


def flushed(y, prec, k=0):
    """L0 (FTZ): each of an output's ``k`` products may be flushed to 0 (the smallest normal at u_acc
    each), and a result below the smallest normal (of the storage or the accumulator, the larger) may
    be 0 — where the reference is below twice it, so a port value just under it counts too."""
    normal = max(NORMAL[prec.store], NORMAL[prec.acc])
    return k * NORMAL[prec.acc] + normal * (np.abs(y) < 2 * normal)


def rounded(prec, *values):
    """The output's roundings to u_store, one per value the port may have stored (the product,
    then the product plus the bias): u_store·(1 + u_store)·Σ|value| (the accumulation's own error
    times u_store is counted by the caller's (1 + 2u_store))."""
    return prec.u_store * (1 + prec.u_store) * sum(np.abs(v) for v in values)


def contracted(spec):
    """The axes of the weight (an einsum's second operand) summed over."""
    inputs, output = spec.split("->")
    x, w = inputs.split(",")
    return [i for i, letter in enumerate(w) if letter not in output]


def causal(queries, keys):
    """[query, key] True where a query may attend: the last ``queries`` of ``keys`` positions (a
    decode step's new ones), each to itself and every key before it."""
    return np.tril(np.ones((queries, keys), dtype=bool), k=keys - queries)


def scores(q, k, scale, prec, kind=WORST, allowed=None):
    """L4: (s·q·kᵀ [head, query, key], −∞ where not ``allowed`` [query, key] (default causal), bound)."""
    e = q.shape[-1]
    y = np.einsum("qhe,khe->hqk", q, k) * scale  # [head, query, key]
    magnitude = scale * np.einsum("qhe,khe->hqk", np.abs(q), np.abs(k))  # [head, query, key]
    allowed = causal(*y.shape[-2:]) if allowed is None else allowed  # [query, key]
    bound = (kind.g(e, prec.u_acc) + 4 * prec.u_el + gamma(e + 1)) * magnitude
    return np.where(allowed, y, -np.inf), np.where(allowed, bound, np.inf)


def softmax(s, prec, kind=WORST, allowed=None):
    """L5: (softmax over the last axis of the port's scores where ``allowed`` [query, key] (default
    causal; the vocabulary's softmax: all), bound)."""
    allowed = causal(*s.shape[-2:]) if allowed is None else allowed  # [query, key]
    s = np.where(allowed, s, -np.inf)  # [head, query, key]
    n = np.maximum(np.broadcast_to(allowed, s.shape).sum(-1, keepdims=True), 2)  # [..., 1] keys seen
    with np.errstate(invalid="ignore"):  # a row with no key allowed (a pad's query) is NaN: not judged
        p = gpt2.softmax(s)  # [head, query, key]
        return p, (bounds.softmax_error(p, s, prec.u_el, kind.g(n - 1, prec.u_acc))
                   + bounds.softmax_error(p, s, U, gamma(n - 1)) + prec.u_store * p + flushed(p, prec))


def log_softmax(x, prec, kind=WORST):
    """L9: (log-softmax of the port's logits [..., n], bound)."""
    m = x.max(-1, keepdims=True)  # [..., 1]
    d = x - m  # [..., n]
    log_sum = np.log(np.exp(d).sum(-1, keepdims=True))  # [..., 1]
    y = d - log_sum  # [..., n]
    bound = prec.u_store * (1 + np.abs(y))
    for u_el, g in ((prec.u_el, kind.g(x.shape[-1] - 1, prec.u_acc)), (U, gamma(x.shape[-1] - 1))):
        eta = u_el * np.abs(d) + 8 * u_el  # [..., n]
        bound = bound + (u_el * (np.abs(d) + np.abs(m)) + eta + (np.exp(y) * eta).sum(-1, keepdims=True) + g
                         + 9 * u_el * (log_sum + np.abs(y)) + 2 * u_el)
    return y, bound


def neg_log(p, prec):
    """L10: (−log p, bound): a loss from the port's probability of the target."""
    with np.errstate(divide="ignore"):
        y = -np.log(p)  # [...]
    return y, (8 * prec.u_el + prec.u_store + 8 * U) * np.abs(y)


def mix(p, v, prec, kind=WORST):
    """L6: (z = pattern·v [pos, head, d_head], bound)."""
    n = p.shape[-1]
    z = np.einsum("hqk,khe->qhe", p, v)  # [pos, head, d_head]
    magnitude = np.einsum("hqk,khe->qhe", np.abs(p), np.abs(v))  # [pos, head, d_head]
    return z, (kind.g(n, prec.u_acc) * (1 + 2 * prec.u_store) + gamma(n)) * magnitude + rounded(prec, z) + flushed(z, prec, n)


def layer_norm(x, w, b, eps, prec):
    """L7: gpt2.layer_norm on the port's x [pos, d] → {stat: (value, bound)} for hook_mean,
    hook_scale and hook_normalized (the output w ⊙ x̂ + b is ``layer_norm_out``'s)."""
    out, stats = gpt2.layer_norm(x, w, b, eps)
    port = bounds.layer_norm_bounds(x, stats["hook_scale"], eps, prec.u_el, prec.u_acc)
    own = bounds.layer_norm_bounds(x, stats["hook_scale"], eps)
    judged = {}
    for name, e_port, e_own in zip(("hook_mean", "hook_scale", "hook_normalized"), port, own):
        value = stats[name]
        judged[name] = (value, e_port + e_own + prec.u_store * np.abs(value))
    return judged


def layer_norm_out(normalized, w, b, prec):
    """L7's output from the port's x̂ [pos, d]: (w ⊙ x̂ + b, bound)."""
    y = normalized * w + b  # [pos, d_model]
    return y, (gamma(4, prec.u_el) + gamma(2)) * (np.abs(normalized * w) + np.abs(b))


def gelu_new(pre, prec):
    """L8: (gelu_new of the port's pre, bound)."""
    return gpt2.gelu_new(pre), (bounds.gelu_new_error(pre, prec.u_el) + bounds.gelu_new_error(pre)
                                + prec.u_store * np.abs(gpt2.gelu_new(pre)))


# ---- the backward: each op's backward from the port's own upstream gradient and saved values ----


def layer_norm_backward(grad, w, normalized, scale, prec, kind=WORST, dgrad=None, dnormalized=None):
    """L12: (gpt2.layer_norm_backward's ∂x [pos, d] from the port's ∂out, x̂ and σ, bound);
    ``dgrad``, ``dnormalized`` bounds on the port's ∂out and x̂ own errors (a span's input)."""
    n = grad.shape[-1]
    dx = gpt2.layer_norm_backward(grad, w, normalized, scale)[0]  # [pos, d_model]
    g, xh = np.abs(grad * w), np.abs(normalized)  # [pos, d_model]
    M = (g * xh).mean(-1, keepdims=True)  # [pos, 1]
    K = (g + g.mean(-1, keepdims=True) + xh * M) / scale  # [pos, d_model]
    K = K + K.mean(-1, keepdims=True)
    formulas = (np.abs(normalized.mean(-1, keepdims=True)) + prec.u_el * xh.mean(-1, keepdims=True)) * M / scale
    bound = ((kind.g(2 * n, prec.u_acc) + 8 * prec.u_el + gamma(2 * n + 6)) * K + formulas * (1 + 8 * prec.u_el)
             + prec.u_store * np.abs(dx) + 2 * n * NORMAL[prec.acc] / scale)
    if dgrad is not None:  # the linear map of ∂out, in absolute values
        e = np.abs(w) * dgrad  # [pos, d_model]
        bound = bound + (1 + 8 * prec.u_el) * (e + e.mean(-1, keepdims=True) + xh * (e * xh).mean(-1, keepdims=True)) / scale
    if dnormalized is not None:  # x̂ + δ: −(δ·mean(g x̂) + x̂·mean(g δ) + δ·mean(g δ))/σ, and mean(x̂)'s term
        m = (g * dnormalized).mean(-1, keepdims=True)  # [pos, 1]
        bound = bound + (1 + 8 * prec.u_el) * ((dnormalized + dnormalized.mean(-1, keepdims=True)) * (M + m)
                                               + xh * m) / scale
    return dx, bound


def activation_backward(act, pre, grad, prec):
    """L8's backward, every activation gpt2.ACTIVATIONS holds: (∂post ⊙ f′(pre) from the port's pre
    and ∂post, bound); the tanh GELUs by bounds.py §8 at u_el with their three constants rounded, the
    others by ``derivative_error``; then ×∂post and the store."""
    y = gpt2.ACTIVATIONS[act][1](pre, grad)  # [pos, d_mlp]
    if act in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):  # gelu_fast: §8 with c = 0.7978845608
        e = bounds.gelu_new_backward_error(pre, grad, prec.u_el, constants=3) + bounds.gelu_new_backward_error(pre, grad)
    else:
        e = np.abs(grad) * (derivative_error(act, pre, prec.u_el) + derivative_error(act, pre, U)) + (prec.u_el + U) * np.abs(y)
    return y, e + prec.u_store * np.abs(y)


def derivative_error(act, x, u):
    """|f̂′(x) − f′(x)| of one computation at unit roundoff u, exp, tanh and erf within 4 ulps (8u):
    relu exact; tanh 1 − t², t within 8u: 17u·t² + 2u·|1 − t²|; silu and quick_gelu s + a·x·s·(1 − s),
    s = σ(a·x) within ε = (2|a·x| + 12)·u relative (a rounded and a·x: 2u relative in exp's argument,
    exp's 8u, 1 + e, the division), then the products (4 roundings) and the sum; gelu
    Φ(x) + x·φ(x): erf(x·√½) within 8u + its argument's 3u through erf′, x·φ within (x² + 12)·u."""
    if act == "relu":
        return np.zeros_like(x)
    if act == "tanh":
        t = np.tanh(x)
        return 17 * u * t * t + 2 * u * np.abs(1 - t * t)
    if act == "gelu":
        z, phi = x * np.sqrt(0.5), np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)
        erf = np.vectorize(math.erf, otypes=[float])(z)
        return (0.5 * (8 * u * np.abs(erf) + 3 * u * np.abs(z) * 2 / np.sqrt(np.pi) * np.exp(-z * z) + u * (1 + np.abs(erf)))
                + np.abs(x) * phi * (x * x + 12) * u + u * (0.5 * (1 + erf) + np.abs(x) * phi))
    a = 1.702 if act == "quick_gelu" else 1.0  # silu, swish
    ax = np.abs(a * x)
    s = gpt2.sigmoid(a * x)
    eps = (2 * ax + 12) * u
    return eps * s + ax * s * (eps * (1 - s) + eps * s + u * (1 - s)) + 5 * u * ax * s * (1 - s) + u * s


def softmax_backward(p, dp, prec, kind=WORST):
    """L13: (p ⊙ (∂p − Σ p ⊙ ∂p) [head, query, key] from the port's pattern and ∂pattern, bound)."""
    n = p.shape[-1]
    weighted = (p * dp).sum(-1, keepdims=True)  # [head, query, 1]
    y = p * (dp - weighted)  # [head, query, key]
    M = (p * np.abs(dp)).sum(-1, keepdims=True)  # [head, query, 1]
    e_sum = (kind.g(n, prec.u_acc) + 2 * prec.u_el) * M  # the products, their sum
    size = np.abs(dp) + np.abs(weighted) + e_sum  # [head, query, key]
    return y, p * ((e_sum + (2 * prec.u_el + prec.u_store) * size) * (1 + 3 * prec.u_el)
                   + gamma(n + 1) * M + 3 * U * size) + n * NORMAL[prec.acc]


def cross_entropy_backward(logits, targets, count, prec, kind=WORST):
    """L14: ((softmax(logits) − onehot(targets))/count [pos, d_vocab] from the port's logits, bound);
    a position whose target is negative (−100) has none: 0."""
    p, bound = softmax(logits, prec, kind, allowed=True)  # [pos, d_vocab]
    has = targets >= 0  # [pos]
    p[has, targets[has]] -= 1
    return np.where(has[:, None], p / count, 0.0), np.where(
        has[:, None], (bound + (3 * prec.u_el + prec.u_store + 3 * U) * np.abs(p)) / count + flushed(p / count, prec), 0.0)


def scatter(tokens, grad, d_vocab, prec, kind=WORST):
    """L15's ∂W_E: Σ of ∂embed [N, d] over the positions holding each token → [d_vocab, d], bound."""
    y, M = np.zeros((d_vocab, grad.shape[-1])), np.zeros((d_vocab, grad.shape[-1]))  # [d_vocab, d_model]
    np.add.at(y, tokens, grad)
    np.add.at(M, tokens, np.abs(grad))
    count = np.maximum(np.bincount(tokens, minlength=d_vocab), 1)[:, None]  # [d_vocab, 1]
    return y, (kind.g(count, prec.u_el) * (1 + prec.u_store) + gamma(count)) * M + prec.u_store * np.abs(y)

def layer_norm_any(x, w, b, eps, prec):
    """L16: (gpt2.layer_norm's output on the port's x [pos, d], bound) for any mean and variance
    algorithm within L16's e_μ and e_v (Welford's, torch's CPU kernel)."""
    y, stats = gpt2.layer_norm(x, w, b, eps)
    n, u = x.shape[-1], prec.u_acc  # a fused kernel: its steps at the accumulator's precision
    A = np.abs(x).max(-1, keepdims=True)  # [pos, 1]
    e_mean = gamma(2 * n + 8, u) * A  # [pos, 1]
    scale, mean = stats["hook_scale"], stats["hook_mean"]  # [pos, 1] √(σ² + ε), μ
    t = gamma(4 * n + 32, u) * A * A / (scale * scale)  # [pos, 1] e_v/(σ² + ε)
    solvable = t < 1  # [pos, 1] else σ̂² may be 0: no bound
    rho = (1 + 8 * u) * (1 + gamma(3, u)) / np.sqrt(np.where(solvable, 1 - t, 1)) - 1  # [pos, 1]
    e_norm = (e_mean * (1 + rho) + np.abs(x - mean) * rho + gamma(2, u) * (np.abs(x) + np.abs(mean) + e_mean)
              * (1 + rho)) / scale  # [pos, d_model] |x̂_P − x̂|
    own = bounds.layer_norm_bounds(x, scale, eps)[2]  # [pos, d_model] the float64 side's x̂
    xw = np.abs(stats["hook_normalized"] * w)  # [pos, d_model]
    bound = (np.abs(w) * (e_norm + own) + gamma(2, u) * (xw + np.abs(w) * e_norm + np.abs(b))
             + gamma(2) * (xw + np.abs(b)) + rounded(prec, y))  # [pos, d_model]
    return y, np.where(solvable, bound, np.inf)
