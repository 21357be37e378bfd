"""TransformerLens's residual-stream decomposition API, computed on refgpt's cache.

Every block only adds to the residual stream, so the stream entering any layer is a sum of the
pieces written before it:

    resid_pre[L] = embed + pos_embed + Σ_{l<L} (attn_out[l] + mlp_out[l])
    attn_out[l]  = Σ_h z[l,h]·W_O[l,h] + b_O[l]          (one "result" per head)
    mlp_out[l]   = Σ_n post[l,n]·W_out[l,n] + b_out[l]    (one "result" per neuron)

TransformerLens (3.9) stacks these pieces along a new first axis; refgpt offers the same functions,
with the same names, arguments, labels and values, so nothing is new to learn:

    accumulated_resid      the stream itself at each layer ("0_pre", "0_mid", …, "final_post")
    decompose_resid        embed, pos_embed, each attn_out and mlp_out ("embed", "0_attn_out", …)
    stack_head_results     every head's result z·W_O ("L0H3"), optionally plus a "remainder"
    stack_neuron_results   every neuron's result post·W_out ("L2N17"), optionally a "remainder"
    get_full_resid_decomposition
                           heads, neurons (or mlp_outs), embed, pos_embed, and "bias": every b_O
                           and b_out summed, so the stack sums to the stream exactly
    apply_ln_to_stack      push a stack through a LayerNorm: the cached-scale view, or with
                           recompute_ln=True at the unembedding the recomputed view (ln_views.py)
    logit_attrs            a stack, through the final LayerNorm's cached scale, dotted with
                           W_U[:, token] (minus W_U[:, incorrect_token])

Each function takes the cache first; ``cache.accumulated_resid(…)`` etc. call them. ``layer`` is
in [0, n_layers], with None or -1 meaning n_layers (the unembedding); ``pos_slice`` follows
TransformerLens's Slice: None (all), an int (that position; the axis disappears), a tuple
(``slice(*tuple)``), a slice, or a list/array of positions.

What ``apply_ln`` computes is P·c/σ with σ the *cached* scale of the stream the LayerNorm really
saw, and without LayerNorm's w and b. So a stack sums, through W_U, to the logits only when w and b
have been folded into W_U and b_U (``refgpt.tl.processing.fold_ln``), and then to the logits minus
b_U; ``logit_attrs`` never attributes b_U or ln_final.b. refgpt's own ``refgpt.attribute`` does,
on any weights (docs/decomposition.md §5).

Where refgpt departs from TransformerLens 3.9, on purpose (docs/decomposition.md §5):
- the "bias" row of get_full_resid_decomposition is summed in the model's dtype; TL sums it in
  float32 even in a float64 model;
- get_full_resid_decomposition(mlp_input=True, apply_ln=True, project_output_onto=…) scales the
  neurons by ln2's scale like every other row; TL's fused path uses ln1's;
- "remainder" at layer 0 is the stream entering block 0; TL takes the final stream;
- an int neuron_slice keeps the neuron axis (one neuron); TL's concatenates along positions.
"""

from __future__ import annotations

import numpy as np

from ..gpt2 import ln_views
from ..errors import RefGPTError, need

DECOMPOSITION = "decomposition"  # who needs an activation, in the missing-activation error


class _Slice:
    """TransformerLens's Slice: which entries of one axis to keep."""

    def __init__(self, spec=None):
        if isinstance(spec, _Slice):
            self.index = spec.index
            return
        if hasattr(spec, "slice") and hasattr(spec, "mode"):  # a transformer_lens Slice
            spec = spec.slice
        if spec is None:
            self.index = slice(None)
        elif isinstance(spec, tuple):
            self.index = slice(*spec)
        elif isinstance(spec, slice):
            self.index = spec
        elif isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
            self.index = int(spec)
        elif isinstance(spec, (list, np.ndarray)) or hasattr(spec, "numpy"):
            index = np.asarray(spec)
            if index.dtype.kind not in "iu" or index.ndim != 1:
                raise RefGPTError(f"pos_slice/neuron_slice: an index list must be 1-D integers, found {spec!r}")
            self.index = index
        else:
            raise RefGPTError(f"pos_slice/neuron_slice: expected None, an int, a tuple, a slice or a "
                              f"list of indices, found {spec!r}")

    def apply(self, array, axis):
        where = [slice(None)] * array.ndim
        where[axis] = self.index
        return array[tuple(where)]


