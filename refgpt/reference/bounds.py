"""Each op's rounding bound, derived, and the walks that hold a computation to ``gpt2.py`` op by op.

``check_forward`` and ``check_backward`` hand each of gpt2.py's functions a computation's *own*
values of that function's inputs (a fast pass's cache, a golden file, a padded row, a KV-cached
step …) and compare each value the function returns with the computation's value of the same
thing, within the bound below; a ``Ledger`` records every comparison by op and fails at the first
one over its bound, naming the tensor, the element and both values. The bounds are float64's
(u = 2⁻⁵³, the walks' precision); ``gamma(k, u)`` is Higham's γ_k at any unit roundoff.

The derivation ("gpt2" below is gpt2.py; "the path" the computation judged):

§1 The principle. Each of gpt2's functions (layer_norm, attention, mlp, softmax, gelu_new,
cross_entropy, their backwards, and forward's and backward's one-line steps) is handed the path's
own values of its inputs — what the path's op read — and each value it returns is compared with
the path's value of the same thing. Same function, same input: the two differ by rounding only,
so the bound is the path's worst-case rounding error plus gpt2's (Higham, Accuracy and Stability
of Numerical Algorithms, §3.1: a sum of k terms in any order or grouping — BLAS blocking,
pairwise summation, FMA — is within γ_k·Σ|terms| of the exact sum, γ_k = k·u/(1 − k·u),
u = 2⁻⁵³). Inside one function a later line reads that function's own earlier values, which
differ from the path's by rounding; that measured difference δ is pushed through the line by its
Lipschitz constant (a product: |a_f·b_f − a_p·b_p| ≤ |a_f − a_p|·|b_f| + |a_p|·|b_f − b_p|,
exactly). Nothing is carried from one function to the next, so the bounds do not grow with depth
and a wrong op fails at that op. The walk itself is checked: handed gpt2's own activations and
gradients, every difference is exactly 0 (its wiring is gpt2.forward's and gpt2.backward's).
Conventions. The bounds are first order in u: exact values inside a bound (σ, p, …) are taken at
gpt2's computed values, a relative O(k·u) ≤ 1e-12 off, and the bounds are evaluated in float64;
SLACK = 1 + 1e-9 covers both. A divisor is never the path's value, so a wrong path cannot widen
its own bound. np.exp, np.tanh, np.log and np.power are taken to be within 4 ulps (NumPy's
documented bound for its SIMD kernels; measured ≤ 1.2 ulps here against long-double references by
test_libm_is_within_the_4_ulps_assumed), and an ulp of y is ≤ 2u·|y|: LIBM = 8u, relative.

§2 Exact ops. One correctly rounded operation on the same operands gives the same bits: the
embedding lookup, the residual adds, the −∞ of the causal and padding masks, exp(−∞) = 0 (masked
pattern entries are exactly 0), relu, ×2ᵏ, the residual stream's copies of a gradient; and every activation but gelu_new with its backward: gpt2.py
writes them operation for operation as the engine does (refgpt/gpt2/activations.py), so on the
path's own input they give the path's bits. Bound 0.

§3 Affine ops (q, k, v, the MLP's pre, the logits): y = x·W + b, inner length k. Each computation
is within γ_{k+1}·(|x|·|W| + |b|) of the exact value (b the (k+1)-th term), so
|y_f − y_p| ≤ 2·γ_{k+1}·(|x|·|W| + |b|). Where the inputs differ (attention's output reads z, the
MLP's output reads post): γ_{k+1}·(|x_f|·|W| + |x_p|·|W| + 2|b|) + |x_f − x_p|·|W|.

§4 LayerNorm, n = d_model. The mean fl(fl(Σx)/n) is within γ_n·mean|x| =: E_μ. The centered
ĉ = fl(x − μ̂) is within δc = E_μ(1 + u) + u·C of c, where C = |ĉ|(1 + 2u) + E_μ ≥ |c|. The
variance: Σc = 0 exactly, so mean(ĉ²) − mean(c²) = 2·mean(c·(ĉ − c)) + mean((ĉ − c)²), and the
mean's error — the same shift of every ĉ — drops out of the first term (∂σ/∂μ = 0): what is left
is ≤ 2u·mean(C·(C + E_μ)) + mean(δc²); the squares, their sum, /n and + ε add
γ_{n+1}·mean(C²) + u·(mean(C²) + ε); together E_v (refgpt's overflow guard first scales ĉ by a
power of two: exact, the same bound). The scale σ̂ = fl(√(…)) is within
E_σ = E_v/(σ̂ + √(σ̂² − E_v)) + u·σ̂, the normalized fl(ĉ/σ̂) within
(δc + u·(C + δc))/σ_lo + C·E_σ/σ_lo², σ_lo = σ̂ − 2E_σ. Each ×2 for the two computations. The
output w ⊙ x̂ + b: |w|·|x̂_f − x̂_p| + γ_2·(|x̂_f ⊙ w| + |x̂_p ⊙ w| + 2|b|).

§5 Attention, s = score_scale, e = d_head. The path's scores are fl(q·s)·k (γ_{e+1}·s·|q_f|·|k_f|),
gpt2's fl(q·k)·s (γ_{e+1}·s·|q_p|·|k_p|), and q_f − q_p, k_f − k_p pushed through add
s·(|Δq|·|k_f| + |q_p|·|Δk|). z = pattern·v over n keys: γ_n·(|p_f|·|v_f| + |p_p|·|v_p|)
+ |Δp|·|v_f| + |p_p|·|Δv|. The output: §3 with Δz. attend_in_blocks shows neither scores nor
pattern: its z is held to gpt2's z by the same lines with the bounds themselves pushed through.

§6 Softmax over n entries. Rounding, one computation: d = fl(s − max s) = (s − max s)(1 + θ) and
exp's own error make ê_j = e_j·(1 + η_j), |η_j| ≤ u·|d_j| + LIBM; Σê = Σe·(1 + η̄) with η̄ = Σ p_j·η_j
(a mean weighted by p, not the largest η: a key far below the maximum, with a large |d|, weighs
~0); the sum adds γ_{n−1}, the division u: |p̂_j − p_j| ≤ p_j·(η_j + η̄ + γ_{n−1} + u). Between
two inputs: softmax(s + δ)_j / softmax(s)_j = e^{δ_j} / Σ_i p_i·e^{δ_i}, which lies within
e^{±(|δ_j| + max|δ|)}, so |Δp_j| ≤ p_j·expm1(|δ_j| + max|δ|), for any δ.

§7 gelu_new(x) = ½x·(1 + tanh a), a = c·(x + 0.044715·x³), c = √(2/π) as both compute it (the same
float: checked). a's relative error is ≤ γ_5 + LIBM (five roundings; gpt2's x³ is a pow call), so
|t̂ − tanh a| ≤ sech²(a)·|a|·(γ_5 + LIBM) + LIBM·|tanh a| =: δt; then 1 + t̂ and ×x (×½ is exact):
|ĝ − g| ≤ ½|x|·(δt + γ_3·(1 + tanh a)). The path's nine in-place steps (x·x, ·x, ·0.044715, + x,
·c, tanh, + 1, ·x, ·½) are the same roundings in the same order. Between two inputs: the Lipschitz
constant sup|gelu_new′| = 1.12899… < 1.13 (checked on a grid).

§8 gelu_new's backward, ∂pre = ∂post·f′(pre), f′ = ½(1 + t) + ½x·S·D, S = 1 − t² (= sech² a),
D = c·(1 + 3·0.044715·x²): ½(1 + t̂) is within ½·(δt + u·(1 + t)), Ŝ within 2δt + γ_2 + LIBM
(t² ≤ 1: the cancellation stays an absolute error), the product within ½|x|·D·(that + S·(γ_6 +
LIBM)), the sum and ×∂post add γ_2·|f′|; all ×|∂post|. At fixed pre the backward is linear in
∂post: between two ∂post, |f′(pre)|·|Δ∂post| (relu: 0 or 1, exact).

§9 The backward's products and sums. The forward's values are fixed — the path's, handed to both —
so each backward line is linear in the incoming gradient: products and sums bound as in §3, with
the measured differences of the incoming gradients pushed through |the linear map|. A parameter's
gradient sums N = batch·pos terms: the path in one pass, gpt2 a row at a time with the rows added
here: γ_{N+rows}·(Σ|terms| of both). LayerNorm's backward, g = ∂out ⊙ w, M = mean|g ⊙ x̂|,
K = (|g| + |x̂|·M)/σ: gpt2's textbook (g − mean g − x̂·mean(g ⊙ x̂))/σ is within
γ_{n+5}·(K_i + mean K), the path's ∂σ, ∂c, ∂μ, ∂x (layernorm.py) within γ_{2n+6}·(K_i + mean K)
(the sum of the n ∂c's and its /n): 2γ_{2n+6}·(K_i + mean K), + u·(|sum_f| + |sum_p|) where the
residual stream's gradient is added to it. The two formulas are one function only where x̂ sums to
0; a computed x̂'s mean is the forward's centring error, so they differ by exactly
mean(x̂)·mean(g ⊙ x̂)/σ, added to the bound (found by hypothesis at d_model = 2, |x| ≫ σ).

§10 Attention's backward, line by line: ∂z = ∂out·W_Oᵀ (§3); ∂pattern = ∂z·vᵀ (inner e) and
∂v = patternᵀ·∂z (inner pos), both with Δ∂z pushed through; ∂scores = p ⊙ (∂p − Σ p ⊙ ∂p): each
computation within p_j·γ_{n+2}·(|∂p_j| + Σ_k p_k·|∂p_k|), and between two ∂p,
p_j·(|Δ∂p_j| + Σ_k p_k·|Δ∂p_k|); ∂q = s·∂scores·k and ∂k = s·∂scoresᵀ·q (+1 for ×s);
∂x = ∂q·W_Qᵀ + ∂k·W_Kᵀ + ∂v·W_Vᵀ (γ_{h·e+2}); the weights' gradients as §9.

§11 Cross-entropy, V = d_vocab. ∂logits = (softmax − onehot)/n: per computation (§6's rounding
+ γ_2·|p − onehot|)/n; the path divides by batch·n at once, gpt2's by n is divided here by batch:
one more rounding, u·|∂logits|. A position's loss
ℓ = −log p_t: gpt2 takes the log of p̂_t (§6's relative error becomes an absolute one, + LIBM·ℓ);
the path — and the golden's log_softmax — takes log Σ exp(d) − d_t: log's input within η̄ + γ_V,
+ LIBM·|log Σ exp d| (≤ ℓ + |d_t|), + u·|d_t| + u·ℓ. The mean over N positions adds
γ_{N+rows}·mean ℓ on each side.
"""

