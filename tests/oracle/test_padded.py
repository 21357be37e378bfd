"""Padded-batch goldens (issue 25, item 2): rows of different lengths in one batch, with the mask and
position ids the golden used, judged at real positions only, each divergence named (row, tensor,
position).

A correct float32 pass passes — refgpt's, and HF's with its own position convention (pads at 1,
which no real position reads) — on left- and right-padded batches; a port whose pads leak into real
positions is named at the first tensor where a real position differs: pads attended (mask not
applied to the scores), positions counted from the row's start instead of its first real token,
another row's mask, HF without position ids under left padding. ``--judge-pads`` judges the pads too.
"""

from __future__ import annotations

import numpy as np
import pytest

from random_models import random_params, save_checkpoint
from refgpt import Config, Model
from refgpt.gpt2 import padding
from refgpt.oracle import comparison as oracle
from refgpt.oracle import golden
from refgpt.tl import inputs

CFG = Config(d_model=16, n_layers=2, n_heads=4, d_mlp=64, d_vocab=50, n_ctx=12)
PAD = 49
LENGTHS = (7, 5, 3)
T = max(LENGTHS)


def batch(side):
    rng = np.random.default_rng(1)
    mask = np.zeros((len(LENGTHS), T), np.int64)
    for b, n in enumerate(LENGTHS):
        if side == "left":
            mask[b, T - n:] = 1
        else:
            mask[b, :n] = 1
    tokens = np.where(mask == 1, rng.integers(0, PAD, mask.shape), PAD)
    return tokens, mask


def model(dtype="float64"):
    p = {k: v.astype(np.float32).astype(np.float64) for k, v in random_params(CFG, 9, 0.5).items()}
    p["unembed.W_U"] = p["embed.W_E"].T  # tied, as HF's checkpoint stores it
    return Model(CFG, p, dtype=dtype)


@pytest.fixture(scope="module")
def goldens():
    out = {}
    for side in ("left", "right"):
        tokens, mask = batch(side)
        out[side] = golden.make(model(), tokens, attention_mask=mask, padding_side=side, pad_token_id=PAD)
    return out


def f32(side, monkeypatch=None, bug=None):
    tokens, mask = batch(side)
    if bug is not None:
        monkeypatch.setattr(inputs, "padding_of", bug)
    return golden.compute(model("float32"), tokens, attention_mask=mask)


