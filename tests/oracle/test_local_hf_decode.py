"""HF's own decode loop and padded batch judged locally (refgpt/oracle/local.py, issue 38): GPT2LMHeadModel
run as its users run it — a prompt pass, then one token a step with its DynamicCache, the attention mask
and the position ids ``generate`` computes, forced along a decode golden's tokens; a padded batch (left or
right) with its ``attention_mask`` and ``position_ids`` — dumped through hooks on its own modules
(tests/hf_port.py) at float32, bfloat16 and float16, with no local flag: random models, the embedded
trained model, and GPT-2 small's shape with REFGPT_CALIBRATION=long; bugs planted in the loop (a cached
key of an earlier position scaled, one step's position id off by one, a pad left unmasked in one row)
named at their op, step and row. Its LayerNorms are torch's (Welford): judged by L16
(``layer_norm="any"``), as in tests/oracle/test_local_hf.py."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from refgpt import Model
from refgpt.gpt2 import padding
from refgpt.oracle import decode, golden, local
from test_local_hf import hf_case

pytestmark = [pytest.mark.peer, pytest.mark.slow]  # HF's GPT-2; a second or more a test in a loaded run

LONG = os.environ.get("REFGPT_CALIBRATION") == "long"
STEPS, PROMPT = 5, 6  # decode steps (the prompt pass is step 0), prompt length
PADS = 3  # row 1's left pads
SCALES = (0.3, 1.0, 2.0)  # the weights' scale, by seed


def decode_case(seed, directory, kind):
    """(the checkpoint's Model in float64, the HF model in float32, prompt [batch, P], attention_mask or
    None, the decode golden): a random HF GPT-2 (biases and LayerNorms perturbed), its float64 greedy
    decode of ``STEPS`` tokens after a random prompt; ``kind`` "plain" (one row) or "padded" (two rows,
    row 1 left-padded by ``PADS``)."""
    params, cfg, _, hf = hf_case(seed, directory, scale=SCALES[seed % 3], n_positions=PROMPT + STEPS + 2)
    model = Model(cfg, params)
    prompt = np.random.default_rng(seed).integers(0, cfg.d_vocab, (2, PROMPT))  # [batch, P]
    mask = None
    if kind == "padded":
        mask = np.ones((2, PROMPT), np.int64)  # [batch, P]
        mask[1, :PADS] = 0
        prompt[1, :PADS] = 0  # the pad token
    else:
        prompt = prompt[:1]
    return model, hf, prompt, mask, decode.make(model, prompt, STEPS, attention_mask=mask)


def hf_decode_report(model, hf, prompt, mask, g, store, plant=None):
    """HF's decode loop (``hf`` cast to ``store``, ``plant`` in it) along decode golden ``g``'s tokens,
    judged locally on ``model``'s weights at ``store``."""
    from hf_port import hf_decode_acts
    import peers
    acts = hf_decode_acts(peers.as_dtype(hf, store), prompt, g.tensors["tokens"][:, prompt.shape[1]:], mask, plant)
    return local.judge_decode(model.params, model.cfg, g.tensors, acts, store, layer_norm="any")


@pytest.mark.parametrize("store", ["float32", "bfloat16", "float16"])
def test_hfs_decode_loop_has_no_local_flag_at_any_step_or_row(store, tmp_path):
    """Every op of every step judged (the KV cache as a copy too), plain and left-padded: 2 models,
    20 with REFGPT_CALIBRATION=long."""
    for seed in range(20 if LONG else 2):
        for kind in ("plain", "padded"):
            model, hf, prompt, mask, g = decode_case(seed, tmp_path, kind)
            report = hf_decode_report(model, hf, prompt, mask, g, store)
            assert report.first is None, (seed, kind, local.format_local(report))
            judged = [v for v in report.ops if v.skipped is None]
            per_step = 2 + 17 * model.cfg.n_layers + 2  # embeddings, each layer's 15 ops and 2 caches, ln_final, logits
            assert len(judged) == STEPS * per_step, (seed, kind, [v.name for v in report.ops if v.skipped])
            assert {v.step for v in judged} == set(range(STEPS))


@pytest.fixture(scope="module")
def trained():
    """(refgpt's float64 model, prompt, mask, the decode golden, HF's float32 model): the embedded model
    (trained: weights/default, in HF's layout) loaded by HF itself, two prompts of text of different
    lengths left-padded, 4 greedy steps of the float64 decode."""
    import peers
    import refgpt
    _, transformers, _ = peers.require_peers()
    model = refgpt.load(refgpt.default_model_path(), dtype="float64")
    rows = [model.to_tokens(text, prepend_bos=False)[0] for text in ("To be, or not to", "The cat sat on the mat and")]
    P = max(map(len, rows))
    prompt = np.array([[0] * (P - len(t)) + list(t) for t in rows])  # [batch, P]
    mask = np.array([[0] * (P - len(t)) + [1] * len(t) for t in rows])  # [batch, P]
    hf = transformers.GPT2LMHeadModel.from_pretrained(refgpt.default_model_path(), attn_implementation="eager").eval()
    return model, prompt, mask, decode.make(model, prompt, 4, attention_mask=mask), hf