import numpy as np

from . import gpt2

U = 2.0 ** -53  # float64's unit roundoff
LIBM = 8 * U  # §1: np.exp, np.tanh, np.log, np.power within 4 ulps, and an ulp of y is ≤ 2u·|y|
SLACK = 1 + 1e-9  # §1: the bounds are evaluated at computed values, in float64
GELU_LIPSCHITZ = 1.13  # §7: sup |gelu_new′| = 1.12899… (test_plain checks it)
SQRT_2_OVER_PI = np.sqrt(2 / np.pi)  # gpt2's and activations.py's constant (test_plain checks they are one)


def gamma(k, u=U):
    """Higham's γ_k = k·u/(1 − k·u): a sum of k terms, in any order, is within γ_k·Σ|terms|."""
    k = np.asarray(k, np.float64)
    return k * u / (1 - k * u)


class Ledger:
    """Every comparison made, by op: the largest |path − gpt2| / bound and the largest |path − gpt2|.
    A comparison over its bound fails at once, naming the tensor, the element and both values."""

    def __init__(self):
        self.ratio: dict[str, float] = {}
        self.largest: dict[str, float] = {}

    def compare(self, op, name, path, ref_value, bound):
        """|path − ref_value| ≤ bound·SLACK elementwise (equal infinities differ by 0); returns the
        measured |path − ref_value|, the difference the next line propagates."""
        path, ref_value = np.asarray(path, np.float64), np.asarray(ref_value, np.float64)
        assert path.shape == ref_value.shape, (name, path.shape, ref_value.shape)
        with np.errstate(invalid="ignore"):
            diff = np.where(path == ref_value, 0.0, np.abs(path - ref_value))  # [...]
        diff = np.where(np.isnan(diff), np.inf, diff)  # a NaN on one side is infinitely wrong
        limit = np.broadcast_to(np.asarray(bound, np.float64) * SLACK, diff.shape)  # [...]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(diff == 0, 0.0, diff / limit)  # [...]
        ratio = np.where(np.isnan(ratio), np.inf, ratio)  # a NaN bound (∞·0 upstream) allows nothing
        worst = float(ratio.max(initial=0.0))
        self.ratio[op] = max(self.ratio.get(op, 0.0), worst)
        self.largest[op] = max(self.largest.get(op, 0.0), float(diff.max(initial=0.0)))
        if worst > 1:
            i = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
            raise AssertionError(f"{name} ({op}) at {tuple(int(j) for j in i)}: path {path[i]!r}, gpt2 "
                                 f"{ref_value[i]!r}, |Δ| {diff[i]:.3g} > bound {limit[i]:.3g} ({worst:.3g}×)")
        return diff

    def exact(self, op, name, path, ref_value):
        """The same value bit for bit (§2: one correctly rounded operation on the same operands)."""
        return self.compare(op, name, path, ref_value, 0.0)

    def merge(self, other):
        for op, r in other.ratio.items():
            self.ratio[op] = max(self.ratio.get(op, 0.0), r)
            self.largest[op] = max(self.largest.get(op, 0.0), other.largest[op])

    def merge_from(self, other):
        """``merge``, returning ``other``."""
        self.merge(other)
        return other


