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
          targets y = the next token, so against a golden made without llm.c's targets its last
          position (whose target that golden never saw) is dropped. ``residual3`` of block L is
          also ``blocks.{L+1}.hook_resid_pre``. Gradients (``grads.*``, ``grads_acts.*``):
          refgpt/oracle/llmc_dump.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..tl import hook_points
from ..errors import RefGPTError
from ..reference import compare as _reference_compare

MAPS = ("refgpt", "hf", "tl", "llmc")


def _with_ln_outputs(names):
    """Hook names in forward order, each LayerNorm's output (``ln1.out``) after its x̂."""
    return tuple(x for name in names for x in
                 ((name, name.replace("hook_normalized", "out")) if name.endswith("hook_normalized") else (name,)))


def _with_cache(names):
    """A block's names with the KV cache after the step (``attn.cache_k``, ``attn.cache_v``, decode
    goldens) right after the values: what a cached step stores before it attends."""
    return tuple(x for name in names for x in ((name, "attn.cache_k", "attn.cache_v") if name == "attn.hook_v" else (name,)))


#: A block's tensors in the order its forward pass computes them.
BLOCK_ORDER = _with_cache(_with_ln_outputs(hook_points.BLOCK))
_BEFORE = ("tokens", "attention_mask", "position_ids", *hook_points.EMBED)
_AFTER = _with_ln_outputs(hook_points.FINAL) + ("logits", "log_probs", "probs", "next_logits", "chosen", "targets",
                                                "loss", "loss_mean")

#: A decode golden's tensors of step S (refgpt/oracle/decode.py): ``step.S.`` + a golden name.
STEP = re.compile(r"step\.(\d+)\.(.+)")


def split_step(name: str) -> tuple[int | None, str]:
    """``step.3.blocks.0.hook_pos_embed`` → (3, ``blocks.0.hook_pos_embed``); any other name → (None, name)."""
    m = STEP.fullmatch(name)
    return (int(m.group(1)), m.group(2)) if m else (None, name)


def inner_name(name: str) -> str:
    """The golden name inside a decode step's name (the name itself outside decode goldens)."""
    return split_step(name)[1]

#: Gradients in a golden file: ``grad.`` + the name of what was differentiated (a hook point,
#: a LayerNorm's ``….out``, ``logits``, or a parameter's TransformerLens name), ∂(mean loss)/∂ it.
GRAD = _reference_compare.GRAD  # one home: refgpt/reference/compare.py, whose rule reads it too

#: A block's gradients in the order its backward pass computes them: an op's output gradient,
#: then its parameters' gradients, then the gradient of its input (which is the previous op's
#: output). A wrong backward of one op is first seen at the entry right after its output's.
BLOCK_BACKWARD_ORDER = (
    ["hook_resid_post", "hook_mlp_out", "mlp.W_out", "mlp.b_out", "mlp.hook_post", "mlp.hook_pre",
     "mlp.W_in", "mlp.b_in", "ln2.out", "ln2.w", "ln2.b", "ln2.hook_normalized", "ln2.hook_scale",
     "ln2.hook_mean", "hook_resid_mid", "hook_attn_out", "attn.W_O", "attn.b_O", "attn.hook_z",
     "attn.hook_v", "attn.hook_pattern", "attn.hook_attn_scores", "attn.hook_q", "attn.hook_k"]
    + [f"attn.{w}_{x}" for x in "QKV" for w in ("W", "b")]
    + ["ln1.out", "ln1.w", "ln1.b", "ln1.hook_normalized", "ln1.hook_scale", "ln1.hook_mean",
       "hook_resid_pre"]
)
_GRAD_HEAD = ("logits", "unembed.W_U", "unembed.b_U", "ln_final.out", "ln_final.w", "ln_final.b",
              "ln_final.hook_normalized", "ln_final.hook_scale", "ln_final.hook_mean")
_GRAD_TAIL = ("hook_embed", "hook_pos_embed", "embed.W_E", "pos_embed.W_pos", "tied_W_E")


