"""Gradient goldens: ∂(mean loss)/∂ every parameter, hook point, LayerNorm output and the logits.

A port that trains has a backward pass, and a backward pass goes wrong op by op like a forward
one. ``refgpt golden --backward`` adds to the golden file, computed by refgpt/backward.py in the
golden's dtype:

    loss_mean                 []       the mean cross-entropy over every position with a target
    grad.logits               [batch, pos, d_vocab]   ∂loss_mean/∂logits = (softmax − onehot)/count
    grad.<hook point>         the hook's shape         ∂loss_mean/∂ that activation
    grad.blocks.L.ln1.out …   [batch, pos, d_model]    ∂loss_mean/∂ each LayerNorm's output
    grad.<parameter>          the parameter's shape    TransformerLens names: grad.blocks.0.attn.W_Q
    grad.tied_W_E             [d_vocab, d_model]       a tied model's one matrix used twice: the sum of
                                                       grad.embed.W_E and grad.unembed.W_Uᵀ (what HF's
                                                       ``wte.weight.grad`` and llm.c's ``grads.wte`` hold)

``refgpt compare`` walks them after the forward tensors, in the order the backward pass computes
them (refgpt/oracle/name_maps.py, ``backward_key``): logits → unembedding → ln_final → the last
block … the first → the embeddings. A wrong backward of one op is therefore named at the first
gradient it computes: the gradient of its input, or of one of its parameters.

Targets. With targets None the loss is next-token prediction inside the tokens (targets [batch,
pos − 1], the last position has none: HF's convention). llm.c's files carry their own targets y
[B, T] (one per input position): pass them as ``targets`` [batch, pos], and every position counts.
"""

from __future__ import annotations

import numpy as np

from ..backward import loss_and_grads
from ..gpt2.loss import IGNORE_INDEX
from ..model import Model
from .name_maps import GRAD, forward_order


def full_targets(tokens, targets=None) -> np.ndarray:
    """Targets [batch, pos] for refgpt/backward.py: ``targets`` [batch, pos] as given, or the
    next-token ones [batch, pos − 1] padded with IGNORE_INDEX at the last position."""
    tokens = np.asarray(tokens)  # [batch, pos]
    if targets is not None and np.asarray(targets).shape == tokens.shape:
        return np.asarray(targets, dtype=np.int64)
    out = np.full(tokens.shape, IGNORE_INDEX, dtype=np.int64)  # [batch, pos]
    out[:, :-1] = tokens[:, 1:] if targets is None else np.asarray(targets)
    return out


def compute_gradients(model: Model, tokens, targets=None) -> dict[str, np.ndarray]:
    """``loss_mean`` and every ``grad.*`` tensor (module docstring), in backward order."""
    tokens, _ = model.check_tokens(tokens)  # [batch, pos]
    return gradient_tensors(model, loss_and_grads(model, tokens, full_targets(tokens, targets)))


def gradient_tensors(model: Model, g) -> dict[str, np.ndarray]:
    """``loss_mean`` and every ``grad.*`` tensor of one backward pass ``g`` (refgpt/backward.py's
    Gradients), in backward order."""
    out = {"loss_mean": np.asarray(g.loss, dtype=model.dtype), GRAD + "logits": g.logits}
    for name, a in {**g.params, **g.activations, **g.ln_out}.items():
        out[GRAD + name] = a
    if tied(model):
        out[GRAD + "tied_W_E"] = g.tied_W_E  # [d_vocab, d_model]
    return {name: out[name] for name in forward_order(out)}


def tied(model: Model) -> bool:
    """Is W_U the transpose of W_E (one matrix used twice, as in GPT-2)?"""
    p = model.params
    return bool(model.cfg.tie_word_embeddings and np.array_equal(p["unembed.W_U"], p["embed.W_E"].T))


__all__ = ["compute_gradients", "full_targets", "gradient_tensors", "tied"]