def absolute(*arrays):
    return [np.abs(a) for a in arrays]


# ---- one computation's rounding error, from §3–§8 ----------------------------------------------


def affine_bound(x, W, b, spec):
    """§3, both computations: 2·γ_{k+1}·(|x|·|W| + |b|), k the inner length; ``spec`` the einsum."""
    k = x.shape[-1]
    return 2 * gamma(k + 1) * (np.einsum(spec, np.abs(x), np.abs(W)) + np.abs(b))


def softmax_error(p, scores, u=U, sums=None):
    """§6, one computation: |p̂ − p| ≤ p·(η + Σ p·η + γ_{n−1} + u), η = u·|s − max s| + 8u, for
    p = softmax(scores) over the last axis (−∞ entries: p = 0, exactly), every step at unit
    roundoff u; ``sums``: the sum's bound in place of γ_{n−1}(u) (refgpt/reference/local.py L5)."""
    shifted = scores - scores.max(-1, keepdims=True)  # [..., n] ≤ 0, −∞ where masked
    eta = u * np.abs(np.where(np.isfinite(shifted), shifted, 0.0)) + 8 * u  # [..., n]
    eta_mean = (p * eta).sum(-1, keepdims=True)  # [..., 1]
    return p * (eta + eta_mean + (gamma(scores.shape[-1] - 1, u) if sums is None else sums) + u)  # [..., n]


def softmax_propagation(p, d_scores):
    """§6: |softmax(s + δ) − softmax(s)| ≤ softmax(s)·expm1(|δ_j| + max|δ|), row by row."""
    return p * np.expm1(d_scores + d_scores.max(-1, keepdims=True))


def gelu_new_error(x, u=U):
    """§7, one computation of gelu_new(x), every step rounded at unit roundoff u (tanh and pow
    within 4 ulps at that precision: 8u)."""
    libm = 8 * u
    a = SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)  # the tanh argument
    t = np.tanh(a)
    dt = (1 - t * t) * np.abs(a) * (gamma(5, u) + libm) + libm * np.abs(t)  # |t̂ − tanh(a)|
    return 0.5 * np.abs(x) * (dt + gamma(3, u) * (1 + t))


def gelu_new_backward_error(x, grad, u=U, constants=0):
    """§8, one computation of gelu_new_backward(x, grad) = grad·f′(x), every step rounded at unit
    roundoff u (tanh and pow within 4 ulps: 8u); ``constants``: how many of its constants (c,
    0.044715, 3·0.044715) the computation holds rounded to u, each one more rounding in a and in D."""
    libm = 8 * u
    a = SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)
    t = np.tanh(a)
    dt = (1 - t * t) * np.abs(a) * (gamma(5 + constants, u) + libm) + libm * np.abs(t)
    S = 1 - t * t  # sech²
    D = SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)  # ∂a/∂x > 0
    derivative = 0.5 * (1 + t) + 0.5 * x * S * D
    error = (0.5 * (dt + u * (1 + t))
             + 0.5 * np.abs(x) * D * ((2 * dt + gamma(2, u) + libm) + S * (gamma(6 + constants, u) + libm)))
    return np.abs(grad) * (error + gamma(2, u) * np.abs(derivative))