# ---- the pieces ----------------------------------------------------------------------------


def _n_layers(cache):
    return cache.model.cfg.n_layers


def _layer(cache, layer, what):
    """None or -1 → n_layers; otherwise an int in [0, n_layers]."""
    n = _n_layers(cache)
    if layer is None or (isinstance(layer, (int, np.integer)) and layer == -1):
        return n
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer <= n:
        raise RefGPTError(f"{what}: layer must be in [0, {n}] (or -1/None for the unembedding), found {layer!r}")
    return int(layer)


def _stream_into(cache, layer):
    """The residual stream entering ``layer`` (the unembedding for layer = n_layers)."""
    n = _n_layers(cache)
    return need(cache, f"blocks.{n - 1}.hook_resid_post" if layer == n else f"blocks.{layer}.hook_resid_pre", DECOMPOSITION)


def head_results(cache, layer):
    """Each head's write to the residual stream, z[h]·W_O[h]: [batch, pos, head, d_model]."""
    z = need(cache, f"blocks.{layer}.attn.hook_z", DECOMPOSITION)  # [batch, pos, head, d_head]
    W_O = cache.model.params[f"blocks.{layer}.attn.W_O"]  # [head, d_head, d_model]
    return (z[..., None, :] @ W_O)[..., 0, :]  # [batch, pos, head, d_model]


def accumulated_bias(model, layer, mlp_input=False, include_mlp_biases=True):
    """Σ b_O (and b_out, with ``include_mlp_biases``) of every block before ``layer``, plus block
    ``layer``'s b_O with ``mlp_input``: [d_model], summed in the model's dtype (TransformerLens sums
    into float32 zeros). ``model.accumulated_bias(…)`` is this function."""
    p, n = model.params, model.cfg.n_layers
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer <= n:
        raise RefGPTError(f"accumulated_bias: layer must be in [0, {n}], found {layer!r}")
    bias = np.zeros(model.cfg.d_model, model.dtype)  # [d_model]
    for i in range(layer):
        bias = bias + p[f"blocks.{i}.attn.b_O"]  # [d_model]
        if include_mlp_biases:
            bias = bias + p[f"blocks.{i}.mlp.b_out"]  # [d_model]
    if mlp_input:
        if layer >= n:
            raise RefGPTError(f"accumulated_bias: mlp_input=True needs a layer below n_layers={n}: "
                              "the unembedding has no MLP")
        bias = bias + p[f"blocks.{layer}.attn.b_O"]  # [d_model]
    return bias


def _projection(project_output_onto):
    """(project as [d_model, n_out] or None, whether to drop the n_out axis at the end)."""
    if project_output_onto is None:
        return None, False
    project = np.asarray(project_output_onto)
    if project.ndim == 1:
        return project[:, None], True  # [d_model, 1]
    return project, False  # [d_model, n_out]


# ---- LayerNorm on a stack -----------------------------------------------------------------


def _cached_scale(cache, layer, mlp_input, pos, batch=None):
    """The scale the LayerNorm into ``layer`` used: ln_final's at n_layers, else ln1's (ln2's)."""
    if layer == _n_layers(cache):
        name = "ln_final.hook_scale"
    else:
        name = f"blocks.{layer}.ln{2 if mlp_input else 1}.hook_scale"
    scale = pos.apply(need(cache, name, DECOMPOSITION), -2)  # [batch, pos, 1] (or [batch, 1])
    return scale if batch is None else batch.apply(scale, 0)