@pytest.mark.parametrize("store", ["float32", "bfloat16", "float16"])
def test_hfs_decode_of_the_trained_model_has_no_local_flag(store, trained):
    model, prompt, mask, g, hf = trained
    report = hf_decode_report(model, hf, prompt, mask, g, store)
    assert report.first is None, local.format_local(report)
    assert len([v for v in report.ops if v.skipped is None]) == 4 * (2 + 17 * model.cfg.n_layers + 2)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(refgpt's float64 model, prompt, mask, the decode golden, HF's float32 model) at GPT-2 small's
    shape (12 layers, random weights): two prompts of 12 tokens, row 1 left-padded by 4, 4 steps."""
    import peers
    import refgpt
    from test_local_gpt2_small import GPT2_SMALL
    peers.require_peers()
    directory = tmp_path_factory.mktemp("hf_decode_small")
    config = peers.random_hf_config(0, act_fns=["gelu_new"], **GPT2_SMALL)
    hf = peers.as_dtype(peers.random_hf_model(config, 0, f32_exact=True), "float32")
    peers.save_hf_layout(hf, directory / "small")
    model = refgpt.load(str(directory / "small"), dtype="float64", tokenizer=False)
    prompt = np.random.default_rng(0).integers(0, config.vocab_size, (2, 12))  # [batch, P]
    mask = np.ones(prompt.shape, np.int64)  # [batch, P]
    mask[1, :4], prompt[1, :4] = 0, 0
    return model, prompt, mask, decode.make(model, prompt, 4, attention_mask=mask), hf


@pytest.mark.skipif(not LONG, reason="set REFGPT_CALIBRATION=long (GPT-2 small's shape: minutes a precision)")
@pytest.mark.parametrize("store", ["float32", "bfloat16", "float16"])
def test_hfs_decode_at_gpt2_smalls_shape_has_no_local_flag(store, small):
    model, prompt, mask, g, hf = small
    report = hf_decode_report(model, hf, prompt, mask, g, store)
    assert report.first is None, local.format_local(report)
    assert len([v for v in report.ops if v.skipped is None]) == 4 * (2 + 17 * 12 + 2)


def scale_a_cached_key(S, call):
    """Before step 2, layer 0's cached key of position 4 (row 1's second real token) × 1.01 in row 1."""
    if S == 2:
        call["cache"].layers[0].keys[1, :, 4] *= 1.01  # [head, d_head]: HF's cache is [batch, head, keys, d_head]


def position_off_by_one(S, call):
    """Step 3 embeds row 1's token at the position after its own (the loop's count off by one, once)."""
    if S == 3:
        call["position_ids"] = call["position_ids"].clone()
        call["position_ids"][1] += 1


def pad_unmasked(S, call):
    """Step 2's attention mask leaves row 1's first pad unmasked: its query reads the pad's key."""
    if S == 2:
        call["attention_mask"] = call["attention_mask"].clone()
        call["attention_mask"][1, 0] = 1


@pytest.mark.parametrize("store", ["float32", "bfloat16"])
@pytest.mark.parametrize("plant, step, op, tensor, index", [
    (scale_a_cached_key, 2, "kv cache", "blocks.0.attn.cache_k", 4),  # index: the key's position
    (position_off_by_one, 3, "embed", "hook_pos_embed", 0),  # the step's one new position
    (pad_unmasked, 2, "pattern", "blocks.0.attn.hook_pattern", None),
])
def test_a_bug_in_hfs_decode_loop_is_named_locally_at_its_op_step_and_row(store, plant, step, op, tensor, index,
                                                                         tmp_path):
    """Planted through the loop's own arguments at one step, in row 1 of a left-padded batch: named
    there, on its own inputs, and no other step flagged (each step reads the port's own cache)."""
    model, hf, prompt, mask, g = decode_case(0, tmp_path, "padded")
    report = hf_decode_report(model, hf, prompt, mask, g, store, plant)
    first = report.first
    assert first is not None and (first.op, first.name, first.step, first.row) == (
        op, f"step.{step}.{tensor}", step, 1), local.format_local(report)
    assert {v.step for v in report.flagged} == {step}, local.format_local(report)
    if index is not None:
        assert first.index[1] == index, local.format_local(report)
    d = report.as_dict()["local_first"]
    assert (d["op"], d["step"], d["row"]) == (op, step, 1)



@pytest.mark.skipif(not LONG, reason="set REFGPT_CALIBRATION=long (GPT-2 small's shape: minutes a plant)")
@pytest.mark.parametrize("plant, step, op, tensor", [
    (scale_a_cached_key, 2, "kv cache", "blocks.0.attn.cache_k"),
    (position_off_by_one, 3, "embed", "hook_pos_embed"),
    (pad_unmasked, 2, "pattern", "blocks.0.attn.hook_pattern"),
])
def test_a_bug_in_hfs_bfloat16_decode_at_gpt2_smalls_shape_is_named_locally(plant, step, op, tensor, small):
    model, prompt, mask, g, hf = small
    report = hf_decode_report(model, hf, prompt, mask, g, "bfloat16", plant)
    first = report.first
    assert first is not None and (first.op, first.name, first.step, first.row) == (
        op, f"step.{step}.{tensor}", step, 1), local.format_local(report)
    assert {v.step for v in report.flagged} == {step}, local.format_local(report)

