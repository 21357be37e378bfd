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


def hf_port_acts(hf, tokens, **call) -> dict[str, np.ndarray]:
    """``hf`` (GPT2LMHeadModel, eager attention, any dtype) run on tokens [batch, pos] → its
    activations under TransformerLens's names, [batch, pos, …] as float64 (the values it stored).
    ``call``: more of the model's arguments (a padded batch's ``attention_mask`` and ``position_ids``,
    a decode step's ``cache``)."""
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
            logits, _, extra = peers.hf_forward(hf, tokens, internals=True, **call)
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


def hf_position_ids(mask):
    """The position ids HF's ``generate`` gives a padded batch (``attention_mask`` [batch, pos], 1 real,
    0 pad): each row's real tokens before it, a pad's 0 (transformers 5's
    ``GenerationMixin._prepare_position_ids_for_generation``: cumsum − 1, masked_fill)."""
    import torch

    mask = torch.as_tensor(np.asarray(mask), dtype=torch.long)
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # [batch, pos]


def hf_decode_acts(hf, prompt, continuation, attention_mask=None, plant=None) -> dict[str, np.ndarray]:
    """HF's own decode loop, as its users write it, forced along ``continuation`` [batch, steps] (a
    decode golden's chosen tokens): the prompt [batch, P] in one pass, then one token a step, each pass
    given the DynamicCache (``cache``, HF 5's name for ``past_key_values``), the attention mask grown
    by one real position a step and the position ids as ``generate`` computes them; every step dumped
    by ``hf_port_acts`` under refgpt/oracle/decode.py's names: ``step.S.<hook point>``, what the step
    fed (``step.S.tokens``, ``step.S.position_ids``) and its KV cache after the step,
    ``step.S.blocks.L.attn.cache_k``/``cache_v`` [batch, keys, head, d_head] (HF holds [batch, head,
    keys, d_head]). ``plant(S, call)``, if given, may change step S's arguments before it runs (its
    ``cache``, ``attention_mask``, ``position_ids``): a bug in the loop."""
    import torch
    from transformers import DynamicCache

    import peers

    prompt, continuation = np.asarray(prompt), np.asarray(continuation)
    batch, P = prompt.shape
    mask = torch.ones((batch, P), dtype=torch.long) if attention_mask is None else torch.as_tensor(
        np.asarray(attention_mask), dtype=torch.long)  # [batch, P]
    positions = hf_position_ids(mask)  # [batch, P]
    cache, feed, out = DynamicCache(config=hf.config), prompt, {}
    for S in range(continuation.shape[1]):
        call = {"cache": cache, "attention_mask": mask, "position_ids": positions, "use_cache": True}
        if plant is not None:
            plant(S, call)
        acts = hf_port_acts(hf, feed, **call)
        del acts["ln_final.in"]  # ln_final's input is the last block's resid_post, dumped as such
        acts["tokens"], acts["position_ids"] = feed, peers._np(call["position_ids"])
        for L, layer in enumerate(cache.layers):
            acts[f"blocks.{L}.attn.cache_k"] = peers._np(layer.keys.transpose(1, 2)).astype(np.float64)
            acts[f"blocks.{L}.attn.cache_v"] = peers._np(layer.values.transpose(1, 2)).astype(np.float64)
        out.update({f"step.{S}.{name}": np.ascontiguousarray(a) for name, a in acts.items()})  # as a file holds them
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], -1)  # [batch, keys + 1]
        positions = positions[:, -1:] + 1  # [batch, 1]
        feed = continuation[:, S:S + 1]  # [batch, 1]
    return out


def hf_of(model, directory, dtype="float32"):
    """``model`` (a refgpt Model) as HF loads it: saved in HF's layout as a float32 checkpoint in
    ``directory``, read by ``GPT2LMHeadModel.from_pretrained`` (eager attention) in ``dtype``."""
    import warnings

    from transformers import GPT2LMHeadModel

    import peers
    from random_models import save_checkpoint
    save_checkpoint(model, directory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = GPT2LMHeadModel.from_pretrained(str(directory), dtype=peers.torch_dtype(dtype),
                                             attn_implementation="eager")
    return hf.eval()
