"""The training script's loop on a few KB (training itself never runs in CI): the loss falls, every
parameter gets a gradient, and the same seed gives the same weights."""

from __future__ import annotations

import json

import numpy as np
import pytest

import refgpt
from refgpt import Config, load
from refgpt.train.bpe_trainer import train_bpe, write_tokenizer
from refgpt.weights import train_default as T

SUBJECTS = ["the king", "my lord", "the queen", "a fool", "good sir", "the duke", "fair lady"]
VERBS = ["doth love", "shall see", "hath slain", "will praise", "must leave", "did call"]
OBJECTS = ["the crown", "his sword", "thy father", "my heart", "the night", "her ring"]


def corpus(n_lines: int, seed: int) -> str:
    """A few KB of toy verse from a tiny grammar: learnable, so a working trainer must learn it."""
    rng = np.random.default_rng(seed)
    return "".join(f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)}.\n"
                   for _ in range(n_lines))


def setup(tmp_path):
    train_text, val_text = corpus(200, 0), corpus(30, 1)  # ~5.6 KB and ~0.8 KB
    tok = write_tokenizer(tmp_path, *train_bpe([train_text], 300))
    cfg = Config(d_model=32, n_layers=2, n_heads=2, d_mlp=64, d_vocab=tok.vocab_size, n_ctx=16)
    return tok, cfg, T.encode_works(tok, [train_text]), T.encode_works(tok, [val_text])


HYPER = {**T.HYPER, "batch": 8, "steps": 40, "lr": 1e-2, "min_lr": 1e-3, "warmup": 5, "eval_every": 20, "eval_windows": 8}


def test_every_parameter_gets_a_gradient_at_initialisation(tmp_path):
    """From GPT-2's initialisation (zero biases, unit gains), one batch's gradient is non-zero in
    every parameter, in every head's Q, K, V and O, and in every row of W_pos."""
    tok, cfg, train_ids, _ = setup(tmp_path)
    params = T.init_params(cfg, 0)
    batch = T.windows(train_ids, 4, cfg.n_ctx + 1, np.random.default_rng(0))  # [4, n_ctx + 1]
    grads = T.tied_grads(T.loss_and_grads(T.tied_model(cfg, params), batch[:, :-1], batch[:, 1:]))
    assert set(grads) == set(params)
    for name, g in grads.items():
        assert np.any(g != 0), name
        if name.startswith("blocks.") and ".attn.W_" in name:
            assert all(np.any(head != 0) for head in g), f"{name}: a head gets no gradient"
    assert np.all(np.any(grads["pos_embed.W_pos"] != 0, axis=1))


@pytest.mark.slow
def test_a_few_steps_on_a_few_kilobytes_lower_the_loss(tmp_path):
    tok, cfg, train_ids, val_ids = setup(tmp_path)
    params, record = T.train(cfg, train_ids, val_ids, HYPER, seed=0, log=lambda *_: None)
    first, last = np.mean(record["train_loss"][:5]), np.mean(record["train_loss"][-5:])
    assert first > np.log(cfg.d_vocab) - 0.5  # it starts near uniform
    assert last < first - 2.0, record["train_loss"]
    assert record["val_loss"][-1] < record["val_loss"][0] - 2.0
    baseline = T.unigram_baseline(train_ids, val_ids, cfg.d_vocab)
    assert record["val_loss"][-1] < baseline["val_loss"]

    again, _ = T.train(cfg, train_ids, val_ids, {**HYPER, "steps": 3}, seed=0, log=lambda *_: None)
    again2, _ = T.train(cfg, train_ids, val_ids, {**HYPER, "steps": 3}, seed=0, log=lambda *_: None)
    assert all(np.array_equal(again[k], again2[k]) for k in again)  # seeded: reproducible


def test_the_written_checkpoint_loads_and_predicts_what_training_left(tmp_path):
    tok, cfg, train_ids, val_ids = setup(tmp_path)
    params, _ = T.train(cfg, train_ids, val_ids, {**HYPER, "steps": 5}, seed=0, log=lambda *_: None)
    trained = T.tied_model(cfg, params)
    trained.tokenizer = tok
    refgpt.save(trained, tmp_path, dtype="float32", config={"initializer_range": T.INITIALIZER_RANGE})  # as the script does
    written = json.loads((tmp_path / "config.json").read_text())
    assert written == {**cfg.to_hf(), "initializer_range": T.INITIALIZER_RANGE,
                       "bos_token_id": tok.eot_token, "eos_token_id": tok.eot_token}
    model = load(tmp_path, dtype="float32")
    assert model.tokenizer.vocab_size == cfg.d_vocab
    ids = model.to_tokens("The king doth love", prepend_bos=False)[0]
    assert np.array_equal(model(ids), T.tied_model(cfg, params)(ids))


def test_with_bos_starts_the_stated_fraction_of_windows_with_endoftext_and_keeps_the_rest():
    """The recipe's BOS windows (weights/train_default.py): position 0 becomes <|endoftext|> in about
    ``bos_fraction`` of the windows, nothing else changes, and the window starts do not depend on it."""
    stream = np.arange(1000, dtype=np.int32)  # [n_tokens]: every token tells where it came from
    batch = T.windows(stream, 4000, 9, np.random.default_rng(0))  # [4000, 9]
    bos = 5000
    out = T.with_bos(batch, 0.5, bos, np.random.default_rng(3))  # [4000, 9]
    first = out[:, 0] == bos  # [4000]
    assert abs(first.mean() - 0.5) < 4 * np.sqrt(0.25 / len(batch))  # 4 standard deviations
    assert np.array_equal(out[:, 1:], batch[:, 1:]) and np.array_equal(out[~first], batch[~first])
    assert np.array_equal(T.with_bos(batch, 0.0, bos, np.random.default_rng(3)), batch)
    assert np.all(T.with_bos(batch, 1.0, bos, np.random.default_rng(3))[:, 0] == bos)


def test_bos_gap_scores_the_same_targets_with_and_without_endoftext_first(tmp_path):
    """bos_gap's two losses are over the same prompt tokens: a model that sees only the current
    token (every weight zero but W_E and the LayerNorm gains: no attention, no MLP, no position)
    predicts each target alike with <|endoftext|> first or not, so its gap is zero."""
    tok, cfg, train_ids, _ = setup(tmp_path)
    params = T.init_params(cfg, 0)
    params = {k: (v if k == "embed.W_E" else np.zeros_like(v)) for k, v in params.items()}
    params.update({k: np.ones_like(v) for k, v in params.items() if k.endswith(".w")})
    model = T.tied_model(cfg, params, "float64")
    model.tokenizer = tok
    gap = T.bos_gap(model, [corpus(40, 2)], lengths=(4, 8), n=20)
    assert [g["prompts"] for g in gap.values()] == [20, 20]
    for g in gap.values():
        assert g["with_bos"] == pytest.approx(g["without_bos"], rel=1e-12) and abs(g["gap"]) <= 1e-12