def layer_norm_bounds(x, scale, eps, u=U, u_sum=None):
    """§4, one computation of LayerNorm on x [pos, n] whose scale (gpt2's) is ``scale``, every step
    rounded at unit roundoff u: bounds on its mean, its scale and its normalized value. ``u_sum``:
    the two sums (Σx, Σĉ²) accumulate at u_sum instead, and their means are then rounded once more
    at u (a bfloat16 tensor's mean, summed in float32: refgpt/reference/local.py L7)."""
    n = x.shape[-1]
    extra = 0.0 if u_sum is None else 2 * u  # the squares' (or /n's) rounding and the stored mean's
    u_sum = u if u_sum is None else u_sum
    e_mean = (gamma(n, u_sum) + extra) * np.abs(x).mean(-1, keepdims=True)  # [pos, 1]
    C = np.abs(x - x.mean(-1, keepdims=True)) * (1 + 2 * u) + e_mean  # [pos, n] ≥ |x − μ| (exact)
    e_centered = e_mean * (1 + u) + u * C  # [pos, n] |ĉ − c|
    squares = (C * C).mean(-1, keepdims=True)  # [pos, 1]
    e_var = (2 * u * (C * (C + e_mean)).mean(-1, keepdims=True) + (e_centered ** 2).mean(-1, keepdims=True)
             + (gamma(n + 1, u_sum) + extra) * squares + u * (squares + eps))  # [pos, 1] |fl(mean ĉ² + ε) − σ²|
    low = scale * (1 - u)
    e_scale = e_var / (low + np.sqrt(np.maximum(low * low - e_var, 0))) + u * scale * (1 + u)  # [pos, 1]
    low = scale - 2 * e_scale  # ≤ the exact σ and either computed one
    e_normalized = (e_centered + u * (C + e_centered)) / low + C * e_scale / (low * low)  # [pos, n]
    return e_mean, e_scale, e_normalized


# ---- the forward, op by op ---------------------------------------------------------------------


def check_layer_norm(ledger, acts, prefix, x, w, b, eps):
    """gpt2.layer_norm on the path's input x [pos, d_model]; returns the path's output w ⊙ x̂ + b
    (its ``prefix + "out"`` when the path has one, as a golden file does)."""
    out, stats = gpt2.layer_norm(x, w, b, eps)
    e_mean, e_scale, e_norm = layer_norm_bounds(x, stats["hook_scale"], eps)
    ledger.compare("ln mean", prefix + "hook_mean", acts[prefix + "hook_mean"], stats["hook_mean"], 2 * e_mean)
    ledger.compare("ln scale", prefix + "hook_scale", acts[prefix + "hook_scale"], stats["hook_scale"], 2 * e_scale)
    normalized = acts[prefix + "hook_normalized"]  # [pos, d_model]
    d_norm = ledger.compare("ln normalized", prefix + "hook_normalized", normalized, stats["hook_normalized"], 2 * e_norm)
    handed_on = acts.get(prefix + "out", normalized * w + b)  # [pos, d_model], what the path's next op read
    bound = np.abs(w) * d_norm + gamma(2) * (np.abs(normalized * w) + np.abs(stats["hook_normalized"] * w) + 2 * np.abs(b))
    ledger.compare("ln out", prefix + "out", handed_on, out, bound)
    return handed_on


def scores_bound(q_f, k_f, q_p, k_p, dq, dk, score_scale):
    """§5: s·[γ_{e+1}·(|q_f|·|k_f| + |q_p|·|k_p|) + Δq·|k_f| + |q_p|·Δk] [head, query, key]."""
    e = q_f.shape[-1]
    dot = lambda a, b: np.einsum("qhe,khe->hqk", a, b)  # noqa: E731
    aq_f, ak_f, aq_p, ak_p = absolute(q_f, k_f, q_p, k_p)
    return score_scale * (gamma(e + 1) * (dot(aq_f, ak_f) + dot(aq_p, ak_p)) + dot(dq, ak_f) + dot(aq_p, dk))


def z_bound(p_f, v_f, p_p, v_p, dp, dv):
    """§5: γ_n·(|p_f|·|v_f| + |p_p|·|v_p|) + Δp·|v_f| + |p_p|·Δv [pos, head, d_head], n keys."""
    mix = lambda a, b: np.einsum("hqk,khe->qhe", a, b)  # noqa: E731
    av_f, av_p = absolute(v_f, v_p)
    return gamma(p_f.shape[-1]) * (mix(np.abs(p_f), av_f) + mix(np.abs(p_p), av_p)) + mix(dp, av_f) + mix(np.abs(p_p), dv)


def out_bound(z_f, z_p, dz, W_O, b_O):
    """§3 with the input's difference: γ_{k+1}·(|z_f|·|W_O| + |z_p|·|W_O| + 2|b_O|) + Δz·|W_O|."""
    k = z_f.shape[-2] * z_f.shape[-1]
    mix = lambda a: np.einsum("phe,hed->pd", a, np.abs(W_O))  # noqa: E731
    return gamma(k + 1) * (mix(np.abs(z_f)) + mix(np.abs(z_p)) + 2 * np.abs(b_O)) + mix(dz)


def check_attention(ledger, acts, prefix, x, weights, score_scale, out_name, edited=None):
    """gpt2.attention on the path's input x [pos, d_model]. ``edited``: "scores" or "pattern" if a
    hook edited that activation: from there on gpt2's lines are handed the path's (edited) values."""
    W_Q, b_Q, W_K, b_K, W_V, b_V, W_O, b_O = weights
    out_p, a = gpt2.attention(x, *weights, score_scale)
    d = {}
    for n, W, bias in (("q", W_Q, b_Q), ("k", W_K, b_K), ("v", W_V, b_V)):
        d[n] = ledger.compare("q, k, v", prefix + f"hook_{n}", acts[prefix + f"hook_{n}"], a[f"hook_{n}"],
                              affine_bound(x, W, bias, "pd,hde->phe"))
    q_f, k_f, v_f = (acts[prefix + f"hook_{n}"] for n in "qkv")
    scores_f, pattern_f, z_f = (acts[prefix + n] for n in ("hook_attn_scores", "hook_pattern", "hook_z"))
    if edited == "scores":
        d_scores, ref_pattern = np.zeros(scores_f.shape), gpt2.softmax(scores_f)  # gpt2's softmax of the hooked scores
        softmax_input = scores_f
    else:
        softmax_input = a["hook_attn_scores"]
        bound = scores_bound(q_f, k_f, a["hook_q"], a["hook_k"], d["q"], d["k"], score_scale)
        d_scores = ledger.compare("scores", prefix + "hook_attn_scores", scores_f, a["hook_attn_scores"],
                                  np.where(np.isfinite(a["hook_attn_scores"]), bound, 0.0))
        ref_pattern = a["hook_pattern"]
    if edited == "pattern":
        d_pattern = np.zeros(pattern_f.shape)
    else:
        bound = 2 * softmax_error(ref_pattern, softmax_input) + softmax_propagation(ref_pattern, d_scores)
        d_pattern = ledger.compare("pattern", prefix + "hook_pattern", pattern_f, ref_pattern, bound)
    if edited:  # gpt2's z and out lines, handed the path's edited pattern
        ref_pattern = pattern_f if edited == "pattern" else ref_pattern
        z_p = np.einsum("hqk,khe->qhe", ref_pattern, a["hook_v"])  # [pos, head, d_head], gpt2.attention's line
    else:
        z_p = a["hook_z"]
    d_z = ledger.compare("z", prefix + "hook_z", z_f, z_p,
                         z_bound(pattern_f, v_f, ref_pattern, a["hook_v"], d_pattern, d["v"]))
    if edited:
        out_p = np.einsum("phe,hed->pd", z_p, W_O) + b_O  # [pos, d_model], gpt2.attention's line
    ledger.compare("attn out", out_name, acts[out_name], out_p, out_bound(z_f, z_p, d_z, W_O, b_O))


