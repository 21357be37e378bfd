"""The tuned lens in refgpt and in the tuned-lens package (0.2.0) give the same logits, from each
other's files: a lens the package wrote gives TunedLens.forward's logits in refgpt (within a bound
derived for the package's float32), and the package loads a lens refgpt wrote and gives refgpt's
logits (float64). The unembedding hash is the package's; a lens for another model is refused; the
hub's misspelled hash key is read. Without the package: the lens API (forward, run, resid_mid) and
evaluate_lenses against the definitions."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from random_models import random_params
from refgpt import Config, Model, RefGPTError
from refgpt.analysis.lens import TunedLens, evaluate_lenses, load_translators, logit_lens, tuned_lens
from refgpt.files.lens_directory import unembed_hash
from refgpt.gpt2.activations import log_softmax
from refgpt.gpt2.layernorm import layer_norm
from refgpt.gpt2.loss import lm_cross_entropy_loss
from tuned_lens_peer import lens_forward_bound as forward_bound

CFG = Config(d_model=12, n_layers=3, n_heads=3, d_mlp=20, d_vocab=23, n_ctx=10)


@pytest.fixture(scope="module")
def model():
    params = random_params(CFG, seed=5)
    params["unembed.b_U"] = 0.3 * np.random.default_rng(5).standard_normal(CFG.d_vocab)
    return Model(CFG, params)


def random_translators(d, n_layers, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return {i: ((0.3 / np.sqrt(d) * rng.standard_normal((d, d))).astype(dtype), (0.3 * rng.standard_normal(d)).astype(dtype))
            for i in range(n_layers)}


# ---- against the package -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(HF model float32, HF float64 copy, refgpt model float64), the same float32-exact weights,
    d_vocab × d_model > 1000 so that the hash sees a summarised array."""
    from tuned_lens_peer import require_tuned_lens

    require_tuned_lens()
    from peers import random_hf_config, random_hf_model, reference_model, save_hf_layout
    import refgpt

    config = random_hf_config(11, n_layer=3, n_embd=16, n_head=2, vocab_size=97, n_positions=16,
                              tie_word_embeddings=False, activation_function="gelu_new")
    hf = random_hf_model(config, seed=11, dtype="float64", scale=0.6)
    directory = save_hf_layout(hf, tmp_path_factory.mktemp("model"), dtype="F32")  # the weights as stored
    return reference_model(hf, "F32", "float32"), reference_model(hf, "F32", "float64"), refgpt.load(directory)


def streams_of(model, seed=0):
    tokens = np.random.default_rng(seed).integers(0, model.cfg.d_vocab, (2, model.cfg.n_ctx))
    _, cache = model.run_with_cache(tokens)
    return [cache["resid_pre", i].astype(np.float32).astype(np.float64) for i in range(model.cfg.n_layers)]  # float32 values


@pytest.mark.peer
def test_a_lens_the_package_wrote_gives_its_logits_in_refgpt(pair, tmp_path):
    import torch
    from tuned_lens import TunedLens as PackageLens
    from tuned_lens_peer import hf_lens_forward

    hf32, _, model = pair
    theirs = PackageLens.from_model(hf32)
    with torch.no_grad():
        for i, (W, b) in random_translators(16, 3, seed=2, dtype=np.float32).items():
            theirs[i].weight.copy_(torch.tensor(W))
            theirs[i].bias.copy_(torch.tensor(b))
    theirs.save(tmp_path / "lens")
    mine = TunedLens.load(model, tmp_path / "lens")  # the hash is checked: it is this model's
    assert mine.notes == [] and mine.config["unembed_hash"] == unembed_hash(model.params["unembed.W_U"])
    u32, u64 = np.finfo(np.float32).eps / 2, np.finfo(np.float64).eps / 2
    for i, h in enumerate(streams_of(model)):
        reference = hf_lens_forward(theirs, h, i)  # [batch, pos, d_vocab] float32
        W, b = mine.translators[i]
        bound = forward_bound(model, W, b, h, u32) + forward_bound(model, W, b, h, u64)
        error = np.abs(mine.forward(h, i) - reference)
        assert np.all(error <= bound), (i, float((error / bound).max()))
        assert error.max() > 0  # a float32 computation, not bit-identical: the bound is doing work


