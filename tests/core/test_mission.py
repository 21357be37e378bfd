"""The two facts at refgpt's heart, as property tests. Derivations: docs/layernorm.md (§ cited).

1. Cached-scale decomposition is exact: hold ln_final's scale fixed from the final stream and the
   components of the residual stream, pushed through LayerNorm and the unembedding one by one,
   plus ln_final's bias once, sum to the logits. Normalising each piece with its own scale does not.
2. LayerNorm forgets scale: LN(k·d + s) → LN₀(d) within a derived bound; LN_ε(kx) = LN_{ε/k²}(x);
   LN(x + t·1) = LN(x); LayerNorm stays finite and right for every x with ‖x‖₁ below the largest
   float, and its overflow-safe σ is bit for bit the textbook one wherever that is finite.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ln_bounds import convergence_bound, ln0, ln_rounding
from random_models import model_and_tokens, rel_err
from refgpt.gpt2.layernorm import centered_scale, layer_norm

# ---- 1. the cached-scale decomposition (docs/layernorm.md §2, §3) ---------------------------


def final_stream_pieces(cache, cfg):
    """The components whose sum is the final residual stream, as [piece, batch, pos, d_model]."""
    names = ["hook_embed", "hook_pos_embed"]
    for L in range(cfg.n_layers):
        names += [f"blocks.{L}.hook_attn_out", f"blocks.{L}.hook_mlp_out"]
    return np.stack([cache[n] for n in names])


def unembed_pieces(model, pieces, scale):
    """(w ⊙ P·c / σ)·W_U for each piece c, with σ the given scale: [piece, batch, pos, d_vocab]."""
    p = model.params
    centered = pieces - pieces.mean(-1, keepdims=True)  # [piece, batch, pos, d_model]
    return (centered / scale * p["ln_final.w"]) @ p["unembed.W_U"]  # [piece, batch, pos, d_vocab]


@settings(max_examples=60, deadline=None)
@given(model_and_tokens())
def test_cached_scale_pieces_sum_to_logits(model_tokens):
    """§2: Σ_i (w ⊙ Pc_i/σ_cached)·W_U + b·W_U = logits, to ≤ 1e-12 relative in float64."""
    model, tokens = model_tokens
    logits, cache = model.run_with_cache(tokens)
    pieces = final_stream_pieces(cache, model.cfg)
    bias = model.params["ln_final.b"] @ model.params["unembed.W_U"]  # [d_vocab], counted once
    total = unembed_pieces(model, pieces, cache["ln_final.hook_scale"]).sum(0) + bias
    assert rel_err(total, logits) <= 1e-12


@settings(max_examples=60, deadline=None)
@given(model_and_tokens())
def test_naive_per_piece_layernorm_is_not_exact(model_tokens):
    """§3: re-normalising each piece with its own scale misses the logits by a visible amount:
    at least a thousandth of the logits' spread (max − min at a position, the scale on which the
    prediction is decided) — never a rounding-size gap. Measured over 1,500 random models the
    smallest miss was 7·10⁻³ of the spread (d_model = 2, where P leaves one dimension); on
    realistic models it is larger than the logits (docs/decomposition.md N9), and on the
    embedded model the naive pieces sum to 17.2 against a logit of 5.40 (§1 there)."""
    model, tokens = model_tokens
    assume(model.cfg.d_model >= 2)  # with one dimension, P = 0 and LayerNorm is the constant b
    logits, cache = model.run_with_cache(tokens)
    pieces = final_stream_pieces(cache, model.cfg)
    own_scale = np.sqrt(pieces.var(-1, keepdims=True) + model.cfg.eps)  # each piece's own σ
    bias = model.params["ln_final.b"] @ model.params["unembed.W_U"]
    naive = unembed_pieces(model, pieces, own_scale).sum(0) + bias
    exact = unembed_pieces(model, pieces, cache["ln_final.hook_scale"]).sum(0) + bias
    spread = np.ptp(logits, axis=-1).max()
    assert np.abs(naive - logits).max() >= 1e-3 * spread
    assert rel_err(exact, logits) <= 1e-12  # while the cached scale is exact (§2)


def test_counterexample_two_pieces_give_twice_the_bias():
    """§3: c₁ = x + y, c₂ = −y with ‖Py‖ ≫ ‖Px‖: LN(c₁) + LN(c₂) ≈ 2b whatever x is."""
    rng = np.random.default_rng(3)
    n, eps = 16, 1e-5
    w, b = 1 + 0.1 * rng.standard_normal(n), rng.standard_normal(n)
    y = 1e8 * rng.standard_normal(n)
    for x in (rng.standard_normal(n), 100 * rng.standard_normal(n)):
        naive = layer_norm(x + y, w, b, eps) + layer_norm(-y, w, b, eps)
        # §5 with d = y, s = x (and with d = −y, s = 0), and LN₀(y) + LN₀(−y) = 2b exactly:
        bound = (convergence_bound(y, x, w, eps) + convergence_bound(-y, 0 * x, w, eps)
                 + ln_rounding(x + y, w, b, eps) + ln_rounding(-y, w, b, eps))
        assert np.linalg.norm(naive - 2 * b) <= bound
        assert np.linalg.norm(layer_norm(x, w, b, eps) - 2 * b) > 1.0  # the truth is nowhere near 2b


# ---- 2. LayerNorm forgets scale (docs/layernorm.md §4, §5, §6) ------------------------------


vectors = st.integers(2, 64).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, 2**32 - 1)))


def draw_ln(n, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(n) * rng.choice([0.1, 1.0, 10.0])
    b = rng.standard_normal(n)
    return rng, w, b


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(vectors, st.floats(1.0, 1e12), st.sampled_from([1e-5, 1e-3, 0.1, 1.0]), st.floats(1e-3, 1e3))
def test_layernorm_converges_within_derived_bound(n_seed, k, eps, s_size):
    """§5: ‖LN_ε(kd + s) − LN₀(d)‖ ≤ ‖w‖_∞√n[2‖Ps‖/(k‖Pd‖) + nε/(2(k‖Pd‖ − ‖Ps‖)²)]."""
    n, seed = n_seed
    rng, w, b = draw_ln(n, seed)
    d = rng.standard_normal(n) + rng.standard_normal()  # a direction with a mean component
    s = s_size * rng.standard_normal(n)
    assume(k * np.linalg.norm(d - d.mean()) > np.linalg.norm(s - s.mean()))
    bound = convergence_bound(d, s, w, eps, k)
    x = k * d + s
    err = np.linalg.norm(layer_norm(x, w, b, eps) - ln0(d, w, b))
    assert err <= bound + ln_rounding(x, w, b, eps) + ln_rounding(d, w, b, 0.0)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(vectors, st.floats(1e-6, 1e12), st.sampled_from([1e-5, 1e-3, 0.1, 1.0]))
def test_layernorm_of_scaled_input_is_layernorm_with_smaller_eps(n_seed, k, eps):
    """§4: LN_ε(k·x) = LN_{ε/k²}(x) for k > 0 (up to the §6 rounding allowance)."""
    n, seed = n_seed
    rng, w, b = draw_ln(n, seed)
    x = rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3])
    err = np.linalg.norm(layer_norm(k * x, w, b, eps) - layer_norm(x, w, b, eps / k**2))
    assert err <= ln_rounding(k * x, w, b, eps) + ln_rounding(x, w, b, eps / k**2)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(vectors, st.floats(-1e6, 1e6), st.sampled_from([1e-5, 1e-3, 0.1]))
def test_layernorm_ignores_constant_shift(n_seed, t, eps):
    """§4: LN(x + t·1) = LN(x), since P·1 = 0 (up to the §6 rounding allowance)."""
    n, seed = n_seed
    rng, w, b = draw_ln(n, seed)
    x = rng.standard_normal(n)
    err = np.linalg.norm(layer_norm(x + t, w, b, eps) - layer_norm(x, w, b, eps))
    assert err <= ln_rounding(x + t, w, b, eps) + ln_rounding(x, w, b, eps)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.integers(1, 800), st.integers(0, 2**32 - 1), st.sampled_from([np.float64, np.float32]),
       st.floats(-60, 160), st.sampled_from([0.0, 1e-5, 1e-3, 0.1]))
def test_scaled_sum_of_squares_is_bit_for_bit_the_textbook_one(n, seed, dtype, exponent, eps):
    """§6: wherever the textbook σ = √(mean(c²) + ε) does not overflow, refgpt's σ (squares of
    c·2⁻ᵉ, scaled back by 2ᵉ) is the same number, bit for bit: scaling by a power of two is exact."""
    rng = np.random.default_rng(seed)
    exponent = exponent if dtype == np.float64 else exponent / 8  # float32 overflows at 3.4e38
    x = (10.0**exponent * rng.standard_normal((3, n)) * rng.choice([1e-3, 1.0, 1e3], (3, n))).astype(dtype)
    centered = x - x.mean(-1, keepdims=True)
    with np.errstate(over="ignore"):
        textbook = np.sqrt(np.mean(centered * centered, axis=-1, keepdims=True) + dtype(eps))  # [3, 1]
    assume(np.all(np.isfinite(textbook)))
    assert np.array_equal(centered_scale(centered, dtype(eps)), textbook)


def l1_edge(d, dtype):
    """The size at which ‖size·d‖₁ = 0.99·(largest finite number): §6's sufficient condition, at its edge."""
    return 0.99 * float(np.finfo(dtype).max) / float(np.abs(d).sum())


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [2, 64, 768])
def test_layernorm_is_finite_and_correct_up_to_the_l1_edge(dtype, n):
    """§6: every x with ‖x‖₁ < max float gives finite stats and LN ≈ LN₀ of its direction: the sum
    the mean takes and every centred value are at most ‖x‖₁. Tried at ‖x‖₁ = 0.99·max (about
    10³⁰⁵ per entry in float64, 10³⁵ in float32, at n = 768)."""
    rng = np.random.default_rng(n)
    w, b = (1 + 0.1 * rng.standard_normal(n)).astype(dtype), rng.standard_normal(n).astype(dtype)
    d = rng.standard_normal(n)
    size = l1_edge(d, dtype)
    x = (size * d).astype(dtype)
    stats = {}
    out = layer_norm(x, w, b, 1e-5, lambda name, a: stats.setdefault(name, a))
    assert out.dtype == dtype and all(a.dtype == dtype for a in stats.values())
    assert np.all(np.isfinite(out)) and np.isfinite(stats["hook_scale"]).all()
    expected_scale = size * np.std(d)
    assert abs(float(stats["hook_scale"][0]) / expected_scale - 1) <= n * np.finfo(dtype).eps
    # ε/k² is far below rounding here, so LN_ε(x) = LN₀(d) up to the §6 allowance in x's precision.
    limit = ln0(d, w.astype(np.float64), b.astype(np.float64))
    u = np.finfo(dtype).eps / 2
    allowance = np.max(np.abs(w)) * np.sqrt(n) * (n + 3) * u * (np.max(np.abs(d)) / np.std(d) + np.sqrt(n)) * 2
    assert np.linalg.norm(out.astype(np.float64) - limit) <= allowance + u * np.linalg.norm(limit)


def test_textbook_sum_of_squares_overflows_float32_from_about_7e17_at_n_768():
    """§6: at n = 768, ‖Px‖² overflows float32 once |xᵢ| ≳ √(max/n) ≈ 6.7·10¹⁷ (every entry that
    size), while refgpt's scaled σ stays finite and equal to |xᵢ|·√(1 + ε/xᵢ²) = |xᵢ| there."""
    n, big = 768, float(np.finfo(np.float32).max)
    edge = np.sqrt(big / n)  # n·edge² = max
    assert f"{edge:.0e}" == "7e+17"
    signs = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)  # [n] centred already: Px = x
    for factor, overflows in ((0.97, False), (1.03, True)):
        x = (factor * edge * signs).astype(np.float32)[None]  # [1, n]
        with np.errstate(over="ignore"):
            textbook = np.sqrt(np.mean(x * x, axis=-1) + np.float32(1e-5))  # [1]
        assert np.isinf(textbook[0]) == overflows, factor
        sigma = centered_scale(x, np.float32(1e-5))  # [1, 1]
        assert np.isfinite(sigma).all() and abs(float(sigma[0, 0]) / (factor * edge) - 1) <= 4 * np.finfo(np.float32).eps