def check_mlp(ledger, acts, b, x, W_in, b_in, W_out, b_out, act):
    """gpt2.mlp on the path's input x [pos, d_model]. gelu_new (§7): gpt2's own formula, which the
    path computes in another order; every other activation is written in gpt2.py operation for
    operation as the engine computes it: on the path's own pre it gives the path's post bit for
    bit (§2), and the output line is handed the path's post."""
    out_p, m = gpt2.mlp(x, W_in, b_in, W_out, b_out, act)
    pre_f, post_f = acts[b + "mlp.hook_pre"], acts[b + "mlp.hook_post"]
    d_pre = ledger.compare("mlp pre", b + "mlp.hook_pre", pre_f, m["hook_pre"], affine_bound(x, W_in, b_in, "pd,dm->pm"))
    if act in TANH_GELU:
        bound = gelu_new_error(pre_f) + gelu_new_error(m["hook_pre"]) + GELU_LIPSCHITZ * d_pre
        d_post, post_p = ledger.compare(act, b + "mlp.hook_post", post_f, m["hook_post"], bound), m["hook_post"]
    else:
        post_p = gpt2.ACTIVATIONS[act][0](pre_f)  # [pos, d_mlp], on the path's pre
        d_post = ledger.exact(act, b + "mlp.hook_post", post_f, post_p)
        out_p = post_p @ W_out + b_out  # [pos, d_model], gpt2.mlp's line
    k = W_in.shape[1]
    bound = (gamma(k + 1) * ((np.abs(post_f) + np.abs(post_p)) @ np.abs(W_out) + 2 * np.abs(b_out))
             + d_post @ np.abs(W_out))
    ledger.compare("mlp out", b + "hook_mlp_out", acts[b + "hook_mlp_out"], out_p, bound)


#: The activations whose gpt2.py formula is gelu_new's (§7), bounded rather than equal.
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")


def check_forward(ledger, params, cfg, tokens, acts, logits, edited=None):
    """Every op of gpt2.forward on one sequence ``tokens`` [pos], handed the path's activations
    ``acts`` (hook name → [pos, …], no batch axis) and compared with them and its ``logits``.
    ``edited``: {layer: "scores" or "pattern"} where a hook edited attention (check_attention)."""
    p, pos, edited = params, len(tokens), edited or {}
    ledger.exact("embed", "hook_embed", acts["hook_embed"], p["embed.W_E"][tokens])
    ledger.exact("embed", "hook_pos_embed", acts["hook_pos_embed"], p["pos_embed.W_pos"][:pos])
    x = acts["hook_embed"] + acts["hook_pos_embed"]  # [pos, d_model], gpt2.forward's line
    for L in range(cfg.n_layers):
        b = f"blocks.{L}."
        ledger.exact("residual", b + "hook_resid_pre", acts[b + "hook_resid_pre"], x)
        x = acts[b + "hook_resid_pre"]
        h = check_layer_norm(ledger, acts, b + "ln1.", x, p[b + "ln1.w"], p[b + "ln1.b"], cfg.eps)
        check_attention(ledger, acts, b + "attn.", h, [p[b + "attn." + n] for n in gpt2.ATTN_PARAMS],
                        cfg.score_scale(L), b + "hook_attn_out", edited.get(L))
        ledger.exact("residual", b + "hook_resid_mid", acts[b + "hook_resid_mid"], x + acts[b + "hook_attn_out"])
        x = acts[b + "hook_resid_mid"]
        h = check_layer_norm(ledger, acts, b + "ln2.", x, p[b + "ln2.w"], p[b + "ln2.b"], cfg.eps)
        check_mlp(ledger, acts, b, h, *(p[b + "mlp." + n] for n in gpt2.MLP_PARAMS), cfg.act_fn)
        ledger.exact("residual", b + "hook_resid_post", acts[b + "hook_resid_post"], x + acts[b + "hook_mlp_out"])
        x = acts[b + "hook_resid_post"]
    final = check_layer_norm(ledger, acts, "ln_final.", x, p["ln_final.w"], p["ln_final.b"], cfg.eps)
    b_U = p.get("unembed.b_U", 0)
    expected = final @ p["unembed.W_U"] + b_U  # [pos, d_vocab], gpt2.forward's line
    ledger.compare("logits", "logits", logits, expected, affine_bound(final, p["unembed.W_U"], b_U, "pd,dv->pv"))


# ---- the backward, op by op --------------------------------------------------------------------