def apply_ln_to_stack(cache, residual_stack, layer=None, mlp_input=False, pos_slice=None,
                      batch_slice=None, has_batch_dim=True, recompute_ln=False):
    """Push a stack [component, batch, pos, d_model] through the LayerNorm into ``layer``.

    Default: the cached-scale view P·c/σ (no w, no b), σ that LayerNorm's cached scale; linear,
    so the rows still sum. With ``recompute_ln=True`` and layer = n_layers: the recomputed view,
    ln_final applied to each row with the row's own statistics (the logit lens). ``pos_slice``
    must already have been applied to the stack (it is applied to the scale); ``batch_slice`` is
    applied to both.
    """
    layer = _layer(cache, layer, "apply_ln_to_stack")
    stack = np.asarray(residual_stack)
    pos, batch = _Slice(pos_slice), _Slice(batch_slice)
    if has_batch_dim:
        stack = batch.apply(stack, 1)
    if recompute_ln and layer == _n_layers(cache):
        p = cache.model.params
        return ln_views.recomputed(stack, p["ln_final.w"], p["ln_final.b"], cache.model.cfg.eps)
    return ln_views.cached_scale(stack, _cached_scale(cache, layer, mlp_input, pos, batch))


# ---- TransformerLens's stacks -------------------------------------------------------------


def _returned(stack, labels, return_labels):
    return (stack, labels) if return_labels else stack


def accumulated_resid(cache, layer=None, incl_mid=False, apply_ln=False, pos_slice=None,
                      mlp_input=False, return_labels=False):
    """The residual stream at each layer up to ``layer``: "0_pre", ("0_mid",) …, "final_post".

    With apply_ln: at layer = n_layers each stream goes through ln_final with its own statistics
    (the logit lens); below that, through the cached scale of ``layer``'s ln1 (ln2 if mlp_input).
    """
    n = _n_layers(cache)
    layer = _layer(cache, layer, "accumulated_resid")
    pos = _Slice(pos_slice)
    parts, labels = [], []
    for l in range(layer + 1):
        if l == n:
            parts.append(need(cache, f"blocks.{n - 1}.hook_resid_post", DECOMPOSITION))
            labels.append("final_post")
            continue
        parts.append(need(cache, f"blocks.{l}.hook_resid_pre", DECOMPOSITION))
        labels.append(f"{l}_pre")
        if (incl_mid and l < layer) or (mlp_input and l == layer):
            parts.append(need(cache, f"blocks.{l}.hook_resid_mid", DECOMPOSITION))
            labels.append(f"{l}_mid")
    stack = np.stack([pos.apply(part, -2) for part in parts])  # [component, batch, pos, d_model]
    if apply_ln:
        stack = apply_ln_to_stack(cache, stack, layer, mlp_input=mlp_input, pos_slice=pos,
                                  recompute_ln=layer == n)
    return _returned(stack, labels, return_labels)


def decompose_resid(cache, layer=None, mlp_input=False, mode="all", apply_ln=False, pos_slice=None,
                    incl_embeds=True, return_labels=False):
    """The stream entering ``layer`` as embed, pos_embed, and each layer's attn_out and mlp_out.

    mode "attn" or "mlp" keeps only that kind of layer output; mlp_input adds ``layer``'s own
    attn_out (the stream entering its MLP). Embeddings are included only if cached (as in TL).
    """
    if mode not in ("all", "mlp", "attn"):
        raise RefGPTError(f"decompose_resid: mode must be 'all', 'mlp' or 'attn', found {mode!r}")
    layer = _layer(cache, layer, "decompose_resid")
    pos = _Slice(pos_slice)
    incl_attn, incl_mlp = mode != "mlp", mode != "attn"
    parts, labels = [], []
    if incl_embeds:
        for name, label in (("hook_embed", "embed"), ("hook_pos_embed", "pos_embed")):
            if name in cache:
                parts.append(cache[name])
                labels.append(label)
    for l in range(layer):
        if incl_attn:
            parts.append(need(cache, f"blocks.{l}.hook_attn_out", DECOMPOSITION))
            labels.append(f"{l}_attn_out")
        if incl_mlp:
            parts.append(need(cache, f"blocks.{l}.hook_mlp_out", DECOMPOSITION))
            labels.append(f"{l}_mlp_out")
    if mlp_input and incl_attn:
        if layer == _n_layers(cache):
            raise RefGPTError("decompose_resid: mlp_input=True needs a layer below n_layers: the unembedding has no MLP")
        parts.append(need(cache, f"blocks.{layer}.hook_attn_out", DECOMPOSITION))
        labels.append(f"{layer}_attn_out")
    if parts:
        stack = np.stack([pos.apply(part, -2) for part in parts])  # [component, batch, pos, d_model]
    else:
        stack = _empty(cache, pos, cache.model.cfg.d_model)
    if apply_ln:
        stack = apply_ln_to_stack(cache, stack, layer, mlp_input=mlp_input, pos_slice=pos)
    return _returned(stack, labels, return_labels)


