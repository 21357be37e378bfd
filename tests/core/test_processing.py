"""Weight processing (refgpt/tl/processing.py): each step's invariant, as a property test.

Derivations: docs/decomposition.md §3 (cited per test). Random models with non-trivial biases and
LayerNorm parameters; the invariants hold to ≤ 1e-12 relative in float64, refgpt's float64 contract.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from random_models import model_and_tokens, random_model, rel_err, save_checkpoint
import refgpt
from refgpt import Config, Model, RefGPTError
from refgpt.tl.processing import STEPS, TL_DEFAULTS, process, process_params

TOL = 1e-12


def log_softmax(x):
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def with_b_U(model, seed):
    """The same model with a random unembedding bias b_U (GPT-2 has none; processing creates one)."""
    b_U = np.random.default_rng(seed).standard_normal(model.cfg.d_vocab)
    return Model(model.cfg, {**model.params, "unembed.b_U": b_U})


def rounding_sensitivity(model, tokens, delta=2.0**-40) -> float:
    """The logits' relative change (rel_err) per unit of a relative nudge of every activation: every
    float hook point's value times (1 + δ·r), r ~ U[−1, 1], divided by δ — to first order what one
    more rounding of relative size u everywhere moves them by, over u. δ = 2⁻⁴⁰: far above float64's
    own rounding, small enough to stay linear."""
    rng = np.random.default_rng(0)

    def nudge(a, hook):
        return a * (1.0 + delta * rng.uniform(-1.0, 1.0, a.shape)) if a.dtype.kind == "f" else None

    moved = model.run_with_hooks(tokens, fwd_hooks=[(lambda name: True, nudge)])
    return rel_err(moved, model(tokens)) / delta


def ln_outputs(cache, cfg):
    """Every LayerNorm's output w ⊙ x̂ + b, by name."""
    p = cache.model.params
    names = [f"blocks.{L}.{ln}" for L in range(cfg.n_layers) for ln in ("ln1", "ln2")] + ["ln_final"]
    return {n: cache[n + ".hook_normalized"] * p[n + ".w"] + p[n + ".b"] for n in names}


models = st.tuples(model_and_tokens(), st.booleans(), st.integers(0, 2**32 - 1))