class ParamGrads:
    """A parameter's gradient summed over the rows of a batch, as the path sums it in one pass
    (§9: a sum of N terms in any order, γ_{N+rows} for the rows' own sums added after)."""

    def __init__(self):
        self.value, self.magnitude, self.propagated, self.terms, self.rows = {}, {}, {}, {}, {}

    def add(self, name, value, magnitude, terms, propagated=0.0):
        """Plain's gradient for one row, Σ|terms| of both computations, their count, and the
        propagated difference of the row's inputs."""
        for store, v in ((self.value, value), (self.magnitude, magnitude), (self.propagated, propagated)):
            store[name] = store.get(name, 0.0) + v
        self.terms[name] = self.terms.get(name, 0) + terms
        self.rows[name] = self.rows.get(name, 0) + 1

    def check(self, ledger, op_of, grads):
        for name, value in self.value.items():
            bound = gamma(self.terms[name] + self.rows[name]) * self.magnitude[name] + self.propagated[name]
            ledger.compare(op_of(name), name, grads[name], value, bound)


def layer_norm_backward_bound(grad, w, normalized, scale):
    """§9, both computations: |Δ∂x| ≤ 2·γ_{2n+6}·(K_i + mean K) + |mean x̂|·mean|g ⊙ x̂|/σ,
    K = (|g| + |x̂|·mean|g ⊙ x̂|)/σ, g = ∂out ⊙ w. The last term is no rounding of the backward: the
    textbook and the engine's chain (layernorm.py: ∂σ, ∂c, ∂μ) are one function only where x̂ sums
    to 0, and a computed x̂ does not — its mean is the forward's centring error, up to γ_n·mean|x|/σ,
    large where |x| ≫ σ — so they differ by mean(x̂)·mean(g ⊙ x̂)/σ exactly."""
    n = grad.shape[-1]
    g = np.abs(grad * w)  # [pos, n]
    M = (g * np.abs(normalized)).mean(-1, keepdims=True)  # [pos, 1]
    K = (g + np.abs(normalized) * M) / scale  # [pos, n]
    formulas = np.abs(normalized.mean(-1, keepdims=True)) * M / scale  # [pos, 1]
    return 2 * gamma(2 * n + 6) * (K + K.mean(-1, keepdims=True)) + formulas * (1 + gamma(n + 4))


def check_layer_norm_backward(ledger, sums, prefix, grad, acts, w, name, path_into, upstream):
    """gpt2.layer_norm_backward handed the path's ∂out, x̂ and σ. The path adds its ∂x to the
    ``upstream`` gradient (the residual stream's, or None): the sum, the path's ``path_into``, is
    compared as ``name`` and returned (it flows on)."""
    normalized, scale = acts[prefix + "hook_normalized"], acts[prefix + "hook_scale"]
    dx, dw, db = gpt2.layer_norm_backward(grad, w, normalized, scale)
    bound = layer_norm_backward_bound(grad, w, normalized, scale)
    if upstream is not None:  # gpt2.backward's dx = dx + dln: one more rounding on each side
        dx = upstream + dx
        bound = bound + U * (np.abs(path_into) + np.abs(dx))
    ledger.compare("ln backward", name, path_into, dx, bound)
    N = len(grad)
    sums.add(prefix + "w", dw, 2 * (np.abs(grad) * np.abs(normalized)).sum(0), N)
    sums.add(prefix + "b", db, 2 * np.abs(grad).sum(0), N)
    return path_into


def check_mlp_backward(ledger, sums, b, grad, x, acts, g_acts, ln_out, W_in, W_out, act):
    """gpt2.mlp_backward handed the path's ∂mlp_out, the MLP's input and its pre and post."""
    saved = {n: acts[b + "mlp." + n] for n in ("hook_pre", "hook_post")}
    dx_p, m = gpt2.mlp_backward(grad, x, saved, W_in, W_out, act)
    ln_out = dx_p if ln_out is None else ln_out
    pre, post = saved["hook_pre"], saved["hook_post"]
    d_model, d_mlp, N = W_in.shape[0], W_in.shape[1], len(grad)
    g_post, g_pre = g_acts[b + "mlp.hook_post"], g_acts[b + "mlp.hook_pre"]
    d_post = ledger.compare("mlp backward", b + "mlp.hook_post grad", g_post, m["hook_post"],
                            2 * gamma(d_model) * np.abs(grad) @ np.abs(W_out).T)
    backward = gpt2.ACTIVATIONS[act][1]
    derivative = np.abs(backward(pre, np.ones_like(pre)))  # [pos, d_mlp] |f′(pre)|
    if act in TANH_GELU:
        bound = gelu_new_backward_error(pre, g_post) + gelu_new_backward_error(pre, m["hook_post"]) + derivative * d_post
    else:  # ∂post ⊙ f′(pre), f′(pre) computed as the engine does: equal on the path's ∂post (§2)
        ledger.exact(f"{act} backward", b + "mlp.hook_pre grad", g_pre, backward(pre, g_post))
        bound = derivative * d_post * (1 + U) + U * (np.abs(g_pre) + np.abs(m["hook_pre"]))
    d_pre = ledger.compare(f"{act} backward", b + "mlp.hook_pre grad", g_pre, m["hook_pre"], bound)
    both = np.abs(g_pre) + np.abs(m["hook_pre"])  # [pos, d_mlp]
    ledger.compare("mlp backward", b + "ln2.out grad", ln_out, dx_p,
                   gamma(d_mlp) * both @ np.abs(W_in).T + d_pre @ np.abs(W_in).T)
    ax = np.abs(x)
    sums.add(b + "mlp.W_out", m["W_out"], 2 * np.abs(post).T @ np.abs(grad), N)
    sums.add(b + "mlp.b_out", m["b_out"], 2 * np.abs(grad).sum(0), N)
    sums.add(b + "mlp.W_in", m["W_in"], ax.T @ both, N, ax.T @ d_pre)
    sums.add(b + "mlp.b_in", m["b_in"], both.sum(0), N, d_pre.sum(0))
    return ln_out