def backward_key(name: str) -> tuple:
    """Sort key of a gradient's target ``name`` (without ``grad.``): the order in which the
    backward pass computes ∂loss/∂ it, from the logits back to the embeddings."""
    if name in _GRAD_HEAD:
        return (0, _GRAD_HEAD.index(name))
    layer, rest = hook_points.split(name)
    if layer is not None and rest in BLOCK_BACKWARD_ORDER:
        return (1, -layer, BLOCK_BACKWARD_ORDER.index(rest))
    if name in _GRAD_TAIL:
        return (2, _GRAD_TAIL.index(name))
    return (3, name)


is_gradient = _reference_compare.is_gradient


#: Within a block: which op's backward computes the gradient of each tensor.
_BLOCK_BACKWARD_OP = {
    "mlp.W_out": "the MLP's output projection (W_out)", "mlp.b_out": "the MLP's output projection (W_out)",
    "mlp.hook_post": "the MLP's output projection (W_out)", "mlp.hook_pre": "the activation (GELU)",
    "mlp.W_in": "the MLP's input projection (W_in)", "mlp.b_in": "the MLP's input projection (W_in)",
    "ln2.out": "the MLP's input projection (W_in)", "hook_resid_mid": "ln2 (its ∂input, plus the residual)",
    "hook_attn_out": "ln2 (its ∂input, plus the residual)", "attn.W_O": "attention's output projection (W_O)",
    "attn.b_O": "attention's output projection (W_O)", "attn.hook_z": "attention's output projection (W_O)",
    "attn.hook_v": "z = pattern·v", "attn.hook_pattern": "z = pattern·v", "attn.hook_attn_scores": "the softmax",
    "attn.hook_q": "the scores q·kᵀ·scale", "attn.hook_k": "the scores q·kᵀ·scale",
    "ln1.out": "the Q/K/V projections", "hook_resid_pre": "ln1 (its ∂input, plus the residual)",
    **{f"attn.{w}_{x}": "the Q/K/V projections" for x in "QKV" for w in "Wb"},
    **{f"ln{n}.{h}": f"ln{n}'s affine part (w ⊙ x̂ + b)" for n in (1, 2) for h in ("w", "b", "hook_normalized")},
    **{f"ln{n}.{h}": f"ln{n}'s normalization" for n in (1, 2) for h in ("hook_scale", "hook_mean")},
}


def backward_op(name: str, n_layers: int | None = None) -> str | None:
    """The op whose backward computes gradient ``name`` ("grad.…"): where to look when it is the
    first gradient out of tolerance. None for a name that is not a known gradient."""
    if not name.startswith(GRAD):
        return None
    name = name[len(GRAD):]
    fixed = {"logits": "the loss (softmax cross-entropy)", "unembed.W_U": "the unembedding",
             "unembed.b_U": "the unembedding", "ln_final.out": "the unembedding",
             "ln_final.w": "ln_final's affine part", "ln_final.b": "ln_final's affine part",
             "ln_final.hook_normalized": "ln_final's affine part", "ln_final.hook_scale": "ln_final's normalization",
             "ln_final.hook_mean": "ln_final's normalization", "embed.W_E": "the token embedding (a scatter-add)",
             "pos_embed.W_pos": "the position embedding (a sum over the batch)",
             "tied_W_E": "the embedding and the unembedding (their sum)"}
    if name in fixed:
        return fixed[name]
    if name in ("hook_embed", "hook_pos_embed"):
        return "blocks.0.ln1 (its ∂input, plus the residual)"
    layer, rest = hook_points.split(name)
    if layer is None:
        return None
    if rest in ("hook_resid_post", "hook_mlp_out"):
        last = n_layers is not None and layer == n_layers - 1
        return "ln_final (its ∂input)" if last else f"blocks.{layer + 1}.ln1 (its ∂input, plus the residual)"
    op = _BLOCK_BACKWARD_OP.get(rest)
    return f"blocks.{layer}: {op}" if op else None


