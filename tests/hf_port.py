"""HF transformers' GPT-2 as a port for the local verdicts (refgpt/oracle/local.py), dumped as a port
author dumps it: ``hidden_states`` carry no op's inputs, so forward hooks on HF's own modules take
every op's input and output (tests/peers.py's ``hf_forward(internals=True)``: resid_pre/mid/post,
the LayerNorms' outputs, q, k, v, the pattern, z, attention's and the MLP's outputs, pre, post), the
embeddings from hooks on ``wte`` and ``wpe``, and the scores — a tensor inside
``eager_attention_forward``, no module's output — as the input of its ``softmax``, caught by a
``TorchFunctionMode`` (torch's own way to see the functions a model calls; HF's code runs as written).

torch's CPU kernels at bfloat16 and float16 (torch 2.13): the matmuls (``addmm`` of Conv1D, the
attention's ``matmul``s, lm_head) accumulate in float32 and round the result once; LayerNorm computes
its Welford moments and output in float32 (layer_norm_kernel.cpp, moments_utils.h) and rounds y once;
softmax takes max, exp and the sum in float32 and rounds p once; every other elementwise op (the
residual adds, the score's × scaling, each step of HF's gelu_new written in Python) computes in
float32 and rounds its result to the storage type. So: refgpt.reference.local.PRECISIONS["bfloat16"]
and ["float16"] (storage u, float32 accumulation), the LayerNorm judged by L16 (``layer_norm="any"``).
"""

from __future__ import annotations

import numpy as np


def hf_port_acts(hf, tokens) -> dict[str, np.ndarray]:
    """``hf`` (GPT2LMHeadModel, eager attention, any dtype) run on tokens [batch, pos] → its
    activations under TransformerLens's names, [batch, pos, …] as float64 (the values it stored)."""
    import torch
    from torch.overrides import TorchFunctionMode

    import peers

    scores = []

    class SoftmaxInputs(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.nn.functional.softmax:
                scores.append(args[0].detach().clone())
            return func(*args, **(kwargs or {}))

    embeds = {}
    handles = [hf.transformer.wte.register_forward_hook(lambda m, i, o: embeds.__setitem__("hook_embed", o)),
               hf.transformer.wpe.register_forward_hook(lambda m, i, o: embeds.__setitem__("hook_pos_embed", o))]
    try:
        with SoftmaxInputs():
            logits, _, extra = peers.hf_forward(hf, tokens, internals=True)
    finally:
        for h in handles:
            h.remove()
    batch = logits.shape[0]
    acts = {name: np.asarray(v, np.float64) for name, v in extra.items()}
    acts.update({name: np.broadcast_to(peers._np(v).astype(np.float64), (batch, *v.shape[1:])).copy()
                 for name, v in embeds.items()})
    assert len(scores) == hf.config.n_layer, len(scores)
    acts.update({f"blocks.{L}.attn.hook_attn_scores": peers._np(s).astype(np.float64) for L, s in enumerate(scores)})
    acts["logits"] = np.asarray(logits, np.float64)
    return acts