def check_attention_backward(ledger, sums, b, grad, x, acts, g_acts, ln_out, params, score_scale):
    """gpt2.attention_backward handed the path's ∂attn_out, the attention's input and its q … z."""
    a_ = b + "attn."
    saved = {n: acts[a_ + n] for n in ("hook_q", "hook_k", "hook_v", "hook_pattern", "hook_z")}
    W = {n: params[a_ + "W_" + n] for n in "QKVO"}
    dx_p, g = gpt2.attention_backward(grad, x, saved, *W.values(), score_scale)
    ln_out = dx_p if ln_out is None else ln_out
    q, k, v, p, z = saved.values()
    pos, heads, e = q.shape
    d_model, N, s = x.shape[-1], len(grad), score_scale
    path = {n: g_acts[a_ + n] for n in ("hook_z", "hook_pattern", "hook_attn_scores", "hook_q", "hook_k", "hook_v")}

    def both(n):
        return np.abs(path[n]) + np.abs(g[n])

    def compare(n, bound):
        return ledger.compare("attn backward", a_ + n + " grad", path[n], g[n], bound)

    d_z = compare("hook_z", 2 * gamma(d_model) * np.einsum("pd,hed->phe", np.abs(grad), np.abs(W["O"])))
    d_pattern = compare("hook_pattern", gamma(e) * np.einsum("qhe,khe->hqk", both("hook_z"), np.abs(v))
                        + np.einsum("qhe,khe->hqk", d_z, np.abs(v)))
    d_v = compare("hook_v", gamma(pos) * np.einsum("hqk,qhe->khe", p, both("hook_z")) + np.einsum("hqk,qhe->khe", p, d_z))
    keys = p.shape[-1]

    def scores_rounding(dp):
        return p * gamma(keys + 2) * (np.abs(dp) + (p * np.abs(dp)).sum(-1, keepdims=True))

    d_scores = compare("hook_attn_scores", scores_rounding(path["hook_pattern"]) + scores_rounding(g["hook_pattern"])
                       + p * (d_pattern + (p * d_pattern).sum(-1, keepdims=True)))
    d_q = compare("hook_q", s * (gamma(keys + 1) * np.einsum("hqk,khe->qhe", both("hook_attn_scores"), np.abs(k))
                                 + np.einsum("hqk,khe->qhe", d_scores, np.abs(k))))
    d_k = compare("hook_k", s * (gamma(pos + 1) * np.einsum("hqk,qhe->khe", both("hook_attn_scores"), np.abs(q))
                                 + np.einsum("hqk,qhe->khe", d_scores, np.abs(q))))
    diffs = {"Q": d_q, "K": d_k, "V": d_v}
    rounding = sum(np.einsum("phe,hde->pd", both(f"hook_{n.lower()}"), np.abs(W[n])) for n in "QKV")
    propagated = sum(np.einsum("phe,hde->pd", diffs[n], np.abs(W[n])) for n in "QKV")
    ledger.compare("attn backward", b + "ln1.out grad", ln_out, dx_p, gamma(heads * e + 2) * rounding + propagated)
    ax = np.abs(x)
    sums.add(a_ + "W_O", g["W_O"], 2 * np.einsum("phe,pd->hed", np.abs(z), np.abs(grad)), N)
    sums.add(a_ + "b_O", g["b_O"], 2 * np.abs(grad).sum(0), N)
    for n in "QKV":
        hook = f"hook_{n.lower()}"
        sums.add(a_ + f"W_{n}", g[f"W_{n}"], np.einsum("pd,phe->hde", ax, both(hook)), N,
                 np.einsum("pd,phe->hde", ax, diffs[n]))
        sums.add(a_ + f"b_{n}", g[f"b_{n}"], both(hook).sum(0), N, diffs[n].sum(0))
    return ln_out


def log_prob_bounds(rows):
    """§11, for logits ``rows`` [n, d_vocab]: −log softmax [n, d_vocab] and, for every entry, the
    bound on |path − gpt2| where the path computes it as log_softmax (loss.py, activations.py:
    log Σ exp(ℓ − max) − (ℓ − max)) and gpt2 as −log(softmax) (gpt2.cross_entropy)."""
    probs = gpt2.softmax(rows)  # [n, d_vocab]
    shifted = rows - rows.max(-1, keepdims=True)  # [n, d_vocab] ≤ 0
    eta_mean = (probs * (U * np.abs(shifted) + LIBM)).sum(-1, keepdims=True)  # [n, 1]
    nll = -np.log(probs)  # [n, d_vocab]
    common = eta_mean + gamma(rows.shape[-1])  # log's input Σ exp: its relative error
    path = common + LIBM * (nll + np.abs(shifted)) + U * np.abs(shifted) + U * nll
    mine = common + U * np.abs(shifted) + LIBM + LIBM * nll
    return nll, path + mine


def cross_entropy_bounds(logits, tokens):
    """§11, for one row: (the bound on ∂loss/∂logits of both computations [pos, d_vocab], each
    position's loss ℓ [pos − 1] and the bound on it of both computations [pos − 1])."""
    n = len(tokens) - 1
    rows = logits[:-1]  # [pos − 1, d_vocab]
    probs = gpt2.softmax(rows)  # [pos − 1, d_vocab]
    onehot = np.zeros_like(rows)
    onehot[np.arange(n), tokens[1:]] = 1
    grad_bound = np.zeros_like(logits)  # [pos, d_vocab]; the last position has no target: 0 on both sides
    grad_bound[:-1] = 2 * (softmax_error(probs, rows) + gamma(2) * np.abs(probs - onehot)) / n
    nll, bound = log_prob_bounds(rows)
    return grad_bound, nll[np.arange(n), tokens[1:]], bound[np.arange(n), tokens[1:]]


