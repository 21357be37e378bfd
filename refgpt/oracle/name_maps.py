"""Names for the same numbers: refgpt's, Hugging Face's, TransformerLens's and llm.c's.

A golden file (refgpt/oracle/golden.py) stores every activation under refgpt's hook name, which is
TransformerLens's (``blocks.3.hook_resid_mid``), plus a few tensors that are not hook points:

    tokens      [batch, pos]           the input ids
    blocks.L.ln1.out, blocks.L.ln2.out, ln_final.out
                [batch, pos, d_model]  each LayerNorm's *output*, w ⊙ normalized + b
    logits      [batch, pos, d_vocab]
    log_probs   [batch, pos, d_vocab]  log-softmax of the logits
    targets     [batch, pos − 1]       tokens[:, 1:], the next token at each position
    loss        [batch, pos − 1]       −log_probs[b, t, tokens[b, t + 1]]

Other implementations name the same numbers differently. This module turns a candidate's
tensors into refgpt's names (``to_refgpt``), and knows the order the forward pass computes them
in (``forward_key``): the oracle walks that order, because an error made at one tensor is
inherited by every tensor after it, so only the *first* tensor out of tolerance says where a
port goes wrong.

The maps:

``hf``    ``hidden_states.i`` (or one stacked ``hidden_states`` [n_layers + 1, batch, pos, d]) as
          GPT2Model returns them with ``output_hidden_states=True``: index i < n_layers is the
          residual stream *entering* block i (``blocks.i.hook_resid_pre``); the last one is
          after ln_f (``ln_final.out``), not the final residual stream. ``attentions.i`` is
          block i's pattern; ``logits`` as is; ``loss`` (HF's mean over positions) is
          ``loss_mean``.
``tl``    TransformerLens hook names are refgpt's; ``unembed.hook_in`` is ``ln_final.out`` and
          ``unembed.hook_out`` is ``logits``.
``llmc``  llm.c's ActivationTensors, stacked over layers ([L, B, …]): encoded, ln1, ln1_mean,
          ln1_rstd, qkv, atty, preatt, att, attproj, residual2, ln2, ln2_mean, ln2_rstd, fch,
          fch_gelu, fcproj, residual3, lnf, lnf_mean, lnf_rstd, logits, probs, losses. ``ln1``
          is the LayerNorm output; ``rstd`` is 1/scale; ``qkv`` [B, T, 3C] splits into q | k | v;
          ``preatt`` holds the scaled scores, and llm.c never writes its masked (future)
          entries, so they become −∞ here and are never compared; logits and probs have
          llm.c's padded vocabulary Vp and are cut to the real one; ``losses`` [B, T] uses
          targets y = the next token, so its last position (whose target refgpt never saw) is
          dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .. import hook_points
from ..errors import RefGPTError

MAPS = ("refgpt", "hf", "tl", "llmc")



def _with_ln_outputs(names):
    """Hook names in forward order, each LayerNorm's output (``ln1.out``) after its x̂."""
    return tuple(x for name in names for x in
                 ((name, name.replace("hook_normalized", "out")) if name.endswith("hook_normalized") else (name,)))


#: A block's tensors in the order its forward pass computes them.
BLOCK_ORDER = _with_ln_outputs(hook_points.BLOCK)
_BEFORE = ("tokens", *hook_points.EMBED)
_AFTER = _with_ln_outputs(hook_points.FINAL) + ("logits", "log_probs", "probs", "targets", "loss", "loss_mean")


def forward_key(name: str) -> tuple:
    """Sort key: the order in which the forward pass computes ``name``; unknown names last."""
    if name in _BEFORE:
        return (0, _BEFORE.index(name))
    layer, rest = hook_points.split(name)
    if layer is not None and rest in BLOCK_ORDER:
        return (1, layer, BLOCK_ORDER.index(rest))
    if name in _AFTER:
        return (2, _AFTER.index(name))
    return (3, name)


