"""Fuzzing the Python API with values at the edges (issue 24): token ids, layers, positions and
counts drawn as every integer type at its limits, floats, bools and non-numbers
(tests/fuzzing.py ``edge_numbers``, ``edge_integer_arrays``), and hooks that return anything a
function can return — ndarray subclasses (masked arrays, matrices, memmaps, records), other
dtypes and shapes, lists, scalars, views. Whatever is drawn: an answer, or a one-line RefGPTError.
An answer is checked too: an accepted id, layer or position is the one given, never a truncated
or wrapped one, and an accepted hook return is exactly what flowed on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import edge_integer_arrays, edge_numbers, fuzz_settings, refused_cleanly
from random_models import random_params
from refgpt import Config, Model, RefGPTError, act_name
from refgpt.analysis import interventions, measurements
from refgpt.gpt2.tokenizer import Tokenizer, bytes_to_unicode

CFG = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=16, d_vocab=259, n_ctx=6)
TOKENS = np.array([[1, 2, 3, 4]])
OUTCOMES: dict[str, dict[str, int]] = {}
pytestmark = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix, drawn on purpose


def count(what, outcome):
    OUTCOMES.setdefault(what, {}).setdefault(outcome, 0)
    OUTCOMES[what][outcome] += 1


class _Shared:
    def __repr__(self):
        return "shared"


@pytest.fixture(scope="module")
def shared():
    symbols = [bytes_to_unicode()[b] for b in range(256)]
    model = Model(CFG, random_params(CFG, 7))
    model.tokenizer = Tokenizer({**{c: i for i, c in enumerate(symbols)}, "ab": 256, "cd": 257,
                                 "<|endoftext|>": 258}, [("a", "b"), ("c", "d")])
    shared = _Shared()
    shared.model = model
    shared.logits, shared.cache = model.run_with_cache(TOKENS)
    return shared


def as_int(value):
    """The integer ``value`` means, as a reader that accepted it must have read it."""
    return int(np.asarray(value).item()) if np.ndim(value) == 0 else None


API = ["tokens", "decode", "cache_key", "act_name", "add_vector", "patch", "injection_ratio", "injection_limit",
       "pad_token", "generate", "to_single_token_id"]


@pytest.mark.slow
@fuzz_settings(80)
@given(data=st.data())
def test_the_api_takes_any_number_or_refuses_it_in_one_line(shared, data):
    which = data.draw(st.sampled_from(API))
    model, cache = shared.model, shared.cache
    n = data.draw(edge_numbers())

    def run():
        if which == "tokens":
            ids = data.draw(edge_integer_arrays().filter(lambda ids: not isinstance(ids, str)))  # a str is text
            logits = model(ids)
            array = np.asarray(ids)
            assert array.dtype.kind in "iu" and array.min() >= 0 and array.max() < CFG.d_vocab
            assert np.array_equal(logits.reshape(-1, CFG.d_vocab)[-1], model(array.astype(np.int64)).reshape(-1, CFG.d_vocab)[-1])
        elif which == "decode":
            ids = data.draw(edge_integer_arrays())
            text = model.tokenizer.decode_bytes(ids)
            assert isinstance(text, bytes)
        elif which == "cache_key":
            value = cache["resid_post", n]
            layer = as_int(n)
            assert layer is not None and np.array_equal(value, cache[f"blocks.{layer % CFG.n_layers}.hook_resid_post"])
        elif which == "act_name":
            name = act_name("resid_pre", n)
            assert name == ("hook_resid_pre" if n is None else f"blocks.{as_int(n)}.hook_resid_pre")
        elif which == "add_vector":
            positions = data.draw(st.one_of(edge_integer_arrays(), edge_numbers().map(lambda v: [v])))
            added = interventions.add_vector(model, TOKENS, np.ones(CFG.d_model), 0, positions=positions)
            assert np.size(positions) == 0 or np.asarray(positions).dtype.kind in "iu"
            model.run_with_hooks(TOKENS, fwd_hooks=list(added))
        elif which == "patch":
            positions = data.draw(st.one_of(edge_integer_arrays(), edge_numbers().map(lambda v: [v])))
            interventions.patch(model, TOKENS, cache, ["blocks.0.hook_resid_post"], positions=positions)
            assert np.size(positions) and np.asarray(positions).dtype.kind in "iu"
        elif which == "injection_ratio":
            out = measurements.injection_ratio(cache, np.ones(CFG.d_model), [n])
            assert out.shape == (CFG.n_layers + 1, np.size(n)) and np.asarray(n).dtype.kind in "iu"
        elif which == "injection_limit":
            limit = interventions.injection_limit(model, np.arange(CFG.d_model, dtype=float), 0, n)
            assert as_int(n) is not None
            model.run_with_hooks(TOKENS, fwd_hooks=list(limit))
        elif which == "pad_token":
            sv = interventions.steering_vector(model, "ab", "abcd", 0, pad_token=n, prepend_bos=False)
            padded = int(sv.plus_tokens[-1])
            assert padded == (as_int(n) if n is not None else interventions.space_token(model))
        elif which == "generate":
            out = model.generate(TOKENS[0, :2], max_new_tokens=n, verbose=False, seed=0)
            assert as_int(n) is not None and len(np.ravel(out)) <= 2 + as_int(n)
        else:
            model.to_string([n])
            assert np.ndim(n) > 0 or 0 <= as_int(n) < CFG.d_vocab  # a row [ids] of a batch, or one id in range

    count(which, refused_cleanly(run))


class _Sub(np.ndarray):
    """An ndarray subclass with arithmetic of its own (as a user's might have)."""

    def __add__(self, other):
        return np.asarray(self) * 0


def hook_returns(draw, a: np.ndarray):
    """Something a hook might return for the activation ``a``, and whether it is ``a`` unchanged."""
    kind = draw(st.sampled_from(["copy", "view", "strided_copy", "masked", "matrix", "subclass", "recarray",
                                 "memmap", "float32", "int", "object", "list", "scalar", "tuple", "wrong_shape",
                                 "extra_axis", "transposed", "nan", "string", "none"]))
    if kind == "copy":
        return a.copy(), True
    if kind == "view":
        return a[...], True
    if kind == "strided_copy":
        return np.asfortranarray(a), True
    if kind == "masked":
        return np.ma.masked_array(a, mask=np.zeros(a.shape, bool)), False
    if kind == "matrix":
        return np.asmatrix(a.reshape(-1, a.shape[-1])), False
    if kind == "subclass":
        return a.view(_Sub), False
    if kind == "recarray":
        return a.view(np.recarray), False
    if kind == "memmap":
        return np.memmap(_memmap_file(), dtype=a.dtype, mode="w+", shape=a.shape), False
    if kind == "float32":
        return a.astype(np.float32), a.dtype == np.float32
    if kind == "int":
        return a.astype(np.int64), False
    if kind == "object":
        return a.astype(object), False
    if kind == "list":
        return a.tolist(), False
    if kind == "scalar":
        return float(a.ravel()[0]) if a.size else 0.0, False
    if kind == "tuple":
        return (a,), False
    if kind == "wrong_shape":
        return a[..., :-1], False
    if kind == "extra_axis":
        return a[None], False
    if kind == "transposed":
        return a.T, a.T.shape == a.shape and np.array_equal(a.T, a)
    if kind == "nan":
        b = a.copy()
        b.flat[0] = np.nan
        return b, False
    if kind == "string":
        return "resid", False
    return None, True


def _memmap_file():
    import tempfile

    handle = tempfile.NamedTemporaryFile(prefix="refgpt-hook-", suffix=".bin", delete=True)
    _memmap_file.keep = getattr(_memmap_file, "keep", []) + [handle]  # alive as long as the map is
    return handle.name


HOOKED = ["hook_embed", "blocks.0.hook_resid_pre", "blocks.0.ln1.hook_scale", "blocks.0.ln1.hook_normalized",
          "blocks.0.attn.hook_q", "blocks.0.attn.hook_pattern", "blocks.0.mlp.hook_post", "blocks.1.hook_resid_post",
          "ln_final.hook_normalized"]


@fuzz_settings(60)
@given(data=st.data())
def test_a_hook_returns_anything_and_gets_an_answer_or_one_line(shared, data):
    model = shared.model
    name = data.draw(st.sampled_from(HOOKED))
    same = []

    def hook(activation, hook):
        new, unchanged = hook_returns(data.draw, activation)
        same.append(unchanged)
        return new

    def run():
        logits = model.run_with_hooks(TOKENS, fwd_hooks=[(name, hook)])
        assert all(same), "a hook's changed or odd return was accepted"
        assert np.array_equal(logits, shared.logits)  # what flowed on is exactly the activation

    count("hook", refused_cleanly(run))


def test_the_edge_fuzzers_saw_both_outcomes():
    if not OUTCOMES:
        pytest.skip("run together with the fuzz tests")
    totals = {k: sum(o.get(k, 0) for o in OUTCOMES.values()) for k in ("accepted", "refused")}
    assert totals["accepted"] >= 5 and totals["refused"] >= 5, OUTCOMES


@pytest.mark.parametrize("layout", [np.asfortranarray, lambda a: a[..., ::-1][..., ::-1], np.copy])
def test_a_hook_returning_the_same_values_in_another_layout_changes_no_bit(shared, layout):
    """Found by the hook fuzzer: an array of the activation's values in Fortran order (or strided)
    took another BLAS kernel downstream and moved the logits' last bits at the seven residual and
    ln_final hook points. A hook's return is now laid out as the activation it replaces."""
    model = shared.model
    for name in model.hook_names:
        logits = model.run_with_hooks(TOKENS, fwd_hooks=[(name, lambda a, hook: layout(a))])
        assert np.array_equal(logits, shared.logits), name


def test_a_hook_that_returns_nan_only_once_is_still_an_error(shared):
    """Found by the hook fuzzer: the non-finite guard reruns the pass to locate a NaN; a hook that
    returned NaN the first time and finite values the second made the rerun clean, and the NaN
    logits of the first pass were returned without a word."""
    calls = []

    def once(activation, hook):
        calls.append(1)
        if len(calls) == 1:
            activation = activation.copy()
            activation.flat[0] = np.nan
        return activation

    with pytest.raises(RefGPTError, match="the same pass run again did not"):
        shared.model.run_with_hooks(TOKENS, fwd_hooks=[("hook_embed", once)])
