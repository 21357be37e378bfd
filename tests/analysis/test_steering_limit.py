"""Huge steering vectors, as property tests. Derivations: docs/steering.md (§ cited), built on
docs/layernorm.md §5–§6.

Inject k·d into the stream entering block L at position p. Then, for every config, weights,
tokens, layer, position and direction hypothesis draws:

- positions before p are bit-identical to the clean run (§1);
- every sublayer output, at every position, stays within a bound that does not depend on k (§2);
- each LayerNorm at p, and the logits at p, are within the §5 bound (with ‖Ps‖ measured) of their
  limits; the logits' limit is (w_f ⊙ √n·Pd/‖Pd‖ + b_f)·W_U + b_U (§3);
- the error at p falls like 1/k: err(10k) ≤ 0.1·err(k)·(1 + δ), δ derived and measured (§4);
- positions after p reach the limit model within a propagated bound (§5), and p talks to them
  only through its LayerNorm outputs (bit-identical patching);
- steering invariants: coefficient 0 or plus == minus changes nothing; the BOS row is zero (§6).

Every test runs in float64; tolerances are the derived bounds plus the §6 rounding allowances of
docs/layernorm.md, evaluated at the actual activations.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from random_models import model_and_tokens
from refgpt.analysis.interventions import add_vector, injection_limit, patch, steering_vector
from refgpt.layernorm import layer_norm
from ln_bounds import ln_rounding

U = np.finfo(np.float64).eps / 2  # unit roundoff

# sup |act'(t)| for each activation (docs/steering.md §2): the MLP's Lipschitz constant factor.
ACT_LIPSCHITZ = {"gelu_new": 1.13, "gelu_pytorch_tanh": 1.13, "gelu": 1.13, "gelu_fast": 1.13,
                 "quick_gelu": 1.1, "silu": 1.1, "swish": 1.1, "relu": 1.0, "tanh": 1.0}


def gamma(m):
    return m * U / (1 - m * U)


def op(a):
    return float(np.linalg.norm(a, 2))


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


# ---- strategies --------------------------------------------------------------------------------


@st.composite
def injections(draw, k_range=(1.0, 1e12)):
    """(model, tokens, layer, position, direction d, k): d has a mean component and Pd ≠ 0."""
    model, tokens = draw(model_and_tokens())
    assume(model.cfg.d_model >= 2)  # with one dimension Pd = 0: LayerNorm has no direction
    layer = draw(st.integers(0, model.cfg.n_layers - 1))
    position = draw(st.integers(0, tokens.shape[1] - 1))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    d = draw(st.sampled_from([1e-3, 1.0, 1e3])) * (rng.standard_normal(model.cfg.d_model) + rng.standard_normal())
    k = 10 ** draw(st.floats(np.log10(k_range[0]), np.log10(k_range[1])))
    return model, tokens, layer, position, d, k


def inject(model, tokens, d, layer, position, k, names=None):
    return model.run_with_cache(tokens, names=names, fwd_hooks=add_vector(model, tokens, d, layer, [position], coeff=k))


def scaled_k(model, tokens, layer, position, d, factor):
    """k = factor·B_s/‖Pd‖ with B_s the k-free bound on ‖Ps‖: then k‖Pd‖ ≥ factor·‖Ps‖ by §2."""
    return factor * stream_bound(model, tokens, layer, position) / np.linalg.norm(d - d.mean())


# ---- §1: causality --------------------------------------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(injections(k_range=(1e-3, 1e15)), st.booleans())
def test_positions_before_injection_are_bit_identical(case, negative):
    """§1: every activation at positions < p, and their logits, are unchanged, bit for bit."""
    model, tokens, layer, position, d, k = case
    logits0, clean = model.run_with_cache(tokens)
    logits, steered = inject(model, tokens, d, layer, position, -k if negative else k)
    assert np.array_equal(logits[:, :position], logits0[:, :position])
    for name in model.hook_names:
        axis = 2 if name.endswith(("attn_scores", "pattern")) else 1
        before = (slice(None),) * axis + (slice(0, position),)
        assert np.array_equal(steered[name][before], clean[name][before]), name


# ---- §2: sublayer outputs are bounded whatever k is -------------------------------------------


@settings(max_examples=120, deadline=None)
@given(injections(k_range=(1e-3, 1e15)))
def test_sublayer_outputs_are_bounded_independently_of_k(case):
    """§2: ‖attn_out‖ and ‖mlp_out‖ ≤ bounds from ‖LN(x)‖ ≤ ‖w‖_∞√n + ‖b‖ and operator norms."""
    model, tokens, layer, position, d, k = case
    _, cache = inject(model, tokens, d, layer, position, k)
    for M in range(model.cfg.n_layers):
        attn, mlp = sublayer_bounds(model, M, max_ln_rounding(model, cache, M, "ln1"),
                                    max_ln_rounding(model, cache, M, "ln2"), tokens.shape[1])
        assert np.linalg.norm(cache[f"blocks.{M}.hook_attn_out"], axis=-1).max() <= attn
        assert np.linalg.norm(cache[f"blocks.{M}.hook_mlp_out"], axis=-1).max() <= mlp


# ---- §3: LayerNorms and logits at p reach their limits -------------------------------------


@settings(max_examples=120, deadline=None)
@given(injections(), st.floats(2.0, 1e6), st.booleans())
def test_layernorms_and_logits_at_injected_position_converge_within_bound(case, factor, negative):
    """§3: at p, ln1/ln2 of blocks ≥ L and ln_final are within the §5 bound of LN₀(±d), and the
    logits within ‖W_U‖_op times it of (w_f ⊙ √n·P(±d)/‖Pd‖ + b_f)·W_U + b_U."""
    model, tokens, layer, position, d, _ = case
    k = scaled_k(model, tokens, layer, position, d, factor) * (-1 if negative else 1)
    logits, cache = inject(model, tokens, d, layer, position, k)
    p, eps = model.params, model.cfg.eps
    limit_dir = d if k > 0 else -d
    for bi in range(tokens.shape[0]):
        for M in range(layer, model.cfg.n_layers):
            for which, kind in (("ln1", "pre"), ("ln2", "mid")):
                x = cache[f"blocks.{M}.hook_resid_{kind}"][bi, position]  # [d_model]
                w, b = p[f"blocks.{M}.{which}.w"], p[f"blocks.{M}.{which}.b"]
                err = np.linalg.norm(layer_norm(x, w, b, eps) - layer_norm(limit_dir, w, b, 0.0))
                assert err <= ln_limit_error_bound(x, k, d, w, b, eps), (M, which)
        x = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"][bi, position]
        lim, _ = limit_logits(model, limit_dir)
        assert np.linalg.norm(logits[bi, position] - lim) <= logits_error_bound(model, x, k, d)


# ---- §4: the error falls like 1/k -------------------------------------------------------------


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


@settings(max_examples=120, deadline=None)
@given(injections(), st.floats(10.0, 1e5))
def test_error_at_injected_position_falls_like_one_over_k(case, factor):
    """§4: err(10k) ≤ 0.1·err(k)·(1 + δ), δ from the second-order remainder, the change of s
    between k and 10k, and rounding — every term measured from the two runs."""
    model, tokens, layer, position, d, _ = case
    k = scaled_k(model, tokens, layer, position, d, factor)
    p = model.params
    W, wi, n = op(p["unembed.W_U"]), np.max(np.abs(p["ln_final.w"])), model.cfg.d_model
    D = np.linalg.norm(d - d.mean())
    lim, y_lim = limit_logits(model, d)
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    runs = {}
    for kk in (k, 10 * k):
        logits, cache = inject(model, tokens, d, layer, position, kk, names=[last])
        runs[kk] = logits, cache[last]
    for bi in range(tokens.shape[0]):
        err, rho, R, t, s_err = {}, {}, {}, {}, {}
        for kk, (logits, final) in runs.items():
            x = final[bi, position]
            y = layer_norm(x, p["ln_final.w"], p["ln_final.b"], model.cfg.eps)
            err[kk] = np.linalg.norm(logits[bi, position] - lim)
            rho[kk] = (W * (ln_rounding(x, p["ln_final.w"], p["ln_final.b"], model.cfg.eps)
                            + ln_rounding(d, p["ln_final.w"], p["ln_final.b"], 0.0))
                       + unembed_rounding(model, y, logits[bi, position]) + unembed_rounding(model, y_lim, lim))
            R[kk], t[kk], s_err[kk] = one_over_k_terms(model, x, kk, d)
        J_dt = np.linalg.norm(np.sqrt(n) * (p["ln_final.w"] * (t[10 * k] - t[k])) @ p["unembed.W_U"] / D)
        J_dt += np.sqrt(n) * wi * W / D * (s_err[k] + s_err[10 * k]) + gamma(2 * n) * np.sqrt(n) * wi * fro(p["unembed.W_U"]) / D * np.linalg.norm(t[10 * k] - t[k])
        slack = rho[k] + 10 * rho[10 * k] + W * wi * (R[k] + 10 * R[10 * k]) + J_dt / k
        assert err[10 * k] <= 0.1 * (err[k] + slack)


# ---- §5: positions after p reach the limit model ------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(injections(k_range=(1e-3, 1e15)))
def test_injected_position_reaches_later_positions_only_through_its_layernorms(case):
    """§5: patch p's normalized LayerNorm values (blocks ≥ L and ln_final) from the steered run into
    the clean run: every logit equals the steered run's, bit for bit."""
    model, tokens, layer, position, d, k = case
    logits, steered = inject(model, tokens, d, layer, position, k)
    names = [f"blocks.{M}.ln{i}.hook_normalized" for M in range(layer, model.cfg.n_layers) for i in (1, 2)]
    names.append("ln_final.hook_normalized")
    hybrid = model.run_with_hooks(tokens, fwd_hooks=patch(model, tokens, steered, names, [position]))
    assert np.array_equal(hybrid, logits)


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
            ds = cfg.attn_scale(M) * (dq[:, None] * kn[None, :] + qn[:, None] * dk[None, :] + dq[:, None] * dk[None, :])  # [query, key]
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