def forward_order(names) -> list[str]:
    return sorted(names, key=forward_key)


def layer_of(name: str) -> int | None:
    return hook_points.split(name)[0]


def axes(name: str, ndim: int) -> tuple[str, ...]:
    """What each axis of a tensor means, for naming the place an error was found."""
    labels = hook_points.axes(name)  # a hook point's; pos of scores and pattern = the query position
    if labels is None:
        if name in ("logits", "log_probs", "probs"):
            labels = ("batch", "pos", "d_vocab")
        elif name in ("tokens", "targets", "loss"):
            labels = ("batch", "pos")
        else:
            labels = ("batch", "pos", "d_model")  # hidden states, LayerNorm outputs
    return labels if len(labels) == ndim else tuple(f"axis{i}" for i in range(ndim))


@dataclass(frozen=True)
class ModelShape:
    """What a map needs to know about the reference model to split stacked tensors."""

    n_layers: int
    n_heads: int
    d_vocab: int


def to_refgpt(tensors: dict, name_map: str, shape: ModelShape) -> tuple[dict, list[str]]:
    """A candidate's tensors under refgpt's names: (tensors, notes on what was done)."""
    if name_map not in MAPS:
        raise RefGPTError(f"unknown name map {name_map!r}; choose one of {', '.join(MAPS)}")
    return {"refgpt": lambda t, s: (dict(t), []), "tl": _from_tl, "hf": _from_hf, "llmc": _from_llmc}[name_map](tensors, shape)


# ---- TransformerLens -------------------------------------------------------------------------

_TL_EXTRA = {"unembed.hook_in": "ln_final.out", "unembed.hook_out": "logits"}


def _from_tl(tensors, shape):
    return {_TL_EXTRA.get(k, k): v for k, v in tensors.items()}, []


# ---- Hugging Face ------------------------------------------------------------------------------

_HF_INDEXED = re.compile(r"(hidden_states|attentions)[._](\d+)")


def hf_hidden_state_name(i: int, n_layers: int) -> str:
    """hidden_states[i] → refgpt name: resid_pre of block i, or ln_final's output for i = n_layers."""
    if not 0 <= i <= n_layers:
        raise RefGPTError(f"hidden_states index {i} is outside 0..{n_layers} for a {n_layers}-layer model")
    return "ln_final.out" if i == n_layers else f"blocks.{i}.hook_resid_pre"


def _from_hf(tensors, shape):
    out, notes = {}, []
    for key, value in tensors.items():
        m = _HF_INDEXED.fullmatch(key)
        if key == "hidden_states":
            value = np.asarray(value)  # [n_layers + 1, batch, pos, d_model]
            if value.shape[0] != shape.n_layers + 1:
                raise RefGPTError(f"hidden_states: stacked over {value.shape[0]} entries, but the reference "
                                  f"model has {shape.n_layers} layers, so HF gives {shape.n_layers + 1}")
            for i in range(value.shape[0]):
                out[hf_hidden_state_name(i, shape.n_layers)] = value[i]  # [batch, pos, d_model]
        elif m and m.group(1) == "hidden_states":
            out[hf_hidden_state_name(int(m.group(2)), shape.n_layers)] = value
        elif m:
            out[f"blocks.{int(m.group(2))}.attn.hook_pattern"] = value  # [batch, head, pos, key_pos]
        elif key == "loss":
            out["loss_mean"] = value
            notes.append("HF's loss is the mean over positions: compared as loss_mean")
        else:
            out[key] = value
    return out, notes


# ---- llm.c ------------------------------------------------------------------------------------

