"""docs/steering.md's bounds as functions, shared by tests/analysis/test_steering_limit.py and
docs/make_steering_figures.py (which prints them for the embedded model). § as in docs/steering.md.
Every bound adds the rounding allowances of docs/layernorm.md §6 (ln_bounds.py), evaluated at the
actual activations."""

from __future__ import annotations

import hashlib

import numpy as np

from ln_bounds import ln_rounding
from refgpt.gpt2.layernorm import layer_norm

U = np.finfo(np.float64).eps / 2  # unit roundoff

# sup |act'(t)| for each activation (docs/steering.md §2): the MLP's Lipschitz constant factor.
ACT_LIPSCHITZ = {"gelu_new": 1.13, "gelu_pytorch_tanh": 1.13, "gelu": 1.13, "gelu_fast": 1.13,
                 "quick_gelu": 1.1, "silu": 1.1, "swish": 1.1, "relu": 1.0, "tanh": 1.0}


def gamma(m):
    return m * U / (1 - m * U)


_OPERATOR_NORMS: dict = {}  # (shape, dtype, digest of the bytes) → ‖W‖₂


def op(a):
    """An upper bound on ‖a‖₂, the largest singular value, tight to rounding; remembered by content,
    since the bounds ask for the same weight matrices again and again (every k, every call).

    ‖a‖₂² is the largest eigenvalue of the Gram matrix on a's smaller side (m × m, summing over the
    larger side, r terms). An SVD gives the same number, but its threaded LAPACK path is 100–500×
    slower than a GEMM and an m × m eigvalsh on a loaded 2-core machine (measured side by side:
    W_U of the embedded model, 144 × 8192, 2.6 s against 0.28 s). Rounding, added so the result
    stays an upper bound: the computed Gram is off by at most γ_r·‖a‖_F² in 2-norm, and eigvalsh
    (backward stable) by at most γ_{m²}·‖G‖₂ — together a relative inflation below 10⁻⁹ here."""
    a = np.ascontiguousarray(a, dtype=np.float64)
    key = (a.shape, a.dtype.str, hashlib.blake2b(a.tobytes(), digest_size=16).digest())
    if key not in _OPERATOR_NORMS:
        if len(_OPERATOR_NORMS) > 4096:
            _OPERATOR_NORMS.clear()
        m, r = sorted(a.shape)  # a is a matrix [rows, cols]
        gram = a @ a.T if a.shape[0] <= a.shape[1] else a.T @ a  # [m, m]
        lam = max(float(np.linalg.eigvalsh(gram)[-1]), 0.0) if m else 0.0
        slack = gamma(r) * fro(a) ** 2 + gamma(m * m) * lam
        _OPERATOR_NORMS[key] = float(np.sqrt(lam + slack))
    return _OPERATOR_NORMS[key]


def fro(a):
    return float(np.linalg.norm(a))


def chain_length(model, n_pos):
    """K: the longest chain of sums in one sublayer (projections, scores, softmax, mixing, W_O/W_out)."""
    c = model.cfg
    return 2 * c.d_model + c.d_mlp + 2 * n_pos + 10


# ---- §2: sublayer bounds, independent of the stream -------------------------------------------


def ln_bound(w, b):
    """‖LN(x)‖ ≤ ‖w‖_∞√n + ‖b‖ for every x, since ‖x̂‖ < √n (docs/layernorm.md §1)."""
    return float(np.max(np.abs(w)) * np.sqrt(len(w)) + np.linalg.norm(b))


def attn_bound(model, M, lam, norm=op):
    """‖attn_out‖ ≤ Σ_h ‖W_O^h‖·(‖W_V^h‖·λ + ‖b_V^h‖) + ‖b_O‖: each head's z is a convex mix of v's."""
    p = model.params
    b = f"blocks.{M}.attn."
    heads = sum(norm(p[b + "W_O"][h]) * (norm(p[b + "W_V"][h]) * lam + np.linalg.norm(p[b + "b_V"][h]))
                for h in range(model.cfg.n_heads))
    return float(heads + np.linalg.norm(p[b + "b_O"]))


def mlp_bound(model, M, lam, norm=op):
    """‖mlp_out‖ ≤ ‖W_out‖·(‖W_in‖·λ + ‖b_in‖) + ‖b_out‖, since |act(t)| ≤ |t| for every act."""
    p = model.params
    b = f"blocks.{M}.mlp."
    return float(norm(p[b + "W_out"]) * (norm(p[b + "W_in"]) * lam + np.linalg.norm(p[b + "b_in"]))
                 + np.linalg.norm(p[b + "b_out"]))