def test_the_golden_holds_the_mask_positions_and_the_convention(goldens):
    for side, g in goldens.items():
        tokens, mask = batch(side)
        assert np.array_equal(g.tensors["attention_mask"], mask) and np.array_equal(g.tensors["tokens"], tokens)
        assert np.array_equal(g.tensors["position_ids"], np.where(mask == 1, padding.position_ids(mask), 0))
        meta = __import__("json").loads(g.metadata["padding"])
        assert meta["side"] == side and meta["pad_token_id"] == PAD and "HF fills pad positions with 1" in meta["position_ids"]
        alone = golden.compute(model(), tokens[2][mask[2] == 1][None])  # row 2 run alone
        np.testing.assert_allclose(g.tensors["logits"][2][mask[2] == 1], alone["logits"][0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_correct_float32_pass_passes_at_real_positions(goldens, side):
    report = oracle.compare(goldens[side], f32(side))
    assert report.ok, report.table(after_first=2)
    logits = report["logits"]
    assert logits.n_compared == sum(LENGTHS) * CFG.d_vocab and "pad positions not judged" in " ".join(logits.notes)


def pads_attended(model, mask, shape, past=None):
    """refgpt's padding with the pads left out of the score mask (causal only): what a port does that
    builds position ids from the mask but never adds it to the scores."""
    p = padding_of_real(model, mask, shape, past)
    if p is None:
        return p
    causal = padding.score_mask(np.ones_like(p.mask), shape[1], model.dtype)
    return inputs.Padding(p.mask, p.positions, p.real, causal)


def positions_from_the_index(model, mask, shape, past=None):
    """refgpt's padding with each token's position its index in the padded row."""
    p = padding_of_real(model, mask, shape, past)
    if p is None:
        return p
    return inputs.Padding(p.mask, np.broadcast_to(np.arange(shape[1]), shape).copy(), p.real, p.score_mask)


def another_rows_mask(model, mask, shape, past=None):
    """Row 1's mask applied to row 0 as well (a mask row off by one): row 0's last real tokens become pads."""
    if mask is not None:
        mask = mask.copy()
        mask[0] = mask[1]
    return padding_of_real(model, mask, shape, past)


def longer_mask_of_a_shorter_row(model, mask, shape, past=None):
    """Row 1's mask applied to the shorter row 2 under right padding: two of row 2's pads counted as
    real. Causal attention keeps them from every real position: nothing real changes."""
    if mask is not None:
        mask = mask.copy()
        mask[2] = mask[1]
    return padding_of_real(model, mask, shape, past)


padding_of_real = inputs.padding_of


@pytest.mark.parametrize("side, bug, tensor, row, position", [
    ("left", pads_attended, "blocks.0.attn.hook_pattern", 1, T - LENGTHS[1]),
    ("left", positions_from_the_index, "hook_pos_embed", 1, T - LENGTHS[1]),
    ("right", another_rows_mask, "hook_pos_embed", 0, LENGTHS[1]),
])
def test_a_padding_bug_is_named_at_its_row_tensor_and_position(goldens, monkeypatch, side, bug, tensor, row, position):
    report = oracle.compare(goldens[side], f32(side, monkeypatch, bug))
    t = report.first_divergence
    assert t is not None and t.name == tensor, report.table(after_first=2)
    assert t.first_bad.index[0] == row and t.first_bad.where["pos"] == position
    text = oracle.describe_divergence(t)
    assert f"row {row}, " in text and f"position {position}" in text
    assert all(x.ok for x in report.tensors[: report.tensors.index(t)])


def test_pads_that_no_real_position_sees_are_not_a_divergence(goldens, monkeypatch):
    report = oracle.compare(goldens["right"], f32("right", monkeypatch, longer_mask_of_a_shorter_row))
    assert report.ok, report.table(after_first=2)
    strict = oracle.compare(goldens["right"], f32("right", monkeypatch, longer_mask_of_a_shorter_row), judge_pads=True)
    t = strict.first_divergence  # judged at the pads too: the pads counted as real have position embeddings
    assert t.name == "hook_pos_embed" and t.first_bad.index[:2] == (2, LENGTHS[2])


@pytest.mark.peer
def test_hf_with_its_pad_position_convention_passes_and_without_position_ids_is_named(goldens, tmp_path):
    torch = pytest.importorskip("torch", reason="needs the 'peers' extra (torch)")
    pytest.importorskip("transformers", reason="needs the 'peers' extra (transformers)")
    from transformers import GPT2LMHeadModel

    torch.set_num_threads(1)
    save_checkpoint(model(), tmp_path, dtype=np.float32)
    hf = GPT2LMHeadModel.from_pretrained(tmp_path, attn_implementation="eager", torch_dtype="float32").eval()
    tokens, mask = batch("left")

    def hf_pass(position_ids):
        with torch.no_grad():
            o = hf(torch.as_tensor(tokens), attention_mask=torch.as_tensor(mask), position_ids=position_ids,
                   output_hidden_states=True, output_attentions=True)
        cand = {"tokens": tokens, "logits": o.logits.numpy()}
        cand.update({f"hidden_states.{i}": h.numpy() for i, h in enumerate(o.hidden_states)})
        cand.update({f"attentions.{i}": a.numpy() for i, a in enumerate(o.attentions)})
        return cand

    m = torch.as_tensor(mask)
    hf_positions = (m.cumsum(-1) - 1).masked_fill(m == 0, 1)  # what HF's generate passes: pads at 1
    report = oracle.compare(goldens["left"], hf_pass(hf_positions), name_map="hf")
    assert report.ok, report.table(after_first=2)
    strict = oracle.compare(goldens["left"], hf_pass(hf_positions), name_map="hf", judge_pads=True)
    assert strict.first_divergence.name == "blocks.0.hook_resid_pre"  # the pads' position 1: judged only if asked
    assert strict.first_divergence.first_bad.where["pos"] < T - LENGTHS[1]  # …at a pad
    bad = oracle.compare(goldens["left"], hf_pass(None), name_map="hf")  # positions 0 … T − 1 under left padding
    t = bad.first_divergence
    assert t.name == "blocks.0.hook_resid_pre" and t.first_bad.index[:2] == (1, T - LENGTHS[1])
