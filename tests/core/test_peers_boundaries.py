"""refgpt's plain, cached and KV-cached forward passes against HF's GPT2LMHeadModel (and
TransformerLens 3.9) at lengths that cross every block boundary of every fast path: 1, 63, 64,
65, 127, 128, 129 and n_ctx = 140 (attention's 64-query blocks, gelu_new's 64-row blocks; see
test_forward_paths.py), float64 and float32, batched and not. And the config defaults against
``transformers.GPT2Config()``'s.

The other peer tests compare through paths that make the full pattern (run_with_cache) or at
lengths ≤ 64, where the blocked attention is one block: a plain forward that sees only the first
64 keys passed them all. Tolerances: the peers' (tests/peers.py), ≤ 1e-12 relative in float64,
≤ 2e-5 in float32.

Needs the 'peers' extra; skipped without it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from peers import require_peers

torch, transformers, transformer_lens = require_peers()
pytestmark = pytest.mark.peer  # every test here compares with a peer (the peers extra)

import peers as P  # noqa: E402  (after the importorskip)
from refgpt import Config  # noqa: E402
from refgpt.gpt2.config import HF_DEFAULTS, TL_SWITCHES  # noqa: E402

N_CTX = 140
LENGTHS = (1, 63, 64, 65, 127, 128, 129, N_CTX)
TOL = {"float64": P.F64_TOL, "float32": P.F32_TOL}


@pytest.fixture(scope="module")
def hf64():
    config = transformers.GPT2Config(n_embd=8, n_layer=2, n_head=2, n_inner=12, vocab_size=23,
                                     n_positions=N_CTX, activation_function="gelu_new")
    return P.random_hf_model(config, seed=5, f32_exact=True)  # float32-exact: one model, both dtypes


@pytest.fixture(scope="module")
def stored(hf64, tmp_path_factory):
    return P.save_hf_layout(hf64, tmp_path_factory.mktemp("boundaries"), dtype="F64")


@pytest.fixture(scope="module", params=["float64", "float32"])
def pair(request, hf64, stored):
    """(refgpt model, HF model) holding the same numbers, in one compute dtype."""
    dtype = request.param
    return P.refgpt_load(stored, dtype), P.reference_model(hf64, "F64", dtype)


def hf_logits(hf, tokens):
    return P.hf_forward(hf, tokens)[0]  # [batch, pos, d_vocab]


def tokens_of(pos, batch):
    return np.random.default_rng(pos).integers(0, 23, size=(pos,) if batch is None else (batch, pos))


@pytest.mark.parametrize("batch", [None, 2])
@pytest.mark.parametrize("pos", LENGTHS)
def test_plain_and_cached_forward_match_hf(pair, pos, batch):
    model, hf = pair
    tokens = tokens_of(pos, batch)
    expected = hf_logits(hf, tokens)
    expected = expected if batch else expected[0]
    tol = TOL[model.dtype.name]
    plain = model(tokens)  # blocked attention
    assert plain.dtype == model.dtype and plain.shape == expected.shape
    assert P.rel_err(plain, expected) <= tol
    cached, cache = model.run_with_cache(tokens)  # full attention, every hook point
    assert P.rel_err(cached, expected) <= tol
    assert P.rel_err(model(tokens, last_only=True), expected[..., -1:, :]) <= tol


@pytest.mark.parametrize("batch", [None, 2])
@pytest.mark.parametrize("chunks", [(1,) * N_CTX, (3, 130, 7), (64, 1, 64, 11)])
def test_kv_cached_forward_matches_hf(pair, chunks, batch):
    """Token by token, and in chunks that start inside a block and cross 64 and 128."""
    model, hf = pair
    tokens = tokens_of(N_CTX, batch)
    expected = hf_logits(hf, tokens)
    past = model.kv_cache(batch or 1)
    pieces, start = [], 0
    for n in chunks:
        pieces.append(model(tokens[..., start:start + n], past=past))
        start += n
    got = np.concatenate(pieces, axis=-2)
    assert P.rel_err(got if batch else got[None], expected) <= TOL[model.dtype.name]


def test_plain_forward_matches_transformer_lens(hf64, stored):
    tl = P.tl_model_from_hf(hf64, "float64")
    model = P.refgpt_load(stored, "float64")
    for pos in (65, 129, N_CTX):
        tokens = tokens_of(pos, 2)
        expected, _ = P.tl_run_with_cache(tl, tokens)
        assert P.rel_err(model(tokens), expected) <= P.TL_TOL, pos


def test_config_defaults_are_gpt2configs():
    """What refgpt assumes when config.json omits a key is what transformers assumes."""
    hf = transformers.GPT2Config()
    for key, value in HF_DEFAULTS.items():
        assert getattr(hf, key) == value, key
    cfg = Config.from_hf({})
    assert (cfg.d_vocab, cfg.n_ctx, cfg.d_model, cfg.n_layers, cfg.n_heads) == \
        (hf.vocab_size, hf.n_positions, hf.n_embd, hf.n_layer, hf.n_head)
    assert cfg.d_mlp == 4 * hf.n_embd and hf.n_inner is None
    assert (cfg.eps, cfg.act_fn, cfg.use_attn_scale, cfg.scale_attn_by_inverse_layer_idx,
            cfg.reorder_and_upcast_attn, cfg.tie_word_embeddings) == \
        (hf.layer_norm_epsilon, hf.activation_function, hf.scale_attn_weights, hf.scale_attn_by_inverse_layer_idx,
         hf.reorder_and_upcast_attn, hf.tie_word_embeddings)
    # the dataclass's own defaults, for Configs built in code
    defaults = {f.name: f.default for f in dataclasses.fields(Config)
                if f.default is not dataclasses.MISSING and f.name not in TL_SWITCHES}  # TL's switches: not HF's
    assert defaults == {"eps": hf.layer_norm_epsilon, "act_fn": hf.activation_function,
                        "use_attn_scale": hf.scale_attn_weights,
                        "scale_attn_by_inverse_layer_idx": hf.scale_attn_by_inverse_layer_idx,
                        "reorder_and_upcast_attn": hf.reorder_and_upcast_attn,
                        "tie_word_embeddings": hf.tie_word_embeddings}
    # and to_hf ∘ from_hf is the identity on what GPT2Config writes
    assert Config.from_hf(Config.from_hf(hf.to_dict()).to_hf()) == Config.from_hf(hf.to_dict())
