"""Non-finite guards: a forward pass that turns finite input into NaN/±∞ raises at the first hook
point where it appeared; non-finite or out-of-range arguments are refused up front; bad types are
RefGPTTypeErrors (RefGPTError and TypeError)."""

from __future__ import annotations

import numpy as np
import pytest

import refgpt
from random_models import random_model
from refgpt import Config, RefGPTError
from refgpt.analysis.interventions import add_vector
from refgpt.errors import RefGPTTypeError, real_number
from refgpt.gpt2.tokenizer import Tokenizer, bytes_to_unicode

CFG = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=257, n_ctx=6)

# The poisoned forward passes warn on their way to the error; the error is what is tested.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
TOKENS = np.array([1, 2, 3, 4])


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, seed=4)


@pytest.mark.parametrize("hook,value", [
    ("blocks.1.hook_resid_mid", np.inf), ("blocks.0.mlp.hook_post", np.nan), ("blocks.0.attn.hook_v", -np.inf),
])
def test_a_non_finite_activation_is_named_at_its_first_hook_point(model, hook, value):
    def poison(a, name):
        a = a.copy()
        a[..., 0] = value
        return a

    with pytest.raises(RefGPTError, match=rf"produced (nan|inf|-inf) at {hook} \(index \[0, 0"):
        model.run_with_hooks(TOKENS, fwd_hooks=[(hook, poison)])


def test_the_first_non_finite_value_is_the_one_named(model):
    def poison(a, name):
        a = a.copy()
        a[0, 1, 2], a[0, 3, 0] = -np.inf, np.nan  # the first, in C order, is -inf at [0, 1, 2]
        return a

    with pytest.raises(RefGPTError, match=r"produced -inf at blocks.0.hook_resid_mid \(index \[0, 1, 2\]\)"):
        model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.hook_resid_mid", poison)])


def test_an_overflow_is_named_where_it_happens(model):
    with np.errstate(over="ignore"):
        with pytest.raises(RefGPTError, match="produced -?inf at blocks.0.hook_attn_out"):
            model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.hook_attn_out", lambda a, n: a * 1e308 * 1e10)])


def test_an_overflow_in_the_attention_scores_is_named_at_the_scores(model):
    """Finite q and k whose product overflows: the guard's re-run watches every point, so attention
    makes its full scores and the error names hook_attn_scores, not the NaN it becomes at hook_z."""
    params = dict(model.params)
    params["blocks.0.attn.W_Q"] = params["blocks.0.attn.W_Q"] * 1e160  # q ~ 1e160: finite
    params["blocks.0.attn.W_K"] = params["blocks.0.attn.W_K"] * 1e160  # q·kᵀ ~ 1e320: inf
    big = refgpt.Model(model.cfg, params)
    with np.errstate(over="ignore", invalid="ignore"):
        with pytest.raises(RefGPTError, match=r"produced -?inf at blocks\.0\.attn\.hook_attn_scores"):
            big(TOKENS)


def test_the_guard_works_with_a_kv_cache_and_leaves_it_consistent(model):
    past = model.kv_cache()
    model(TOKENS[:2], past=past)
    with pytest.raises(RefGPTError, match="at blocks.1.hook_resid_post"):
        model.run_with_hooks(TOKENS[2:], fwd_hooks=[("blocks.1.hook_resid_post", lambda a, n: a + np.inf)], past=past)
    # The guard's second pass rewrote the failed call's positions (the cache rewound first) and
    # stopped before advancing: the cache holds the first two tokens only, as if the call never happened.
    assert past.length == 2
    fresh = model.kv_cache()
    model(TOKENS[:2], past=fresh)
    assert np.array_equal(model(TOKENS[2:], past=past), model(TOKENS[2:], past=fresh))


def _inf_at_resid_mid(a, name):
    return a + np.inf


def test_a_pass_from_start_at_layer_is_guarded_too(model):
    """start_at_layer: the same guard, the re-run from the same stream and layer; a non-finite
    stream given as input is refused up front, naming where."""
    _, cache = model.run_with_cache(TOKENS[None])
    stream = cache["blocks.1.hook_resid_pre"]  # [1, pos, d_model]
    assert np.array_equal(model(stream, start_at_layer=1), model(TOKENS[None]))
    with pytest.raises(RefGPTError, match="at blocks.1.hook_resid_mid"):
        model.run_with_hooks(stream, start_at_layer=1, fwd_hooks=[("blocks.1.hook_resid_mid", _inf_at_resid_mid)])
    bad = stream.copy()
    bad[0, 2, 3] = np.nan
    with pytest.raises(RefGPTError, match=r"start_at_layer: the residual stream given holds nan at index \[0, 2, 3\]"):
        model(bad, start_at_layer=1)


def test_a_pass_to_stop_at_layer_is_guarded_too(model):
    """stop_at_layer: the stream it returns is checked like the logits; the re-run names the point."""
    stream = model(TOKENS, stop_at_layer=2)
    assert np.isfinite(stream).all()
    with pytest.raises(RefGPTError, match="at blocks.1.hook_resid_mid"):
        model.run_with_hooks(TOKENS, stop_at_layer=2, fwd_hooks=[("blocks.1.hook_resid_mid", _inf_at_resid_mid)])
    huge = dict(model.params)
    huge["embed.W_E"] = np.full_like(huge["embed.W_E"], 1e308)
    huge["pos_embed.W_pos"] = np.full_like(huge["pos_embed.W_pos"], 1e308)  # W_E[t] + W_pos[p] = inf: the embedding overflows
    with np.errstate(over="ignore"):
        with pytest.raises(RefGPTError, match=r"produced inf in the stream entering block 0 .*the embedding overflowed"):
            refgpt.Model(model.cfg, huge)(TOKENS, stop_at_layer=0)


