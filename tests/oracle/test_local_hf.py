"""HF transformers as a port judged locally (refgpt/oracle/local.py): GPT2LMHeadModel in float32,
bfloat16 and float16 on torch's CPU kernels, dumped through its own modules' hooks
(tests/hf_port.py), with no local flag; its LayerNorm (torch's Welford kernel) judged by L16, chosen
by name (``layer_norm="any"``), never by default."""

from __future__ import annotations

import os

import numpy as np
import pytest

from refgpt import RefGPTError
from refgpt.oracle import local

pytestmark = pytest.mark.peer  # every test here runs HF's GPT-2

LONG = os.environ.get("REFGPT_CALIBRATION") == "long"


def hf_case(seed, tmp_path, scale=1.0, **overrides):
    """(refgpt's float64 weights, Config, tokens, the HF model in float64) for a random HF GPT-2."""
    peers = pytest.importorskip("peers")
    peers.require_peers()
    import refgpt
    config = peers.random_hf_config(seed, act_fns=["gelu_new"], **overrides)
    hf = peers.random_hf_model(config, seed, f32_exact=True, scale=scale)
    hf = peers.as_dtype(hf, "float32")  # a float32 checkpoint, as real ones are (LayerNorm's 1 + noise is not float32)
    peers.save_hf_layout(hf, tmp_path / f"m{seed}")
    ref = refgpt.load(str(tmp_path / f"m{seed}"), dtype="float64", tokenizer=False)
    tokens = np.random.default_rng(seed).integers(0, config.vocab_size, (2, config.n_positions))
    return ref.params, ref.cfg, tokens, hf


@pytest.mark.parametrize("store", ["float32", "bfloat16", "float16"])
def test_hf_is_a_correct_port_with_no_local_flag(store, tmp_path):
    import peers
    from hf_port import hf_port_acts
    for seed in range(30 if LONG else 3):
        params, cfg, tokens, hf = hf_case(seed, tmp_path, scale=(0.3, 1.0, 2.0)[seed % 3])
        acts = hf_port_acts(peers.as_dtype(hf, store), tokens)
        report = local.judge(params, cfg, tokens, acts, store, layer_norm="any")
        assert report.first is None, local.format_local(report)
        judged = [v for v in report.ops if v.skipped is None]
        assert len(judged) == 2 + 15 * cfg.n_layers + 2  # every op; the LayerNorms input to output
        assert {v.op for v in judged} >= {"ln", "scores", "pattern", "z", "embed", "gelu_new", "logits"}


def test_hf_with_the_two_pass_default_leaves_its_layer_norms_unjudged_not_loosened(tmp_path):
    import peers
    from hf_port import hf_port_acts
    params, cfg, tokens, hf = hf_case(1, tmp_path)
    acts = hf_port_acts(peers.as_dtype(hf, "float32"), tokens)
    report = local.judge(params, cfg, tokens, acts, "float32")
    by_name = {v.name: v for v in report.ops}
    assert by_name["blocks.0.ln1.hook_scale"].skipped == "not dumped"
    assert "blocks.0.ln1.out" not in by_name  # L7 judges x̂ and its line; HF dumps neither
    with pytest.raises(RefGPTError, match="unknown LayerNorm algorithm 'welford'"):
        local.judge(params, cfg, tokens, acts, "float32", layer_norm="welford")


@pytest.mark.parametrize("store", ["float32", "bfloat16"])
def test_hfs_layer_norm_with_one_positions_epsilon_wrong_is_named_at_its_op(store, tmp_path):
    """A bug in torch's LayerNorm as HF calls it (ln_2 at layer 0, one position's ε large enough to
    move its σ by 5 %) is named at that LayerNorm by L16, at that position."""
    import torch
    import peers
    from hf_port import hf_port_acts
    params, cfg, tokens, hf = hf_case(1, tmp_path)
    port = peers.as_dtype(hf, store)
    ln = port.transformer.h[0].ln_2

    def wrong_eps(module, args, out):
        x = args[0].float()
        var = x.var(-1, unbiased=False, keepdim=True)[:, 5:6]  # [batch, 1, 1] position 5
        eps = module.eps + 0.1025 * var
        y = ((x[:, 5:6] - x[:, 5:6].mean(-1, keepdim=True)) / torch.sqrt(var + eps) * module.weight.float()
             + module.bias.float())
        out = out.clone()
        out[:, 5:6] = y.to(out.dtype)
        return out

    handle = ln.register_forward_hook(wrong_eps)
    try:
        acts = hf_port_acts(port, tokens)
    finally:
        handle.remove()
    first = local.judge(params, cfg, tokens, acts, store, layer_norm="any").first
    assert (first.op, first.name, first.index[1]) == ("ln", "blocks.0.ln2.out", 5)


def test_compare_local_judges_an_hf_dump_with_local_layer_norm_any(refgpt_cli, tmp_path, monkeypatch):
    """The command line: HF's activations saved under refgpt's names, judged with
    --local-layer-norm any: every op judged, no flag; without it the LayerNorms are not judged."""
    import peers
    import refgpt
    from safetensors.numpy import save_file
    from hf_port import hf_port_acts
    from refgpt.oracle import golden
    monkeypatch.chdir(tmp_path)
    _, _, tokens, hf = hf_case(2, tmp_path)
    peers.save_hf_layout(hf, tmp_path / "ckpt")
    golden.write(tmp_path / "g.safetensors", golden.make(refgpt.load(tmp_path / "ckpt", tokenizer=False), tokens))
    acts = hf_port_acts(peers.as_dtype(hf, "float32"), tokens)
    save_file({"tokens": tokens, **{k: v.astype(np.float32) for k, v in acts.items() if k != "ln_final.in"}},
              str(tmp_path / "hf.safetensors"))
    args = ("compare", "g.safetensors", "hf.safetensors", "--local", "--local-model", "ckpt")
    status, out, err = refgpt_cli.in_process(*args, "--local-layer-norm", "any")
    assert status == 0, out + err
    table = out[out.index("local verdicts at"):]  # the local part, after the whole-tensor table
    assert "OK: no op introduced an error beyond its bound" in table and "blocks.0.ln1.out" in table
    status, out, err = refgpt_cli.in_process(*args)
    assert status == 0 and "blocks.0.ln1.out" not in out[out.index("local verdicts at"):], out + err
    status, _, err = refgpt_cli.in_process("compare", "g.safetensors", "hf.safetensors", "--local-layer-norm", "any")
    assert status == 2 and "--local-layer-norm and --local-kv-cache go with --local" in err