def draw(models_draw):
    (model, tokens), bias, seed = models_draw
    return (with_b_U(model, seed) if bias else model), tokens


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(models)
def test_fold_ln_leaves_logits_unchanged(drawn):
    """§3 fold_ln: (w ⊙ x̂ + b)·W + c = x̂·(diag(w)·W) + (b·W + c); logits unchanged, every LN left w = 1, b = 0."""
    model, tokens = draw(drawn)
    folded = process(model, ["fold_ln"])
    assert rel_err(folded(tokens), model(tokens)) <= TOL
    for name, value in folded.params.items():
        if name.endswith((".ln1.w", ".ln2.w", "ln_final.w")):
            assert np.all(value == 1), name
        if name.endswith((".ln1.b", ".ln2.b", "ln_final.b")):
            assert np.all(value == 0), name
    assert "unembed.b_U" in folded.params  # ln_final.b·W_U lives here now


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(models)
def test_center_writing_weights_moves_the_stream_along_ones_only(drawn):
    """§3 center_writing_weights: logits and every LN output unchanged; each residual value moves
    by a per-position multiple of the ones vector (it becomes exactly its own centred part)."""
    model, tokens = draw(drawn)
    centred = process(model, ["center_writing_weights"])
    logits, cache = model.run_with_cache(tokens)
    new_logits, new_cache = centred.run_with_cache(tokens)
    assert rel_err(new_logits, logits) <= TOL
    old_ln, new_ln = ln_outputs(cache, model.cfg), ln_outputs(new_cache, model.cfg)
    for name in old_ln:
        assert rel_err(new_ln[name], old_ln[name]) <= TOL, name
    for name in cache:
        if name.endswith(("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out",
                          "hook_mlp_out", "hook_embed", "hook_pos_embed")):
            moved = new_cache[name] - cache[name]  # [batch, pos, d_model]
            along_ones = moved.mean(-1, keepdims=True)  # [batch, pos, 1]
            assert rel_err(moved, np.broadcast_to(along_ones, moved.shape)) <= TOL, name
            assert rel_err(new_cache[name], cache[name] - cache[name].mean(-1, keepdims=True)) <= TOL, name


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(models)
def test_center_unembed_shifts_logits_by_a_constant_per_position(drawn):
    """§3 center_unembed: log-probabilities unchanged; logits move by −mean over the vocabulary."""
    model, tokens = draw(drawn)
    logits = model(tokens)
    new_logits = process(model, ["center_unembed"])(tokens)
    assert rel_err(log_softmax(new_logits), log_softmax(logits)) <= TOL
    assert rel_err(new_logits, logits - logits.mean(-1, keepdims=True)) <= TOL


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(models)
def test_fold_value_biases_leaves_logits_unchanged(drawn):
    """§3 fold_value_biases: A·(x·W_V + 1·b_V) = A·x·W_V + 1·b_V (pattern rows sum to 1)."""
    model, tokens = draw(drawn)
    folded = process(model, ["fold_value_biases"])
    assert rel_err(folded(tokens), model(tokens)) <= TOL
    assert all(np.all(folded.params[f"blocks.{L}.attn.b_V"] == 0) for L in range(model.cfg.n_layers))


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(models)
def test_refactor_factored_attn_matrices_keeps_the_circuits(drawn):
    """§3 refactor: [W_Q; b_Q]·[W_K; b_K]ᵀ and W_V·W_O unchanged per head (so are the logits);
    the new W_O has orthonormal rows."""
    model, tokens = draw(drawn)
    new = process(model, ["refactor_factored_attn_matrices"])
    circuits = 0.0  # the largest relative change of a QK or OV circuit
    for L in range(model.cfg.n_layers):
        def qk(m):
            p, b = m.params, f"blocks.{L}.attn."
            W_Q = np.concatenate([p[b + "W_Q"], p[b + "b_Q"][:, None]], 1)  # [head, d_model+1, d_head]
            W_K = np.concatenate([p[b + "W_K"], p[b + "b_K"][:, None]], 1)  # [head, d_model+1, d_head]
            return W_Q @ W_K.transpose(0, 2, 1)  # [head, d_model+1, d_model+1]

        def ov(m):
            return m.params[f"blocks.{L}.attn.W_V"] @ m.params[f"blocks.{L}.attn.W_O"]  # [head, d_model, d_model]

        assert rel_err(qk(new), qk(model)) <= TOL
        assert rel_err(ov(new), ov(model)) <= TOL
        circuits = max(circuits, rel_err(qk(new), qk(model)), rel_err(ov(new), ov(model)))
        W_O = new.params[f"blocks.{L}.attn.W_O"]  # [head, d_head, d_model]
        gram = W_O @ W_O.transpose(0, 2, 1)  # [head, d_head, d_head]
        assert rel_err(gram, np.broadcast_to(np.eye(gram.shape[-1]), gram.shape)) <= TOL
    # The logits: the same circuits, rounded through other factors. Each activation then differs by
    # a few roundings plus the circuits' change, and the logits by the model's own amplification of
    # that: bounded by 64 × (its measured sensitivity to one relative nudge of every activation) ×
    # (u + the circuits' change). A fixed 1e-12 was a chosen number: hypothesis found a 3-layer tanh
    # model at 1.1e-12 (5,000 draws: median 1e-15, max 8.9e-13).
    bound = 64 * rounding_sensitivity(model, tokens) * (2.0**-53 + circuits)
    assert rel_err(new(tokens), model(tokens)) <= bound


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(models, st.sets(st.sampled_from(STEPS)))
def test_any_combination_of_steps_keeps_log_probs(drawn, steps):
    """§3: every step keeps log-probabilities, so any combination does (in TransformerLens's order)."""
    model, tokens = draw(drawn)
    logits = model(tokens)
    assert rel_err(log_softmax(process(model, steps)(tokens)), log_softmax(logits)) <= TOL


def test_processing_is_pure_and_the_default_changes_nothing(tmp_path):
    """process() returns a new model and leaves its input alone; load() processes nothing by default."""
    cfg = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6, tie_word_embeddings=False)
    model = random_model(cfg, seed=3)
    before = {k: v.copy() for k, v in model.params.items()}
    processed = process(model, True)
    assert processed is not model
    assert all(np.array_equal(model.params[k], v) for k, v in before.items())
    assert process_params(model.params, cfg, None).keys() == model.params.keys()
    assert all(np.array_equal(process(model, []).params[k], v) for k, v in before.items())
    directory = save_checkpoint(model, tmp_path / "m", dtype=np.float64)
    plain, explicit = refgpt.load(directory), refgpt.load(directory, process=None)
    assert plain.params.keys() == explicit.params.keys() == model.params.keys()
    assert all(np.array_equal(plain.params[k], model.params[k]) for k in model.params)
    assert all(np.array_equal(explicit.params[k], model.params[k]) for k in model.params)
    loaded = refgpt.load(directory, process=True)
    assert all(np.array_equal(loaded.params[k], v) for k, v in process(plain, TL_DEFAULTS).params.items())


def test_processing_keeps_float32(tmp_path):
    cfg = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)
    model = random_model(cfg, seed=4, dtype="float32")
    processed = process(model, STEPS)
    assert processed.dtype == np.float32 and all(v.dtype == np.float32 for v in processed.params.values())


@pytest.mark.parametrize("bad", ["fold", ["fold_ln", "nope"], 5])
def test_unknown_processing_steps_are_refused(bad):
    cfg = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=12, d_vocab=11, n_ctx=6)
    with pytest.raises(RefGPTError, match="process"):
        process(random_model(cfg), bad)