def test_masked_attention_scores_are_not_a_non_finite_value(model):
    logits, cache = model.run_with_cache(TOKENS)
    assert np.isneginf(cache["blocks.0.attn.hook_attn_scores"]).any() and np.isfinite(logits).all()


def test_huge_but_finite_sums_do_not_raise(model):
    """The cheap check sums the logits; an overflowing sum of finite logits is re-checked, not refused."""
    big = model.run_with_hooks(TOKENS, fwd_hooks=[("ln_final.hook_normalized", lambda a, n: a * 1e150)])
    assert np.isfinite(big).all() and not np.isfinite(np.sum(big * 1e160))


@pytest.mark.parametrize("kwargs,match", [
    ({"temperature": float("inf")}, "temperature must be a finite number"),
    ({"temperature": float("nan")}, "temperature must be a finite number"),
    ({"temperature": -1.0}, "temperature must be ≥ 0"),
    ({"temperature": 1e-320}, "temperature 1e-320 is so small"),
    ({"temperature": "1"}, "temperature must be a number"),
    ({"top_k": True}, "top_k must be a whole number ≥ 1"),
    ({"top_k": 2.0}, "top_k must be a whole number ≥ 1"),
    ({"seed": -1}, "seed must be a whole number ≥ 0"),
    ({"seed": 1.5}, "seed must be a whole number ≥ 0"),
])
def test_generate_refuses_bad_arguments_up_front(model, kwargs, match):
    with pytest.raises(RefGPTError, match=match):
        model.generate(TOKENS[:2], 2, stop_at_eos=False, verbose=False, **kwargs)


@pytest.mark.parametrize("coeff,match", [
    (float("nan"), "coefficient must be a finite number"), (float("inf"), "coefficient must be a finite number"),
    (1e308, "overflows float64"), (True, "coefficient must be a finite number"),
])
def test_add_vector_refuses_non_finite_coefficients(model, coeff, match):
    with pytest.raises(RefGPTError, match=match):
        add_vector(model, TOKENS, np.full(CFG.d_model, 10.0), 0, coeff=coeff)


def test_real_number():
    assert real_number(3, "x", least=0) == 3.0
    with pytest.raises(RefGPTTypeError):
        real_number(None, "x")
    assert issubclass(RefGPTTypeError, TypeError) and issubclass(RefGPTTypeError, RefGPTError)


def test_token_ids_must_be_integers(model):
    symbols = [bytes_to_unicode()[b] for b in range(256)]  # id = byte: "a" is 97
    tok = Tokenizer({**{c: i for i, c in enumerate(symbols)}, "ab": 256}, [("a", "b")])
    with pytest.raises(RefGPTTypeError, match="token id True at position 0 is not an integer"):
        tok.decode([True])
    with pytest.raises(RefGPTTypeError, match="305.7"):
        tok.decode([1, 305.7])
    with pytest.raises(RefGPTTypeError):
        tok.decode("ab")
    with pytest.raises(RefGPTTypeError):
        tok.decode(5)
    model.tokenizer = tok
    with pytest.raises(RefGPTTypeError, match="to_string: token ids must be integers, found dtype float64"):
        model.to_string([305.7])
    with pytest.raises(RefGPTTypeError, match="dtype bool"):
        model.to_string([True])
    assert model.to_string(np.array([97, 98])) == "ab"


# ---- Python-API misuse: RefGPTError (RefGPTTypeError for a wrong type), never a raw exception -----


def _misuses(model):
    from refgpt import Model, load, save
    from refgpt.oracle import comparison, golden

    T, Z = np.array([1, 2, 3]), {"logits": np.zeros((1, 2, 3))}
    return {
        "load(123)": lambda: load(123), "Model(cfg, None)": lambda: Model(CFG, None),
        "Model(None, {})": lambda: Model(None, {}), "model(ragged)": lambda: model([[1, 2], [3]]),
        "model([2**70])": lambda: model([2**70]), "names=5": lambda: model.run_with_cache(T, names=5),
        "fwd_hooks=5": lambda: model.run_with_hooks(T, fwd_hooks=5),
        "Config.from_json(5)": lambda: Config.from_json(5), "compare(5, 6)": lambda: comparison.compare(5, 6),
        "compare(strings)": lambda: comparison.compare({"logits": "x"}, {"logits": "y"}),
        "compare(atol='x')": lambda: comparison.compare(Z, Z, atol="x"),
        "golden.make(names=5)": lambda: golden.make(model, T, names=5), "golden.read(5)": lambda: golden.read(5),
        "cache[5]": lambda: model.run_with_cache(T)[1][5], "kv_cache('a')": lambda: model.kv_cache("a"),
        "save(model, 5)": lambda: save(model, 5),
    }


def test_python_api_misuse_is_a_refgpt_error(model):
    for name, misuse in _misuses(model).items():
        with pytest.raises(RefGPTError) as info:
            misuse()
        assert "\n" not in str(info.value), name


def test_finite_logits_whose_sum_overflows_are_returned():
    """Finite float32 logits of 3e38 overflow any sum of two: the guard looks at the block's
    elements, so the pass returns them (no locating pass, which would find nothing and raise)."""
    from refgpt import non_finite

    big = np.full((2, 5, 7), 3e38, np.float32)  # [batch, pos, d_vocab]
    assert non_finite.output_is_finite(big)
    big[1, 4, 6] = np.inf
    assert not non_finite.output_is_finite(big)
    big[1, 4, 6] = np.nan
    assert not non_finite.output_is_finite(big)