@pytest.mark.peer
def test_the_package_loads_a_lens_refgpt_wrote_and_gives_refgpts_logits(pair, tmp_path, caplog):
    from tuned_lens import TunedLens as PackageLens
    from tuned_lens_peer import hf_lens_forward

    _, hf64, model = pair
    mine = TunedLens(model, random_translators(16, 3, seed=3))
    mine.save(tmp_path / "lens", base_model="random-gpt2")
    with caplog.at_level(logging.WARNING):
        theirs = PackageLens.from_model_and_pretrained(hf64, str(tmp_path / "lens"))
    assert not [r for r in caplog.records if "hash" in r.getMessage() or "Ignoring" in r.getMessage()]
    assert theirs.config.base_model_name_or_path == "random-gpt2" and len(theirs) == 3
    u64 = np.finfo(np.float64).eps / 2
    for i, h in enumerate(streams_of(model, seed=1)):
        W, b = mine.translators[i]
        error = np.abs(mine.forward(h, i) - hf_lens_forward(theirs, h, i))
        assert np.all(error <= 2 * forward_bound(model, W, b, h, u64)), i  # two float64 computations


@pytest.mark.peer
def test_unembed_hash_is_the_packages_tied_or_not(pair):
    from tuned_lens.nn.unembed import Unembed

    hf32, hf64, model = pair
    assert unembed_hash(model.params["unembed.W_U"]) == Unembed(hf32).unembedding_hash() == Unembed(hf64).unembedding_hash()
    import refgpt

    default = refgpt.load_default()
    import transformers

    tied = transformers.GPT2LMHeadModel.from_pretrained(str(default.source))
    assert unembed_hash(default.params["unembed.W_U"]) == Unembed(tied).unembedding_hash()


@pytest.mark.peer
def test_the_hubs_misspelled_hash_is_checked_by_refgpt_where_the_package_ignores_it(pair, tmp_path, caplog):
    """lens/gpt2/config.json spells 'unemebd_hash': the package drops the key (a warning) and loads a
    lens for any unembedding; refgpt reads the key and refuses a lens whose hash is not the model's."""
    from tuned_lens import TunedLens as PackageLens

    _, hf64, model = pair
    TunedLens(model, random_translators(16, 3, seed=4)).save(tmp_path / "lens")
    raw = json.loads((tmp_path / "lens" / "config.json").read_text())
    raw.pop("unembed_hash")
    raw["unemebd_hash"] = "0" * 64  # another model's
    (tmp_path / "lens" / "config.json").write_text(json.dumps(raw))
    with caplog.at_level(logging.WARNING):
        PackageLens.from_model_and_pretrained(hf64, str(tmp_path / "lens"))  # loads: no check happened
    assert any("Ignoring config key 'unemebd_hash'" in r.getMessage() for r in caplog.records)
    with pytest.raises(RefGPTError, match=r"unembed_hash 000000000000… is not this model's"):
        TunedLens.load(model, tmp_path / "lens")
    lens = TunedLens.load(model, tmp_path / "lens", check_unembed_hash=False)
    assert any("unemebd_hash" in note for note in lens.notes)


# ---- the lens itself -------------------------------------------------------------------------------


def test_forward_is_the_definition_and_the_rows_of_the_lens_result(model, tmp_path):
    tokens = np.random.default_rng(0).integers(0, CFG.d_vocab, (2, 7))
    translators = random_translators(12, 3, seed=6)
    lens = TunedLens(model, translators)
    result = lens.run(tokens)
    _, cache = model.run_with_cache(tokens)
    assert np.array_equal(result.logits, tuned_lens(cache, translators).logits)
    assert np.array_equal(result.logits[-1], logit_lens(cache).logits[-1])  # the final stream: untranslated
    p = model.params
    u64 = np.finfo(np.float64).eps / 2
    for i in range(3):
        h = cache["resid_pre", i]
        W, b = translators[i]
        expected = layer_norm(h + h @ W.T + b, p["ln_final.w"], p["ln_final.b"], CFG.eps) @ p["unembed.W_U"] + p["unembed.b_U"]
        assert np.all(np.abs(lens.forward(h, i) - expected) <= 2 * forward_bound(model, W, b, h, u64))
        assert np.array_equal(lens.forward(h, i), result.logits[i])
    lens.save(tmp_path / "lens")
    assert np.array_equal(TunedLens.load(model, tmp_path / "lens").run(tokens).logits, result.logits)
    for bad in (3, -1, 1.0, True):
        with pytest.raises(RefGPTError, match="layer must be a block"):
            lens.forward(h, bad)