def _empty(cache, pos, width):
    """A stack with no components: [0, batch, pos, width] (pos as ``pos`` slices it)."""
    like = pos.apply(need(cache, "ln_final.hook_scale", DECOMPOSITION), -2)  # [batch, pos, 1]
    return np.zeros((0, *like.shape[:-1], width), cache.model.dtype)


def stack_head_results(cache, layer=-1, return_labels=False, incl_remainder=False, pos_slice=None,
                       apply_ln=False):
    """Every head's result z·W_O in the layers before ``layer``, labelled "L{l}H{h}".

    incl_remainder adds "remainder": the stream entering ``layer`` minus all the heads (so the
    stack sums to that stream).
    """
    layer = _layer(cache, layer, "stack_head_results")
    pos = _Slice(pos_slice)
    n_heads = cache.model.cfg.n_heads
    labels = [f"L{l}H{h}" for l in range(layer) for h in range(n_heads)]
    if layer:
        per_layer = [pos.apply(head_results(cache, l), -3) for l in range(layer)]  # [batch, pos, head, d_model] each
        stack = np.moveaxis(np.concatenate(per_layer, axis=-2), -2, 0)  # [layer·head, batch, pos, d_model]
    else:
        stack = _empty(cache, pos, cache.model.cfg.d_model)
    if incl_remainder:
        remainder = pos.apply(_stream_into(cache, layer), -2) - stack.sum(0)  # [batch, pos, d_model]
        stack = np.concatenate([stack, remainder[None]])
        labels.append("remainder")
    if apply_ln:
        stack = apply_ln_to_stack(cache, stack, layer, pos_slice=pos)
    return _returned(stack, labels, return_labels)


def _neuron_stack(cache, layer, pos, neurons, project, ln_mlp_input=None):
    """Every neuron's result in the layers before ``layer``: [layer·neuron, batch, pos, width].

    Without ``project``: post[n]·W_out[n] (width d_model). With ``project`` [d_model, n_out]:
    (post[n]·W_out[n])·project, computed as post[n]·(W_out[n]·project) so no [neuron, d_model]
    array is formed per position. With ln_mlp_input not None: through the cached scale of the
    LayerNorm into ``layer`` first, P(post[n]·W_out[n])/σ·project = post[n]/σ·(P·W_out[n])·project.
    """
    p = cache.model.params
    width = cache.model.cfg.d_model if project is None else project.shape[1]
    if not layer:
        return _empty(cache, pos, width)
    scale = None if ln_mlp_input is None else _cached_scale(cache, layer, ln_mlp_input, pos)  # [batch, pos, 1]
    per_layer = []
    for l in range(layer):
        post = neurons.apply(pos.apply(need(cache, f"blocks.{l}.mlp.hook_post", DECOMPOSITION), -2), -1)  # [batch, pos, neuron]
        W_out = neurons.apply(p[f"blocks.{l}.mlp.W_out"], 0)  # [neuron, d_model]
        if scale is not None:
            W_out = W_out - W_out.mean(-1, keepdims=True)  # [neuron, d_model], P applied to each row
            post = post / scale  # [batch, pos, neuron]
        out = W_out if project is None else W_out @ project  # [neuron, width]
        per_layer.append(post[..., None] * out)  # [batch, pos, neuron, width]
    return np.moveaxis(np.concatenate(per_layer, axis=-2), -2, 0)  # [layer·neuron, batch, pos, width]