def forward_key(name: str) -> tuple:
    """Sort key: the order in which the forward pass computes ``name``, then every gradient in the
    order the backward pass computes it (``backward_key``); unknown names last within each."""
    step, inner = split_step(name)
    if step is not None:
        return (4, step, *forward_key(inner))
    if name.startswith(GRAD):
        return (5, *backward_key(name[len(GRAD):]))
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
    name = inner_name(name)
    return hook_points.split(name[len(GRAD):] if name.startswith(GRAD) else name)[0]


def axes(name: str, ndim: int) -> tuple[str, ...]:
    """What each axis of a tensor means, for naming the place an error was found."""
    name = inner_name(name)
    if name.endswith(("attn.cache_k", "attn.cache_v")):
        labels = hook_points.HEADS  # [batch, pos, head, d_head]: pos is the key's position
        return labels if len(labels) == ndim else tuple(f"axis{i}" for i in range(ndim))
    if name.startswith(GRAD):
        name = name[len(GRAD):]
        last = name.rsplit(".", 1)[-1]
        param = _PARAM_AXES.get(last) if not last.startswith(("hook_", "out")) else None
        if param is not None:
            return param if len(param) == ndim else tuple(f"axis{i}" for i in range(ndim))
    labels = hook_points.axes(name)  # a hook point's; pos of scores and pattern = the query position
    if labels is None:
        if name in ("logits", "log_probs", "probs"):
            labels = ("batch", "pos", "d_vocab")
        elif name in ("tokens", "targets", "loss", "attention_mask", "position_ids"):
            labels = ("batch", "pos")
        elif name == "next_logits":
            labels = ("batch", "d_vocab")
        elif name == "chosen":
            labels = ("batch",)
        else:
            labels = ("batch", "pos", "d_model")  # hidden states, LayerNorm outputs
    return labels if len(labels) == ndim else tuple(f"axis{i}" for i in range(ndim))


_PARAM_AXES = {"W_E": ("token", "d_model"), "tied_W_E": ("token", "d_model"), "W_pos": ("pos", "d_model"),
               "W_U": ("d_model", "token"), "b_U": ("token",), "w": ("d_model",), "b": ("d_model",),
               "W_Q": ("head", "d_model", "d_head"), "W_K": ("head", "d_model", "d_head"),
               "W_V": ("head", "d_model", "d_head"), "b_Q": ("head", "d_head"), "b_K": ("head", "d_head"),
               "b_V": ("head", "d_head"), "W_O": ("head", "d_head", "d_model"), "b_O": ("d_model",),
               "W_in": ("d_model", "d_mlp"), "b_in": ("d_mlp",), "W_out": ("d_mlp", "d_model"),
               "b_out": ("d_model",)}


@dataclass(frozen=True)
class ModelShape:
    """What a map needs to know about the reference model to split stacked tensors."""

    n_layers: int
    n_heads: int
    d_vocab: int
    config: object = None  # the reference's Config, when known: needed to map parameter gradients


def to_refgpt(tensors: dict, name_map: str, shape: ModelShape) -> tuple[dict, list[str]]:
    """A candidate's tensors under refgpt's names: (tensors, notes on what was done)."""
    if name_map not in MAPS:
        raise RefGPTError(f"unknown name map {name_map!r}; choose one of {', '.join(MAPS)}")
    return {"refgpt": lambda t, s: (dict(t), []), "tl": _from_tl, "hf": _from_hf, "llmc": _from_llmc}[name_map](tensors, shape)


# ---- decode goldens (refgpt/oracle/decode.py) -------------------------------------------------------

_HF_STEP = re.compile(r"(hidden_states|attentions)\.(\d+)\.(\d+)")
_HF_STEP_LOGITS = re.compile(r"(?:logits|scores)\.(\d+)")
_HF_CACHE = re.compile(r"past_key_values\.(?:(\d+)\.)?(\d+)\.(key|value)")