@settings(max_examples=100, deadline=None)
@given(injections(), st.floats(2.0, 1e6))
def test_later_positions_converge_to_the_limit_model_within_propagated_bound(case, factor):
    """§5: logits at q > p differ from the limit model's (p's LayerNorm outputs in blocks ≥ L
    replaced by their limit) by at most a bound linear in the §5 LayerNorm errors at p: O(1/k)."""
    model, tokens, layer, position, d, _ = case
    assume(position < tokens.shape[1] - 1)
    k = scaled_k(model, tokens, layer, position, d, factor)
    logits_s, S = inject(model, tokens, d, layer, position, k)
    logits_y, Y = model.run_with_cache(tokens, fwd_hooks=injection_limit(model, d, layer, position))
    for bi in range(tokens.shape[0]):
        bound = propagated_bound(model, tokens, layer, position, d, k, S, Y, bi)  # [pos]
        err = np.linalg.norm(logits_s[bi] - logits_y[bi], axis=-1)  # [pos]
        rounding = U * (np.linalg.norm(logits_s[bi], axis=-1) + np.linalg.norm(logits_y[bi], axis=-1))
        assert np.all(err[position + 1:] <= bound[position + 1:] + rounding[position + 1:])


# ---- §6: steering invariants --------------------------------------------------------------------