def sublayer_bounds(model, M, ln_round1=0.0, ln_round2=0.0, n_pos=None):
    """(attention bound, MLP bound) of block M, each with its rounding allowance added: the
    LayerNorm's §6 allowance (given, at the actual inputs) inside λ, plus γ_K times the same bound
    with Frobenius norms (|W| ≤ ‖W‖_F entrywise products)."""
    p, b = model.params, f"blocks.{M}."
    lam1 = ln_bound(p[b + "ln1.w"], p[b + "ln1.b"]) + ln_round1
    lam2 = ln_bound(p[b + "ln2.w"], p[b + "ln2.b"]) + ln_round2
    g = gamma(chain_length(model, n_pos or model.cfg.n_ctx))
    return (attn_bound(model, M, lam1) + g * attn_bound(model, M, lam1, fro),
            mlp_bound(model, M, lam2) + g * mlp_bound(model, M, lam2, fro))


def max_ln_rounding(model, cache, M, which):
    """The largest §6 LayerNorm allowance over every batch row and position of one LayerNorm."""
    p = model.params
    if which == "final":
        x, w, b = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"], p["ln_final.w"], p["ln_final.b"]
    else:
        x = cache[f"blocks.{M}.hook_resid_{'pre' if which == 'ln1' else 'mid'}"]
        w, b = p[f"blocks.{M}.{which}.w"], p[f"blocks.{M}.{which}.b"]
    return max(ln_rounding(row, w, b, model.cfg.eps) for row in x.reshape(-1, x.shape[-1]))


def stream_bound(model, tokens, layer, position):
    """A k-free bound on ‖P·s‖ at p in every block ≥ L: ‖clean resid_pre_L[p]‖ + Σ sublayer bounds."""
    _, clean = model.run_with_cache(tokens, names=[f"blocks.{layer}.hook_resid_pre"])
    total = float(np.max(np.linalg.norm(clean[f"blocks.{layer}.hook_resid_pre"][:, position], axis=-1)))
    return total + sum(sum(sublayer_bounds(model, M)) for M in range(layer, model.cfg.n_layers))


# ---- §3: the LayerNorm bound with measured ‖Ps‖ ---------------------------------------------


def measured_s(x, k, d):
    """s = x − k·d at one position, and an upper bound on ‖s_true − s‖ from computing it."""
    s = x - k * d  # [d_model]
    return s, 1.01 * U * (abs(k) * np.linalg.norm(d) + np.linalg.norm(s))


def ln_limit_error_bound(x, k, d, w, b, eps):
    """docs/layernorm.md §5 at x = k·d + s with ‖Ps‖ measured, plus the §6 allowances for the
    computed LN(x) and the computed limit LN₀(d). Negative k: d → −d, k → |k|."""
    if k < 0:
        k, d = -k, -d
    s, s_err = measured_s(x, k, d)
    n = len(d)
    D = np.linalg.norm(d - d.mean())
    Ps = np.linalg.norm(s - s.mean()) + s_err
    assert k * D > Ps, "k·‖Pd‖ must exceed ‖Ps‖ for the §5 bound"
    bound = np.max(np.abs(w)) * np.sqrt(n) * (2 * Ps / (k * D) + n * eps / (2 * (k * D - Ps) ** 2))
    return bound + ln_rounding(x, w, b, eps) + ln_rounding(d, w, b, 0.0)


def unembed_rounding(model, y, logits):
    """|fl(y·W_U + b_U) − (y·W_U + b_U)| in 2-norm ≤ γ_n·‖W_U‖_F·‖y‖ + u·‖logits‖."""
    return gamma(model.cfg.d_model) * fro(model.params["unembed.W_U"]) * np.linalg.norm(y) + U * np.linalg.norm(logits)


def limit_logits(model, d):
    """(w_f ⊙ √n·Pd/‖Pd‖ + b_f)·W_U + b_U, and the ln_final output it came from."""
    p = model.params
    y = layer_norm(d, p["ln_final.w"], p["ln_final.b"], 0.0)  # [d_model]
    logits = y @ p["unembed.W_U"]  # [d_vocab]
    if "unembed.b_U" in p:
        logits = logits + p["unembed.b_U"]
    return logits, y


def logits_error_bound(model, x, k, d):
    """‖logits(p) − limit‖ ≤ ‖W_U‖_op·(§5 bound + §6 allowances) + the unembedding's rounding."""
    p = model.params
    lim, y_lim = limit_logits(model, d if k > 0 else -d)
    y = layer_norm(x, p["ln_final.w"], p["ln_final.b"], model.cfg.eps)
    ln = ln_limit_error_bound(x, k, d, p["ln_final.w"], p["ln_final.b"], model.cfg.eps)
    return op(p["unembed.W_U"]) * ln + unembed_rounding(model, y, y @ p["unembed.W_U"]) + unembed_rounding(model, y_lim, lim)



# ---- §4: the terms of the 1/k rate ------------------------------------------------------------