def decode_to_refgpt(tensors: dict, name_map: str, shape: ModelShape, last_step: int) -> tuple[dict, list[str]]:
    """A decode candidate's tensors under a decode golden's names (``step.S.…``): (tensors, notes).

    ``refgpt``: the golden's names. ``tl``: ``step.S.`` + TransformerLens names (a run_with_cache per step).
    ``hf``: what ``generate(…, output_hidden_states=True, output_attentions=True, output_logits=True,
    return_dict_in_generate=True)`` returns, flattened — ``sequences`` [batch, prompt + N] (the tokens),
    ``hidden_states.S.i`` (step S's hidden_states[i]: block i's resid_pre, i = n_layers: after ln_f),
    ``attentions.S.i`` (block i's pattern), ``logits.S`` (or ``scores.S``: [batch, d_vocab], the logits
    that choose step S's token), and ``past_key_values.L.key`` / ``.value`` ([batch, head, pos, d_head],
    the cache after the last step) or ``past_key_values.S.L.key`` (after step S, for a loop that keeps
    each step's)."""
    if name_map not in MAPS:
        raise RefGPTError(f"unknown name map {name_map!r}; choose one of {', '.join(MAPS)}")
    if name_map == "refgpt":
        return dict(tensors), []
    if name_map == "tl":
        out, notes = {}, []
        by_step: dict = {}
        for k, v in tensors.items():
            step, inner = split_step(k)
            by_step.setdefault(step, {})[inner] = v
        for step, t in by_step.items():
            mapped, more = _from_tl(t, shape)
            notes += [n for n in more if n not in notes]
            out.update({(f"step.{step}.{k}" if step is not None else k): a for k, a in mapped.items()})
        return out, notes
    if name_map == "llmc":
        raise RefGPTError("llm.c per-step dumps are a directory of raw acts_memory dumps (step0.bin, step1.bin, …): "
                          "give the directory as the candidate")
    out, notes = {}, []
    for key, value in tensors.items():
        m, logits, cache = _HF_STEP.fullmatch(key), _HF_STEP_LOGITS.fullmatch(key), _HF_CACHE.fullmatch(key)
        if key == "sequences":
            out["tokens"] = value
        elif m and m.group(1) == "hidden_states":
            out[f"step.{m.group(2)}.{hf_hidden_state_name(int(m.group(3)), shape.n_layers)}"] = value
        elif m:
            out[f"step.{m.group(2)}.blocks.{int(m.group(3))}.attn.hook_pattern"] = value  # [batch, head, new, keys]
        elif logits:
            out[f"step.{logits.group(1)}.next_logits"] = value  # [batch, d_vocab]
        elif cache:
            step = int(cache.group(1)) if cache.group(1) is not None else last_step
            which = "cache_k" if cache.group(3) == "key" else "cache_v"
            out[f"step.{step}.blocks.{int(cache.group(2))}.attn.{which}"] = np.swapaxes(np.asarray(value), 1, 2)
        else:
            out[key] = value
    if any(_HF_CACHE.fullmatch(k) for k in tensors):
        notes.append("HF's past_key_values [batch, head, pos, d_head] compared as [batch, pos, head, d_head]")
    return out, notes


# ---- TransformerLens -------------------------------------------------------------------------

_TL_EXTRA = {"unembed.hook_in": "ln_final.out", "unembed.hook_out": "logits"}


#: TransformerLens runs ln1 once per query, key and value input (docs/transformerlens.md §2.21); the
#: cache keeps the last call's backward gradient, the value path's alone, not the LayerNorm's.
_TL_LN1_GRAD = re.compile(r"blocks\.\d+\.ln1\.hook_(normalized|scale|mean)_grad")