def test_a_resid_mid_lens_reads_the_stream_between_attention_and_mlp(model, tmp_path):
    tokens = np.random.default_rng(1).integers(0, CFG.d_vocab, (1, 6))
    lens = TunedLens(model, random_translators(12, 3, seed=7), stream="resid_mid")
    assert lens.hook_names[:3] == [f"blocks.{i}.hook_resid_mid" for i in range(3)]
    result = lens.run(tokens)
    assert result.labels == ["0_mid", "1_mid", "2_mid", "final_post"]
    _, cache = model.run_with_cache(tokens)
    assert np.array_equal(result.logits[1], lens.forward(cache["blocks.1.hook_resid_mid"], 1))
    mid_logit = logit_lens(cache, "resid_mid")
    assert np.array_equal(TunedLens(model, {i: (np.zeros((12, 12)), np.zeros(12)) for i in range(3)},
                                    stream="resid_mid")(cache).logits, mid_logit.logits)
    lens.save(tmp_path / "mid")
    assert TunedLens.load(model, tmp_path / "mid").stream == "resid_mid"
    with pytest.raises(RefGPTError, match="a lens read at resid_mid; load_translators"):  # bare translators
        load_translators(tmp_path / "mid", model)  # cannot say their stream: never applied at resid_pre


def test_a_lens_for_another_shape_or_the_shipped_lens_elsewhere_is_refused(model, tmp_path):
    other = Model(Config(**{**CFG.__dict__, "d_model": 6, "n_heads": 2}), random_params(
        Config(**{**CFG.__dict__, "d_model": 6, "n_heads": 2}), seed=1))
    TunedLens(other, random_translators(6, 3, seed=1)).save(tmp_path / "small")
    with pytest.raises(RefGPTError, match="a lens for d_model 6, 3 layers"):
        TunedLens.load(model, tmp_path / "small")
    with pytest.raises(RefGPTError, match="the shipped tuned lens is for the embedded model only"):
        TunedLens.load(model)
    with pytest.raises(RefGPTError, match="translator 5 is not a block"):
        TunedLens(model, {**random_translators(12, 3, seed=1), 5: (np.zeros((12, 12)), np.zeros(12))})


def test_evaluate_lenses_is_the_packages_definitions(model):
    """KL at every position against the model's own distribution, CE of the next token (positions
    0 … T−2), entropy; the model's own CE is its mean next-token loss; zero translators = logit lens."""
    windows = np.random.default_rng(2).integers(0, CFG.d_vocab, (5, 8))
    translators = random_translators(12, 3, seed=8)
    result = evaluate_lenses(model, windows, TunedLens(model, translators), nats_to_bpb=0.5)
    logits, cache = model.run_with_cache(windows)
    log_p = log_softmax(logits)
    tolerance = 1e-12  # two summation orders of a few hundred float64 terms of size ≤ 10, relative
    for kind, lens in (("logit", logit_lens(cache)), ("tuned", tuned_lens(cache, translators))):
        log_q = log_softmax(lens.logits[:-1])  # [layer, n, T, d_vocab]
        kl = (np.exp(log_p) * (log_p - log_q)).sum(-1).mean((1, 2))
        ce = -np.take_along_axis(log_q[:, :, :-1], np.broadcast_to(windows[None, :, 1:, None], (3, 5, 7, 1)), -1).mean((1, 2, 3))
        entropy = -(np.exp(log_q) * log_q).sum(-1).mean((1, 2))
        for name, expected in (("kl", kl), ("ce", ce), ("entropy", entropy)):
            assert np.allclose(result.metrics[kind][name], expected, rtol=tolerance, atol=0), (kind, name)
    assert np.isclose(result.final["ce"], lm_cross_entropy_loss(logits, windows), rtol=1e-12, atol=0)
    assert result.bits_per_byte()["final"]["ce"] == result.final["ce"] * 0.5
    zero = evaluate_lenses(model, windows, TunedLens(model, {i: (np.zeros((12, 12)), np.zeros(12)) for i in range(3)}))
    assert zero.metrics["tuned"] == zero.metrics["logit"]
    with pytest.raises(RefGPTError, match="bits per byte need nats_to_bpb"):
        zero.bits_per_byte()
    with pytest.raises(RefGPTError, match="windows must be token ids"):
        evaluate_lenses(model, windows[:, :1])