def stack_neuron_results(cache, layer, pos_slice=None, neuron_slice=None, return_labels=False,
                         incl_remainder=False, apply_ln=False, project_output_onto=None):
    """Every neuron's result post·W_out in the layers before ``layer``, labelled "L{l}N{n}".

    ``project_output_onto`` ([d_model] or [d_model, n_out]) replaces each result by its projection,
    computed without forming [neuron, d_model] per position. incl_remainder adds "remainder".
    """
    layer = _layer(cache, layer, "stack_neuron_results")
    pos = _Slice(pos_slice)
    if isinstance(neuron_slice, (int, np.integer)) and not isinstance(neuron_slice, bool):
        neuron_slice = [int(neuron_slice)]  # keep the neuron axis (see the module docstring)
    neurons = _Slice(neuron_slice)
    project, squeeze = _projection(project_output_onto)
    ids = neurons.apply(np.arange(cache.model.cfg.d_mlp), 0)
    labels = [f"L{l}N{int(i)}" for l in range(layer) for i in ids]
    fused = apply_ln and project is not None
    stack = _neuron_stack(cache, layer, pos, neurons, project, ln_mlp_input=False if fused else None)
    if incl_remainder:
        stream = pos.apply(_stream_into(cache, layer), -2)  # [batch, pos, d_model]
        if fused:
            stream = apply_ln_to_stack(cache, stream[None], layer, pos_slice=pos)[0]  # [batch, pos, d_model]
        if project is not None:
            stream = stream @ project  # [batch, pos, n_out]
        stack = np.concatenate([stack, (stream - stack.sum(0))[None]])
        labels.append("remainder")
    if apply_ln and not fused:
        stack = apply_ln_to_stack(cache, stack, layer, pos_slice=pos)
    if squeeze:
        stack = stack[..., 0]
    return _returned(stack, labels, return_labels)


def get_full_resid_decomposition(cache, layer=None, mlp_input=False, expand_neurons=True, apply_ln=False,
                                 pos_slice=None, return_labels=False, project_output_onto=None):
    """The stream entering ``layer`` as every head, every neuron (or mlp_out), embed, pos_embed and
    "bias" (Σ b_O, and Σ b_out when neurons are expanded). The rows sum to the stream exactly."""
    n = _n_layers(cache)
    layer = _layer(cache, layer, "get_full_resid_decomposition")
    if mlp_input and layer == n:
        raise RefGPTError("get_full_resid_decomposition: mlp_input=True needs a layer below n_layers")
    pos = _Slice(pos_slice)
    project, squeeze = _projection(project_output_onto)
    fused = apply_ln and project is not None  # LN, then project, row by row

    def finish(stack):
        if fused:
            stack = apply_ln_to_stack(cache, stack, layer, pos_slice=pos, mlp_input=mlp_input)
        return stack if project is None else stack @ project

    heads, labels = stack_head_results(cache, layer + int(mlp_input), pos_slice=pos, return_labels=True)
    parts = [finish(heads)]
    if layer > 0:
        if expand_neurons:
            neurons = _Slice(None)
            parts.append(_neuron_stack(cache, layer, pos, neurons, project, ln_mlp_input=mlp_input if fused else None))
            labels += [f"L{l}N{i}" for l in range(layer) for i in range(cache.model.cfg.d_mlp)]
        else:
            mlps, mlp_labels = decompose_resid(cache, layer, pos_slice=pos, incl_embeds=False, mode="mlp",
                                               return_labels=True)
            parts.append(finish(mlps))
            labels += mlp_labels
    for name, label in (("hook_embed", "embed"), ("hook_pos_embed", "pos_embed")):
        if name in cache:
            parts.append(finish(pos.apply(cache[name], -2)[None]))
            labels.append(label)
    bias = accumulated_bias(cache.model, layer, mlp_input, include_mlp_biases=expand_neurons)  # [d_model]
    stream_shape = heads.shape[1:-1]  # (batch, pos) as pos_slice leaves them
    parts.append(finish(np.broadcast_to(bias, (1, *stream_shape, bias.shape[0]))))
    labels.append("bias")
    stack = np.concatenate(parts)  # [component, batch, pos, d_model or n_out]
    if apply_ln and not fused:
        stack = apply_ln_to_stack(cache, stack, layer, pos_slice=pos, mlp_input=mlp_input)
    if squeeze:
        stack = stack[..., 0]
    return _returned(stack, labels, return_labels)


