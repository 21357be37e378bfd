"""The two LayerNorm views (refgpt/gpt2/ln_views.py), where they agree, where they differ, and when
each is right. Derivations: docs/decomposition.md §4.

cached_scale(c, σ) = P·c/σ with σ the scale the model really used: linear, for attribution.
recomputed(c) = LN(c) with c's own statistics: the logit lens, "what if the stream were c".
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from random_models import model_and_tokens, rel_err
from refgpt.gpt2 import ln_views
from refgpt.gpt2.layernorm import scale as ln_scale

TOL = 1e-12


def final_ln(model):
    p = model.params
    return p["ln_final.w"], p["ln_final.b"], model.cfg.eps


@settings(max_examples=40, deadline=None)
@given(model_and_tokens(), st.floats(-3, 3))
def test_cached_scale_view_is_linear_and_sums_to_the_normalised_stream(model_tokens, k):
    """§4: Σ_i cached_scale(c_i, σ_final) = x̂, ln_final's normalised stream; and the view is linear."""
    model, tokens = model_tokens
    _, cache = model.run_with_cache(tokens)
    pieces = cache.decompose_resid()  # [component, batch, pos, d_model]
    sigma = cache["ln_final.hook_scale"]  # [batch, pos, 1]
    assert rel_err(ln_views.cached_scale(pieces, sigma).sum(0), cache["ln_final.hook_normalized"]) <= TOL
    a, b = pieces[0], pieces[-1]
    assert rel_err(ln_views.cached_scale(a + k * b, sigma),
                   ln_views.cached_scale(a, sigma) + k * ln_views.cached_scale(b, sigma)) <= TOL


@settings(max_examples=40, deadline=None)
@given(model_and_tokens())
def test_recomputed_view_of_the_final_stream_is_the_model(model_tokens):
    """§4: recomputed(final stream)·W_U + b_U = the logits; so the lens's last row is the model."""
    model, tokens = model_tokens
    logits, cache = model.run_with_cache(tokens)
    w, b, eps = final_ln(model)
    final = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    assert rel_err(ln_views.recomputed(final, w, b, eps), cache["ln_final.hook_normalized"] * w + b) <= TOL
    lens = cache.accumulated_resid(apply_ln=True)  # recomputed at the unembedding: [layer+1, batch, pos, d_model]
    assert rel_err(lens[-1] @ model.params["unembed.W_U"], logits) <= TOL


@settings(max_examples=40, deadline=None)
@given(model_and_tokens())
def test_the_views_agree_on_the_whole_stream_and_nowhere_else(model_tokens):
    """§4: recomputed(r) = w ⊙ cached_scale(r, σ(r)) + b for any r. With σ_final in place of σ(r)
    — TransformerLens's logit lens before its fix (#1076) — an earlier stream comes out scaled by
    σ(r)/σ_final: only the final stream, where the ratio is 1, gets the model's own output."""
    model, tokens = model_tokens
    assume(model.cfg.d_model >= 2 and model.cfg.n_layers >= 1)
    _, cache = model.run_with_cache(tokens)
    w, b, eps = final_ln(model)
    sigma_final = cache["ln_final.hook_scale"]  # [batch, pos, 1]
    for r in cache.accumulated_resid():  # every stream [batch, pos, d_model], the final one last
        own = ln_scale(r, eps)  # [batch, pos, 1]
        assert rel_err(ln_views.recomputed(r, w, b, eps), w * ln_views.cached_scale(r, own) + b) <= TOL
        assert rel_err(ln_views.cached_scale(r, sigma_final), own / sigma_final * ln_views.cached_scale(r, own)) <= TOL
    assert rel_err(ln_scale(r, eps), sigma_final) <= TOL  # the final stream: the views agree
    first = cache["blocks.0.hook_resid_pre"]
    ratio = ln_scale(first, eps) / sigma_final
    assume(np.max(np.abs(ratio - 1)) > 1e-6)  # an earlier stream whose size differs from the final one's
    assert rel_err(ln_views.cached_scale(first, sigma_final) * w + b, ln_views.recomputed(first, w, b, eps)) > 1e-6


vectors = st.tuples(st.integers(2, 48), st.integers(0, 2**32 - 1), st.floats(1e-3, 1e3))


@settings(max_examples=100, deadline=None)
@given(vectors, st.sampled_from([1e-5, 1e-3, 0.1]))
def test_recomputed_forgets_scale_cached_keeps_it(n_seed_k, eps):
    """§4: recomputed_ε(k·c) = recomputed_{ε/k²}(c) — the lens does not care how big a stream is —
    while cached_scale(k·c, σ) = k·cached_scale(c, σ): a piece twice as big contributes twice as much."""
    n, seed, k = n_seed_k
    rng = np.random.default_rng(seed)
    c, w, b = rng.standard_normal(n), 1 + 0.3 * rng.standard_normal(n), rng.standard_normal(n)
    sigma = np.array([abs(rng.standard_normal()) + 0.1])
    assert rel_err(ln_views.recomputed(k * c, w, b, eps), ln_views.recomputed(c, w, b, eps / k**2)) <= TOL
    assert rel_err(ln_views.cached_scale(k * c, sigma), k * ln_views.cached_scale(c, sigma)) <= TOL * max(1, k)


@settings(max_examples=40, deadline=None)
@given(model_and_tokens())
def test_recomputed_pieces_do_not_add_up(model_tokens):
    """§4 (docs/layernorm.md §3): Σ_i recomputed(c_i) is not recomputed(Σ_i c_i), by far more
    than rounding; Σ_i cached_scale(c_i) is cached_scale(Σ_i c_i)."""
    model, tokens = model_tokens
    assume(model.cfg.d_model >= 2)
    _, cache = model.run_with_cache(tokens)
    w, b, eps = final_ln(model)
    pieces = cache.decompose_resid()  # [component, batch, pos, d_model]
    whole = pieces.sum(0)
    assert rel_err(ln_views.recomputed(pieces, w, b, eps).sum(0), ln_views.recomputed(whole, w, b, eps)) > 1e6 * TOL
    sigma = cache["ln_final.hook_scale"]
    assert rel_err(ln_views.cached_scale(pieces, sigma).sum(0), ln_views.cached_scale(whole, sigma)) <= TOL
