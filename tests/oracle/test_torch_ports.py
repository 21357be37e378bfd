"""HF transformers and TransformerLens in float32, forward and backward, against refgpt's goldens.

Issue 25: torch's kernels are the other accumulation orders a correct float32 port has (vectorised
reductions, MKL/OpenBLAS matrix products, a fused softmax). Each must pass on the batches of
tests/port_cases.py: the trained embedded model on random tokens and on text, and GPT-2 small's
shape — every activation HF's ``hidden_states`` and TransformerLens's cache hold, and every gradient
(HF: ``.grad`` of the hidden states, logits and parameters; TransformerLens: its backward hooks'
``*_grad`` and its parameters' ``.grad``), under the loss over the golden's targets.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import port_cases
from random_models import save_checkpoint
from refgpt.oracle import comparison as oracle

pytestmark = pytest.mark.peer  # every test here runs an HF or TransformerLens port


def _torch():
    torch = pytest.importorskip("torch", reason="needs the 'peers' extra (torch)")
    pytest.importorskip("transformers", reason="needs the 'peers' extra (transformers)")
    torch.set_num_threads(1)
    return torch


def hf_model(model, directory):
    from transformers import GPT2LMHeadModel

    save_checkpoint(model, directory, dtype=np.float32)
    return GPT2LMHeadModel.from_pretrained(directory, attn_implementation="eager", torch_dtype="float32").eval()


def hf_forward_backward(torch, hf, x, y):
    """HF's hidden states, logits and their gradients and every parameter's, for the mean loss over y."""
    hf.zero_grad()
    ids = torch.as_tensor(x)
    out = hf(ids, output_hidden_states=True)
    for h in out.hidden_states:
        h.retain_grad()
    out.logits.retain_grad()
    V = out.logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), torch.as_tensor(y).reshape(-1))
    loss.backward()
    cand = {"tokens": x, "targets": y, "logits": out.logits.detach().numpy(), "logits.grad": out.logits.grad.numpy(),
            "loss": loss.detach().numpy()}
    cand.update({f"hidden_states.{i}": h.detach().numpy() for i, h in enumerate(out.hidden_states)})
    cand.update({f"hidden_states.{i}.grad": h.grad.numpy() for i, h in enumerate(out.hidden_states)})
    cand.update({name + ".grad": p.grad.numpy() for name, p in hf.named_parameters()})
    return cand


def tl_forward_backward(torch, tl, x, y):
    """TransformerLens's whole cache with its backward hooks' gradients and its parameters' .grad."""
    tl.zero_grad()
    cache, fwd, bwd = tl.get_caching_hooks(incl_bwd=True)
    with tl.hooks(fwd_hooks=fwd, bwd_hooks=bwd):
        logits = tl(torch.as_tensor(x))
        V = logits.shape[-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), torch.as_tensor(y).reshape(-1))
        loss.backward()
    cand = {name: value.detach().numpy() for name, value in cache.items()}
    cand.update({"tokens": x, "targets": y, "logits": logits.detach().numpy(), "loss_mean": loss.detach().numpy()})
    cand.update({name + ".grad": p.grad.numpy() for name, p in tl.named_parameters() if p.grad is not None})
    cand.pop("unembed.b_U.grad", None)  # GPT-2 has no b_U: TransformerLens's is zeros
    return cand


@pytest.mark.parametrize("name", port_cases.CASES)
def test_hf_in_float32_passes_forward_and_backward(tmp_path, name):
    torch = _torch()
    g, model, x, y = port_cases.golden_of(name)
    report = oracle.compare(g, hf_forward_backward(torch, hf_model(model, tmp_path), x, y), name_map="hf")
    assert report.tolerance["profile"] == "float32"
    assert report.ok, report.table(after_first=3)
    judged = {t.name for t in report.tensors}
    assert {"logits", "ln_final.out", "grad.logits", "grad.tied_W_E", "grad.blocks.0.attn.W_Q",
            "grad.blocks.0.hook_resid_pre", "loss_mean"} <= judged
    assert report["logits"].row.kind == "shift"


@pytest.mark.parametrize("name", [*port_cases.CASES[:2], pytest.param(port_cases.CASES[2], marks=pytest.mark.skipif(
    os.environ.get("REFGPT_CALIBRATION") != "long", reason="set REFGPT_CALIBRATION=long (HF covers this shape by default)"))])
def test_transformer_lens_in_float32_passes_forward_and_backward(tmp_path, name):
    torch = _torch()
    pytest.importorskip("transformer_lens", reason="needs the 'peers' extra (transformer_lens)")
    import peers

    g, model, x, y = port_cases.golden_of(name)
    tl = peers.tl_model_from_hf(hf_model(model, tmp_path), "float32")
    report = oracle.compare(g, tl_forward_backward(torch, tl, x, y), name_map="tl")
    assert report.ok, report.table(after_first=3)
    judged = {t.name for t in report.tensors}
    assert {"blocks.0.attn.hook_pattern", "blocks.0.ln1.hook_scale", "grad.blocks.0.attn.hook_pattern",
            "grad.blocks.0.ln2.hook_scale", "grad.blocks.0.attn.W_Q", "grad.embed.W_E", "grad.unembed.W_U",
            "grad.ln_final.w"} <= judged
    assert "grad.blocks.0.ln1.hook_scale" not in judged and any("value input's ln1" in n for n in report.notes)