def one_over_k_terms(model, x, k, d):
    """For the logits at p: (R bound, t) with E_k = √n·t/(k‖Pd‖) + R_k (docs/steering.md §4)."""
    n, eps = len(d), model.cfg.eps
    s, s_err = measured_s(x, k, d)
    D = np.linalg.norm(d - d.mean())
    e = (d - d.mean()) / D
    Ps = s - s.mean()
    alpha = abs(float(e @ Ps)) + s_err
    t = Ps - (e @ Ps) * e
    tau = np.linalg.norm(t) + s_err
    beta = k * D - (np.linalg.norm(Ps) + s_err)
    assert beta > 0
    q = (tau**2 + n * eps) / (2 * beta**2)
    R = np.sqrt(n) * (q + tau * (alpha + (tau**2 + n * eps) / (2 * beta)) / (beta * k * D))
    return R, t, s_err


# ---- §5: the propagated bound -------------------------------------------------------------------


def propagated_bound(model, tokens, layer, position, d, k, S, Y, bi):
    """docs/steering.md §5: a bound on ‖logits_S[q] − logits_Y[q]‖ for every q > p, propagated
    block by block from the §5 LayerNorm error at p through Lipschitz bounds of each step, with
    the limit run's own activations (scales, q/k/v norms) and rounding allowances."""
    cfg, p = model.cfg, model.params
    n_pos, eps, n = tokens.shape[1], cfg.eps, cfg.d_model
    g = gamma(chain_length(model, n_pos))
    e = np.zeros(n_pos)  # stream error per position, entering block `layer`: 0 everywhere
    later = np.arange(n_pos) > position
    for M in range(layer, cfg.n_layers):
        b = f"blocks.{M}."
        w1, b1, w2, b2 = p[b + "ln1.w"], p[b + "ln1.b"], p[b + "ln2.w"], p[b + "ln2.b"]
        r1 = np.array([ln_rounding(S[b + "hook_resid_pre"][bi, j], w1, b1, eps) + ln_rounding(Y[b + "hook_resid_pre"][bi, j], w1, b1, eps)
              for j in range(n_pos)])
        l1 = np.where(later, 2 * np.max(np.abs(w1)) * e / Y[b + "ln1.hook_scale"][bi, :, 0] * (1 + g) + r1, 0.0)  # [pos]
        l1[position] = ln_limit_error_bound(S[b + "hook_resid_pre"][bi, position], k, d, w1, b1, eps)
        d_attn = np.zeros(n_pos)
        for h in range(cfg.n_heads):
            dq, dk, dv = (op(p[b + f"attn.W_{x}"][h]) * l1 for x in "QKV")  # [pos] each
            qn, kn, vn = (np.linalg.norm(Y[b + f"attn.hook_{x}"][bi, :, h], axis=-1) * (1 + g) for x in "qkv")  # [pos]
            ds = cfg.score_scale(M) * (dq[:, None] * kn[None, :] + qn[:, None] * dk[None, :] + dq[:, None] * dk[None, :])  # [query, key]
            ds = np.where(np.tril(np.ones((n_pos, n_pos), bool)), ds, 0.0)  # [query, key] causal
            d_pattern = np.minimum(2.0, 2 * ds.max(axis=1))  # [query] ‖Δπ‖₁ ≤ 2‖Δscores‖_∞
            dz = np.maximum.accumulate(dv) + d_pattern * np.maximum.accumulate(vn)  # [query]
            d_attn += op(p[b + "attn.W_O"][h]) * dz
        attn_round = 2 * g * attn_bound(model, M, ln_bound(w1, b1) + max(r1), fro)
        e = np.where(later, e + d_attn + attn_round, 0.0)  # stream error at resid_mid
        r2 = np.array([ln_rounding(S[b + "hook_resid_mid"][bi, j], w2, b2, eps) + ln_rounding(Y[b + "hook_resid_mid"][bi, j], w2, b2, eps)
              for j in range(n_pos)])
        l2 = 2 * np.max(np.abs(w2)) * e / Y[b + "ln2.hook_scale"][bi, :, 0] * (1 + g) + r2  # [pos]
        d_mlp = op(p[b + "mlp.W_out"]) * ACT_LIPSCHITZ[cfg.act_fn] * op(p[b + "mlp.W_in"]) * l2
        mlp_round = 2 * g * mlp_bound(model, M, ln_bound(w2, b2) + max(r2), fro)
        e = np.where(later, e + d_mlp + mlp_round, 0.0)  # stream error at resid_post
    last = f"blocks.{cfg.n_layers - 1}.hook_resid_post"
    wf, bf = p["ln_final.w"], p["ln_final.b"]
    rf = np.array([ln_rounding(S[last][bi, j], wf, bf, eps) + ln_rounding(Y[last][bi, j], wf, bf, eps) for j in range(n_pos)])
    d_ln = 2 * np.max(np.abs(wf)) * e / Y["ln_final.hook_scale"][bi, :, 0] * (1 + g) + rf
    y_size = ln_bound(wf, bf) + rf
    return op(p["unembed.W_U"]) * d_ln + 2 * gamma(n) * fro(p["unembed.W_U"]) * y_size  # [pos]