#: llm.c's ActivationTensors, in its order, and what each is called here (per layer where stacked).
LLMC_ACTIVATIONS = (
    ("encoded", "blocks.0.hook_resid_pre"),
    ("ln1", "ln1.out"), ("ln1_mean", "ln1.hook_mean"), ("ln1_rstd", "ln1.hook_scale"),
    ("qkv", "attn.hook_q|k|v"), ("atty", "attn.hook_z"),
    ("preatt", "attn.hook_attn_scores"), ("att", "attn.hook_pattern"),
    ("attproj", "hook_attn_out"), ("residual2", "hook_resid_mid"),
    ("ln2", "ln2.out"), ("ln2_mean", "ln2.hook_mean"), ("ln2_rstd", "ln2.hook_scale"),
    ("fch", "mlp.hook_pre"), ("fch_gelu", "mlp.hook_post"), ("fcproj", "hook_mlp_out"),
    ("residual3", "hook_resid_post"),
    ("lnf", "ln_final.out"), ("lnf_mean", "ln_final.hook_mean"), ("lnf_rstd", "ln_final.hook_scale"),
    ("logits", "logits"), ("probs", "probs"), ("losses", "loss"),
)
_LLMC_STACKED = {k: v for k, v in LLMC_ACTIVATIONS[1:17]}


def _from_llmc(tensors, shape):
    out, notes = {}, []
    V, NH = shape.d_vocab, shape.n_heads
    for key, value in tensors.items():
        a = np.asarray(value)
        if key in _LLMC_STACKED:
            if a.shape[0] != shape.n_layers:
                raise RefGPTError(f"llm.c {key}: stacked over {a.shape[0]} layers, the reference model has {shape.n_layers}")
            for L in range(shape.n_layers):
                out.update(_llmc_layer(key, a[L], L, NH))
        elif key == "encoded":
            out["blocks.0.hook_resid_pre"] = a  # [B, T, C] = wte[x] + wpe
        elif key in ("lnf_mean", "lnf_rstd"):
            out.update(_llmc_stat("ln_final.", key[4:], a))
        elif key == "lnf":
            out["ln_final.out"] = a
        elif key in ("logits", "probs"):
            if a.shape[-1] < V:
                raise RefGPTError(f"llm.c {key}: last axis {a.shape[-1]} is smaller than the vocabulary ({V})")
            if a.shape[-1] > V:
                notes.append(f"llm.c {key}: padded vocabulary {a.shape[-1]} cut to {V}")
            out[key] = a[..., :V]  # [B, T, V]
        elif key == "losses":
            out["loss"] = a[:, :-1]  # [B, T − 1]: the last target is past refgpt's tokens
            notes.append("llm.c losses: last position dropped (its target is the token after the input)")
        else:
            out[key] = a
    return out, notes


def _llmc_layer(key, a, L, n_heads):
    b = f"blocks.{L}."
    if key.endswith(("_mean", "_rstd")):
        return _llmc_stat(b + key[:3] + ".", key[4:], a)
    if key == "qkv":
        B, T, C3 = a.shape
        q, k, v = (a[..., i * C3 // 3:(i + 1) * C3 // 3].reshape(B, T, n_heads, -1) for i in range(3))  # [B, T, head, d_head]
        return {b + "attn.hook_q": q, b + "attn.hook_k": k, b + "attn.hook_v": v}
    if key == "atty":
        return {b + "attn.hook_z": a.reshape(*a.shape[:2], n_heads, -1)}  # [B, T, head, d_head]
    if key == "preatt":
        T = a.shape[-1]
        scores = np.array(a, dtype=np.float64)  # [B, head, T, T]
        scores[..., np.triu(np.ones((T, T), dtype=bool), 1)] = -np.inf  # never written by llm.c
        return {b + "attn.hook_attn_scores": scores}
    return {b + _LLMC_STACKED[key]: a}


def _llmc_stat(prefix, which, a):
    a = np.asarray(a)[..., None]  # [B, T, 1]
    if which == "mean":
        return {prefix + "hook_mean": a}
    return {prefix + "hook_scale": 1.0 / a.astype(np.float64)}  # rstd = 1/scale