# ---- logit attribution --------------------------------------------------------------------


def token_id(model, token, what="token") -> int:
    """One token id from an int or a string that the model's tokenizer encodes as exactly one token."""
    if isinstance(token, str):
        if model.tokenizer is None:
            raise RefGPTError(f"{what}: {token!r} is text, but this model has no tokenizer; give a token id")
        ids = model.tokenizer.encode(token, allowed_special="all")
        if len(ids) != 1:
            raise RefGPTError(f"{what}: {token!r} is {len(ids)} tokens {ids}, not exactly one")
        return ids[0]
    ids = token_ids(model, token, what)
    if ids.size != 1:
        raise RefGPTError(f"{what}: expected one token, found {ids.size} ({token!r})")
    return int(ids.reshape(-1)[0])


def token_ids(model, tokens, what="tokens") -> np.ndarray:
    """Integer token ids (any shape), checked against the vocabulary."""
    if isinstance(tokens, str):
        return np.asarray(token_id(model, tokens, what))
    ids = np.asarray(tokens)
    if ids.dtype == bool or ids.dtype.kind not in "iu":
        raise RefGPTError(f"{what}: token ids must be integers, found {ids.dtype} ({tokens!r})")
    bad = (ids < 0) | (ids >= model.cfg.d_vocab)
    if bad.any():
        raise RefGPTError(f"{what}: id {int(ids[bad].flat[0])} is outside the vocabulary [0, {model.cfg.d_vocab})")
    return ids.astype(np.int64)


def residual_directions(model, tokens):
    """W_U[:, token]: [d_model] for one token, [..., d_model] for several (TL's
    ``tokens_to_residual_directions``)."""
    W_U = model.params["unembed.W_U"]  # [d_model, d_vocab]
    ids = token_ids(model, tokens)
    if ids.size > 1:
        return np.moveaxis(W_U[:, ids], 0, -1)  # [..., d_model]
    return W_U[:, int(ids.reshape(-1)[0])]  # [d_model]


def logit_attrs(cache, residual_stack, tokens, incorrect_tokens=None, pos_slice=None, batch_slice=None,
                has_batch_dim=True):
    """Each row of the stack, through ln_final's cached scale (no w, no b), dotted with W_U[:, tokens]
    (minus W_U[:, incorrect_tokens]): [component, batch, pos]. Neither b_U nor ln_final.b appears."""
    model = cache.model
    directions = residual_directions(model, tokens)  # [d_model] or [..., d_model]
    if incorrect_tokens is not None:
        shape, wrong_shape = np.shape(token_ids(model, tokens)), np.shape(token_ids(model, incorrect_tokens))
        if shape != wrong_shape:
            raise RefGPTError(f"logit_attrs: tokens and incorrect_tokens must have the same shape, "
                              f"found {list(shape)} and {list(wrong_shape)}")
        directions = directions - residual_directions(model, incorrect_tokens)
    scaled = apply_ln_to_stack(cache, residual_stack, -1, pos_slice=pos_slice, batch_slice=batch_slice,
                               has_batch_dim=has_batch_dim)  # [component, batch, pos, d_model]
    return (scaled * directions).sum(-1)  # [component, batch, pos]