def check_backward(ledger, params, cfg, rows, ln_out=None, dlogits=None):
    """gpt2.backward, op by op, on each sequence of a batch: ``rows`` = [(tokens [pos], acts,
    logits, g_acts)], the path's forward activations and logits and its gradients ∂loss/∂ each
    activation (no batch axis). ``ln_out``: per row, ∂loss/∂ each LayerNorm's output
    (``Gradients.ln_out``); ``dlogits``: per row, ∂loss/∂logits. Returns (ParamGrads, gpt2's mean
    loss and its bound): the caller compares those with the path's parameter gradients and loss
    (``ParamGrads.check``). Without ``ln_out``/``dlogits`` (gpt2's own backward, which returns
    neither) gpt2's values stand in for them."""
    p, sums = params, ParamGrads()
    B = len(rows)
    losses, loss_bounds = [], []
    for r, (tokens, acts, logits, g_acts) in enumerate(rows):
        loss_r, dl_p = gpt2.cross_entropy(logits, tokens)
        grad_bound, per_position, bound = cross_entropy_bounds(logits, tokens)
        losses.append(loss_r)
        loss_bounds.append(bound)
        dl = dl_p if dlogits is None else dlogits[r]
        # The path's mean is over B rows: it divides by B·n once, gpt2 by n, here by B (exact for B = 2ᵏ).
        ledger.compare("cross entropy", "logits grad", dl, dl_p / B, grad_bound / B + U * np.abs(dl_p / B))
        lo = {} if ln_out is None else ln_out[r]
        final = acts["ln_final.hook_normalized"] * p["ln_final.w"] + p["ln_final.b"]  # [pos, d_model]
        N, V = len(tokens), cfg.d_vocab
        sums.add("unembed.W_U", final.T @ dl, 2 * np.abs(final).T @ np.abs(dl), N)  # gpt2.backward's line
        if "unembed.b_U" in p:
            sums.add("unembed.b_U", dl.sum(0), 2 * np.abs(dl).sum(0), N)
        g_final = dl @ p["unembed.W_U"].T  # [pos, d_model], gpt2.backward's line
        if ln_out is not None:
            ledger.compare("unembed backward", "ln_final.out grad", lo["ln_final.out"], g_final,
                           2 * gamma(V) * np.abs(dl) @ np.abs(p["unembed.W_U"]).T)
            g_final = lo["ln_final.out"]
        last = f"blocks.{cfg.n_layers - 1}.hook_resid_post"
        dx = check_layer_norm_backward(ledger, sums, "ln_final.", g_final, acts, p["ln_final.w"], last + " grad",
                                       g_acts[last], None)
        for L in reversed(range(cfg.n_layers)):
            b = f"blocks.{L}."
            ledger.exact("residual backward", b + "hook_resid_post grad", g_acts[b + "hook_resid_post"], dx)
            ledger.exact("residual backward", b + "hook_mlp_out grad", g_acts[b + "hook_mlp_out"], dx)
            h = acts[b + "ln2.hook_normalized"] * p[b + "ln2.w"] + p[b + "ln2.b"]  # [pos, d_model], what the MLP read
            dh = check_mlp_backward(ledger, sums, b, dx, h, acts, g_acts, lo.get(b + "ln2.out"), p[b + "mlp.W_in"],
                                    p[b + "mlp.W_out"], cfg.act_fn)
            dx = check_layer_norm_backward(ledger, sums, b + "ln2.", dh, acts, p[b + "ln2.w"],
                                           b + "hook_resid_mid grad", g_acts[b + "hook_resid_mid"], dx)
            ledger.exact("residual backward", b + "hook_attn_out grad", g_acts[b + "hook_attn_out"], dx)
            h = acts[b + "ln1.hook_normalized"] * p[b + "ln1.w"] + p[b + "ln1.b"]  # [pos, d_model], what attention read
            dh = check_attention_backward(ledger, sums, b, dx, h, acts, g_acts, lo.get(b + "ln1.out"), p,
                                          cfg.score_scale(L))
            dx = check_layer_norm_backward(ledger, sums, b + "ln1.", dh, acts, p[b + "ln1.w"],
                                           b + "hook_resid_pre grad", g_acts[b + "hook_resid_pre"], dx)
        for name in ("hook_embed", "hook_pos_embed"):
            ledger.exact("residual backward", name + " grad", g_acts[name], dx)
        W_E = np.zeros_like(p["embed.W_E"])  # [d_vocab, d_model]
        np.add.at(W_E, tokens, dx)  # gpt2.backward's lines
        magnitude = np.zeros_like(W_E)
        np.add.at(magnitude, tokens, 2 * np.abs(dx))
        sums.add("embed.W_E", W_E, magnitude, N)
        W_pos = np.zeros_like(p["pos_embed.W_pos"])  # [n_ctx, d_model]
        W_pos[:N] = dx
        sums.add("pos_embed.W_pos", W_pos, 2 * np.abs(W_pos), 1)
    n_terms = sum(len(t) - 1 for t, *_ in rows)
    all_losses = np.concatenate([cross_entropy_bounds(lg, t)[1] for t, _, lg, _ in rows])
    loss = sum(losses) / B  # equal lengths: the mean over every position
    bound = np.concatenate(loss_bounds).mean() + 2 * gamma(n_terms + B) * all_losses.mean()
    return sums, loss, bound


def backward_op(name):
    """The op a parameter's gradient is reported under."""
    if ".ln" in name or name.startswith("ln_final"):
        return "ln backward (w, b)"
    if ".attn." in name:
        return "attn backward (weights)"
    if ".mlp." in name:
        return "mlp backward (weights)"
    return "embed, unembed backward"


# ---- reading a path's values row by row ----------------------------------------------------------


def row(arrays, i, real=slice(None)):
    """Row i of every [batch, pos, …] activation, its positions ``real`` (a slice); the attention
    scores and pattern [batch, head, query, key] keep queries and keys ``real``."""
    out = {}
    for name, a in arrays.items():
        a = np.asarray(a)
        if name.endswith(("hook_attn_scores", "hook_pattern")):
            out[name] = a[i][:, real, real]
        elif a.ndim >= 2:
            out[name] = a[i, real]
    return out