@st.composite
def steering_cases(draw):
    model, tokens = draw(model_and_tokens(batch=1))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bos = draw(st.integers(0, model.cfg.d_vocab - 1))
    n = tokens.shape[1]  # prompts no longer than the tokens the vector is applied to
    plus, minus = (np.concatenate([[bos], rng.integers(0, model.cfg.d_vocab, draw(st.integers(0, n - 1)))]) for _ in range(2))
    layer = draw(st.integers(-model.cfg.n_layers, model.cfg.n_layers - 1))
    return model, tokens, plus, minus, layer, draw(st.floats(-1e6, 1e6))


@settings(max_examples=120, deadline=None)
@given(steering_cases())
def test_zero_coefficient_or_equal_prompts_change_nothing(case):
    """§6: coeff 0, or plus == minus, gives a zero steering vector and the clean logits exactly."""
    model, tokens, plus, minus, layer, coeff = case
    pad = 0
    clean = model(tokens)
    for sv in (steering_vector(model, plus, minus, layer, 0.0, pad_token=pad),
               steering_vector(model, plus, plus, layer, coeff, pad_token=pad)):
        assert not np.any(sv.vector)
        assert np.array_equal(model.run_with_hooks(tokens, fwd_hooks=sv), clean)


@settings(max_examples=120, deadline=None)
@given(steering_cases())
def test_steering_vector_is_zero_at_a_shared_first_token(case):
    """§6: when both prompts start with the same token (BOS), the vector's first row is exactly 0
    (position 0 attends only to itself) and its other rows are c·(difference)."""
    model, tokens, plus, minus, layer, coeff = case
    sv = steering_vector(model, plus, minus, layer, coeff, pad_token=0)
    assert not np.any(sv.vector[0])
    assert sv.plus_tokens[0] == sv.minus_tokens[0] and len(sv.plus_tokens) == len(sv.minus_tokens) == len(sv.vector)