def _from_tl(tensors, shape):
    out, notes = {}, []
    dropped = sorted(k for k in tensors if _TL_LN1_GRAD.fullmatch(k))
    if dropped:
        notes.append(f"TransformerLens's ln1 gradients ({dropped[0]}, …) are the value input's ln1 call's alone "
                     f"(ln1 runs once per query, key and value input): not compared")
    for k, v in tensors.items():
        if k in dropped:
            continue
        if k.endswith("_grad"):  # TL's run_with_cache(incl_bwd=True): "blocks.0.hook_resid_pre_grad"
            out[GRAD + _TL_EXTRA.get(k[: -len("_grad")], k[: -len("_grad")])] = v
        elif k.endswith(".grad"):  # a parameter's .grad under its TL name: "blocks.0.attn.W_Q.grad"
            out[GRAD + k[: -len(".grad")]] = v
        else:
            out[_TL_EXTRA.get(k, k)] = v
    return out, notes


# ---- Hugging Face ------------------------------------------------------------------------------

_HF_INDEXED = re.compile(r"(hidden_states|attentions)[._](\d+)")


def hf_hidden_state_name(i: int, n_layers: int) -> str:
    """hidden_states[i] → refgpt name: resid_pre of block i, or ln_final's output for i = n_layers."""
    if not 0 <= i <= n_layers:
        raise RefGPTError(f"hidden_states index {i} is outside 0..{n_layers} for a {n_layers}-layer model")
    return "ln_final.out" if i == n_layers else f"blocks.{i}.hook_resid_pre"


def _from_hf(tensors, shape):
    out, notes = {}, []
    grads = {k[: -len(".grad")]: v for k, v in tensors.items() if k.endswith(".grad")}
    tensors = {k: v for k, v in tensors.items() if not k.endswith(".grad")}
    if grads:
        out.update(_hf_gradients(grads, shape))
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


def _hf_gradients(grads, shape):
    """torch ``.grad`` of HF parameters (``transformer.h.0.attn.c_attn.weight.grad``), of
    ``hidden_states.i`` (after ``retain_grad()``) and of ``logits`` → ``grad.*``."""
    from ..files.checkpoint import to_circuits

    out, params = {}, {}
    for key, value in grads.items():
        m = _HF_INDEXED.fullmatch(key)
        if key == "logits":
            out[GRAD + "logits"] = value
        elif m and m.group(1) == "hidden_states":
            out[GRAD + hf_hidden_state_name(int(m.group(2)), shape.n_layers)] = value
        else:
            params[key.removeprefix("transformer.")] = np.asarray(value)
    if not params:
        return out
    cfg = shape.config
    if cfg is None:
        raise RefGPTError("HF parameter gradients need a refgpt golden file as the reference (its config "
                          "says how to split c_attn into heads)")
    try:
        p = to_circuits(params, cfg)
    except KeyError as missing:
        raise RefGPTError(f"HF parameter gradients: {missing.args[0]}.grad is missing; give every "
                          f"parameter's .grad (or none)") from None
    if cfg.tie_word_embeddings and "lm_head.weight" not in params:
        out[GRAD + "tied_W_E"] = p.pop("embed.W_E")  # wte.grad: the one matrix's two uses summed
        p.pop("unembed.W_U")
    out.update({GRAD + k: v for k, v in p.items()})
    return out


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
                out.update(_llmc_layer(key, a[L], L, NH, shape.n_layers))
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
            out["loss"] = a  # [B, T]; against a golden without llm.c's targets, compare drops the last position
        else:
            out[key] = a
    return out, notes


def _llmc_layer(key, a, L, n_heads, n_layers):
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
    if key == "residual3" and L + 1 < n_layers:  # block L's output is block L + 1's input
        return {b + "hook_resid_post": a, f"blocks.{L + 1}.hook_resid_pre": a}
    return {b + _LLMC_STACKED[key]: a}


def _llmc_stat(prefix, which, a):
    a = np.asarray(a)[..., None]  # [B, T, 1]
    if which == "mean":
        return {prefix + "hook_mean": a}
    with np.errstate(divide="ignore"):  # a port's rstd of 0 is an infinite scale: infinitely wrong, and said so
        return {prefix + "hook_scale": 1.0 / a.astype(np.float64)}  # rstd = 1/scale