# ---- a padded batch, one forward pass ----------------------------------------------------------------------


def padded_report(seed, directory, store, side="left", position_ids=True, unmask=False):
    """HF's forward over a padded batch of two prompts (row 1 padded by ``PADS``), as its users batch
    them: ``attention_mask`` and ``generate``'s position ids (``position_ids=False``: left to HF, which
    counts them from the row's start); ``unmask``: row 1's first pad left unmasked."""
    import peers
    import torch
    from hf_port import hf_port_acts, hf_position_ids
    params, cfg, tokens, hf = hf_case(seed, directory, scale=SCALES[seed % 3])
    mask = np.ones(tokens.shape, np.int64)  # [batch, pos]
    pads = slice(0, PADS) if side == "left" else slice(tokens.shape[1] - PADS, None)
    mask[1, pads] = 0
    tokens[1, pads] = 0
    attend = torch.as_tensor(mask)
    if unmask:
        attend = attend.clone()
        attend[1, pads.start] = 1
    call = {"attention_mask": attend, **({"position_ids": hf_position_ids(mask)} if position_ids else {})}
    acts = hf_port_acts(peers.as_dtype(hf, store), tokens, **call)
    return cfg, local.judge(params, cfg, tokens, acts, store, attention_mask=mask,
                            position_ids=np.where(mask == 1, padding.position_ids(mask), 0), layer_norm="any")


@pytest.mark.parametrize("store", ["float32", "bfloat16", "float16"])
def test_hfs_padded_batch_has_no_local_flag(store, tmp_path):
    """Left and right padding, every op of both rows judged at their real positions: 2 models, 20 with
    REFGPT_CALIBRATION=long."""
    for seed in range(20 if LONG else 2):
        for side in ("left", "right"):
            cfg, report = padded_report(seed, tmp_path, store, side)
            assert report.first is None, (seed, side, local.format_local(report))
            assert len([v for v in report.ops if v.skipped is None]) == 2 + 15 * cfg.n_layers + 2


@pytest.mark.parametrize("store", ["float32", "bfloat16"])
@pytest.mark.parametrize("bug, op, tensor", [
    ("pad unmasked", "pattern", "blocks.0.attn.hook_pattern"),
    ("positions left to HF", "embed", "hook_pos_embed"),  # row 1's real tokens embedded PADS positions on
])
def test_a_padding_bug_in_hfs_batch_is_named_locally_at_its_op_and_row(store, bug, op, tensor, tmp_path):
    _, report = padded_report(1, tmp_path, store, position_ids=bug != "positions left to HF",
                              unmask=bug == "pad unmasked")
    first = report.first
    assert first is not None and (first.op, first.name, first.row) == (op, tensor, 1), local.format_local(report)
    if bug == "positions left to HF":
        assert first.index[1] >= PADS  # a real position (pads are not judged)


# ---- the command line --------------------------------------------------------------------------------------


def test_compare_local_judges_hfs_decode_dump_step_by_step(refgpt_cli, tmp_path, monkeypatch):
    """HF's float32 decode loop saved under the decode golden's names, judged by `refgpt compare
    --local --local-layer-norm any`: no flag; with a cached key scaled, named at its op, step and row."""
    import refgpt
    from safetensors.numpy import save_file
    from hf_port import hf_decode_acts
    monkeypatch.chdir(tmp_path)
    _, hf, prompt, mask, _ = decode_case(2, tmp_path, "padded")  # the checkpoint saved in m2/
    g = decode.make(refgpt.load("m2", tokenizer=False), prompt, STEPS, attention_mask=mask)  # records m2's hashes
    golden.write(tmp_path / "g.safetensors", g)
    chosen = g.tensors["tokens"][:, PROMPT:]
    args = ("compare", "g.safetensors", "hf.safetensors", "--local", "--local-model", "m2", "--local-layer-norm", "any",
            "--json")
    for plant, status in ((None, 0), (scale_a_cached_key, 1)):
        acts = hf_decode_acts(hf, prompt, chosen, mask, plant)
        save_file({"tokens": g.tensors["tokens"], **{n: a.astype(np.float32) if a.dtype.kind == "f" else a
                                                     for n, a in acts.items()}}, str(tmp_path / "hf.safetensors"))
        code, out, err = refgpt_cli.in_process(*args)
        assert code == status, out[-3000:] + err
        first = json.loads(out)["local_first"]
        if plant is None:
            assert first is None
        else:
            assert (first["op"], first["name"], first["step"], first["row"]) == (
                "kv cache", "step.2.blocks.0.attn.cache_k", 2, 1)
