"""Interventions: edits to a forward pass, built from hooks — steering, injection, its limit, patching.

An intervention is a list of hooks ``[(hook_name, fn), …]`` with a name for what it does. It is
used either way the core takes hooks:

    logits = model.run_with_hooks(tokens, fwd_hooks=intervention)     # one forward pass
    with intervention:                                                # every pass inside
        logits, cache = model.run_with_cache(tokens)

Four are built here.

**Activation addition (ActAdd).** Run two prompts, take the residual stream entering block L of
each, and subtract: v = c·(resid_pre_L(plus) − resid_pre_L(minus)), one row per position. Added
to the front positions of another prompt's stream at the same layer, v *steers* what the model
says (Turner et al., "Activation Addition: Steering Language Models Without Optimization",
2023). If the prompts differ in length, the shorter is padded on the right with the space token,
as the ActAdd authors do. Position 0 is usually ``<|endoftext|>`` in both prompts, so the first
row of v is exactly zero.

**Vector injection.** ``add_vector`` adds c·v at chosen positions of ``blocks.L.hook_resid_pre``.
A huge c is often harmless: every block reads the stream through LayerNorm, which forgets scale
(docs/layernorm.md §4–§5, docs/steering.md).

**The limit k → ∞.** ``injection_limit`` is what ``add_vector`` tends to as the coefficient grows:
the normalized LayerNorm values at the injected position, from the injection layer on, replaced
by the direction's limit √n·Pd/‖Pd‖ (docs/steering.md §5).

**Activation patching.** ``patch`` overwrites activations at chosen hook points and positions
with the values another run cached — the basic experiment of causal tracing.

**Under generation.** Each intervention is made for positions of a prompt, and edits them in
the pass that computes them, once: with a KV cache (``model.generate`` inside ``with
intervention:``) that is the pass over the prompt, and each later step, which computes only the
new token, sees the edited positions through the cached keys and values — exactly as a full
recomputation of the steered forward pass would (tests/analysis/test_steered_generation.py).

**Padded batches.** Positions are each row's own: in a left-padded batch they count from the row's
first real token (``hook.positions``, refgpt/tl/hooks.py), so ``add_vector``, ``steering_vector`` and
``injection_limit`` edit every row where they would edit it alone
(tests/analysis/test_padded_steering.py). ``patch`` refuses a left-padded run: its source cache
is indexed by column, the run's rows by position.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import RefGPTError, whole_number, whole_numbers
from ..tl.hook_points import position_axis


class Intervention:
    """Hooks with a purpose: iterate it as ``fwd_hooks``, or enter it as a context manager."""

    def __init__(self, model, hooks, description: str):
        self.model = model
        self.hooks = list(hooks)
        self.description = description
        self._context = None

    def __iter__(self):
        return iter(self.hooks)

    def __len__(self) -> int:
        return len(self.hooks)

    def __add__(self, other: Intervention) -> Intervention:
        if other.model is not self.model:
            raise RefGPTError("cannot combine interventions on two different models")
        return Intervention(self.model, self.hooks + other.hooks, f"{self.description} + {other.description}")

    def __enter__(self):
        if self._context is not None:
            raise RefGPTError(f"intervention {self.description!r} is already active")
        self._context = self.model.hooks(self.hooks)
        return self._context.__enter__()

    def __exit__(self, *exc):
        context, self._context = self._context, None
        return context.__exit__(*exc)

    def __repr__(self) -> str:
        return f"Intervention({self.description}, {len(self.hooks)} hook(s))"


class PromptPadding(NamedTuple):
    """How ``steering_vector`` padded the shorter of its two prompts: ``prompt`` ("plus" or
    "minus") got ``count`` copies of token ``token`` on its right."""

    prompt: str
    count: int
    token: int


class SteeringVector(Intervention):
    """An ActAdd steering vector: ``vector`` [pos, d_model], already multiplied by ``coeff``.

    As an intervention it adds ``vector`` to the first ``len(vector)`` positions of
    ``blocks.{layer}.hook_resid_pre`` of every prompt it runs on (a shorter prompt is an error). In
    a padded batch each row's positions count from its first real token, as TransformerLens and HF
    count them: a left-padded row is steered where it would be steered alone, not at its pads.
    """

    def __init__(self, model, vector, layer: int, coeff: float, plus, minus, padding=None):
        self.vector = vector  # [pos, d_model]
        self.layer, self.coeff = layer, coeff
        self.plus_tokens, self.minus_tokens = plus, minus  # [pos] each, after padding
        self.padding = padding  # None, or how the shorter prompt was padded (PromptPadding)
        hook = _adder(vector, np.arange(len(vector)), f"steering vector ({len(vector)} positions)")
        super().__init__(model, [(resid_pre_name(model, layer), hook)],
                         f"ActAdd at layer {layer}, coeff {coeff:g}")


def resid_pre_name(model, layer: int) -> str:
    """``blocks.{layer}.hook_resid_pre``, checking the layer (negative counts from the end)."""
    n = model.cfg.n_layers
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not -n <= layer < n:
        raise RefGPTError(f"layer {layer!r} is not a block of this model (0..{n - 1})")
    return f"blocks.{int(layer) % n}.hook_resid_pre"


def space_token(model) -> int:
    """The id of the space token ``" "`` in the model's tokenizer (it must be a single token)."""
    ids = model.to_tokens(" ", prepend_bos=False)[0]
    if len(ids) != 1:
        raise RefGPTError(f"the tokenizer encodes ' ' as {len(ids)} tokens {ids.tolist()}; "
                          "padding needs a single space token")
    return int(ids[0])


def steering_vector(model, plus, minus, layer: int, coeff: float = 1.0, *, prepend_bos: bool = True,
                    pad_token: int | None = None) -> SteeringVector:
    """ActAdd: coeff·(resid_pre_L(plus) − resid_pre_L(minus)), as a ``SteeringVector``.

    ``plus`` and ``minus`` are text (tokenized with the model's tokenizer, ``<|endoftext|>`` first
    if ``prepend_bos``) or token ids [pos]. The shorter is padded on the right with ``pad_token``
    (default: the space token, which needs a tokenizer); the vector's ``padding`` says so
    (a ``PromptPadding``, or None when the prompts have one length).
    """
    name = resid_pre_name(model, layer)
    plus_ids, minus_ids = (_prompt_tokens(model, p, prepend_bos, what) for p, what in ((plus, "plus"), (minus, "minus")))
    padding = None
    if len(plus_ids) != len(minus_ids):
        pad = space_token(model) if pad_token is None else whole_number(pad_token, "pad_token", least=0,
                                                                         below=model.cfg.d_vocab)
        length = max(len(plus_ids), len(minus_ids))
        padding = PromptPadding("plus" if len(plus_ids) < length else "minus",
                                length - min(len(plus_ids), len(minus_ids)), pad)
        plus_ids, minus_ids = (np.concatenate([t, np.full(length - len(t), pad, np.int64)]) for t in (plus_ids, minus_ids))
    # Two separate passes of the same shape, not one batch: each row is then computed by exactly
    # the same arithmetic, so equal prompts (or an equal first token) give an exactly zero row.
    resid_plus, resid_minus = (model.run_with_cache(ids[None], names=[name])[1][name][0] for ids in (plus_ids, minus_ids))
    vector = _scaled(coeff, resid_plus - resid_minus, model.dtype, "steering vector")  # [pos, d_model]
    return SteeringVector(model, vector, int(layer) % model.cfg.n_layers, coeff, plus_ids, minus_ids, padding)


def add_vector(model, tokens, vector, layer: int, positions="front", coeff: float = 1.0) -> Intervention:
    """Add coeff·vector to ``blocks.{layer}.hook_resid_pre`` at ``positions`` of ``tokens``' prompts.

    ``vector`` is [d_model] (the same vector at every position) or [m, d_model] (one row per
    position). ``positions`` is ``"front"`` (positions 0..m−1; 0 for a single vector) or a list of
    position indices (negative ones count from the end of ``tokens``). ``tokens`` ([pos] or
    [batch, pos]) fixes the prompt length the positions refer to; a run longer than the prompt
    is read as the prompt continued (``generate``), a shorter one is an error.
    """
    name = resid_pre_name(model, layer)
    tokens, _ = model.check_tokens(tokens)
    n_pos, d_model = tokens.shape[1], model.cfg.d_model
    vector = np.asarray(vector)
    if vector.dtype.kind != "f" or vector.ndim not in (1, 2) or vector.shape[-1] != d_model:
        raise RefGPTError(f"vector: expected a float array [d_model={d_model}] or [positions, {d_model}], "
                          f"found {vector.dtype} {list(vector.shape)}")
    rows = vector.reshape(-1, d_model).astype(model.dtype, copy=False)  # [m, d_model]
    if isinstance(positions, str):
        if positions != "front":
            raise RefGPTError(f"positions: expected 'front' or a list of positions, found {positions!r}")
        where = np.arange(len(rows))
    else:
        where = whole_numbers(positions, "positions").reshape(-1)
        if not len(where):
            raise RefGPTError("positions: none given (a list of at least one position, or 'front')")
        if len(np.unique(where % max(n_pos, 1))) != len(where):
            raise RefGPTError(f"positions: {where.tolist()} names a position twice")
    out_of_range = where[(where >= n_pos) | (where < -n_pos)]
    if len(out_of_range):
        raise RefGPTError(f"positions: {int(out_of_range[0])} is outside a prompt of {n_pos} positions")
    where = where % n_pos
    if len(rows) == 1:
        rows = np.broadcast_to(rows, (len(where), d_model))  # [m, d_model]
    if len(rows) != len(where):
        raise RefGPTError(f"vector has {len(rows)} rows but {len(where)} positions were given")
    added = _scaled(coeff, rows, model.dtype, "vector")  # [m, d_model]
    hook = _adder(added, where, f"vector at positions {where.tolist()}", n_pos)
    return Intervention(model, [(name, hook)], f"add {coeff:g}·vector at layer {int(layer) % model.cfg.n_layers}, "
                                               f"positions {where.tolist()}")


def injection_limit(model, direction, layer: int, position: int) -> Intervention:
    """The k → ∞ limit of ``add_vector(…, direction, layer, [position], coeff=k)``.

    In every block from ``layer`` on, and in ln_final, the normalized LayerNorm value at
    ``position`` is replaced by its limit x̂∞ = √n·Pd/‖Pd‖ (d = ``direction``, P the centering
    projection): as k grows, LN(k·d + s) → w ⊙ x̂∞ + b whatever the rest s of the stream holds
    (docs/layernorm.md §5). The stream at ``position`` itself then no longer matters: later
    positions see it only through these LayerNorms. Needs Pd ≠ 0 (d not a constant vector).
    """
    name = resid_pre_name(model, layer)
    first, n = int(name.split(".")[1]), model.cfg.d_model
    d = np.asarray(direction)
    if d.dtype.kind != "f" or d.shape != (n,):
        raise RefGPTError(f"direction: expected a float array [d_model={n}], found {d.dtype} {list(d.shape)}")
    d = d.astype(model.dtype, copy=False)
    centered = d - d.mean()  # [d_model] = P·d
    norm = np.linalg.norm(centered)
    if not norm > 0:
        raise RefGPTError("direction: P·d = 0 (a constant vector has no direction after centering)")
    limit = np.sqrt(n) * centered / norm  # [d_model] x̂∞ = √n·Pd/‖Pd‖
    position = whole_number(position, "position")

    def replace(normalized, hook):
        hook_name, start = hook.name, hook.start
        at = _row_positions(hook, normalized)  # [batch, pos]
        if start == 0:
            held = at.max(axis=1) + 1  # [batch] each row's prompt length (its real tokens)
            short = np.flatnonzero(~((-held <= position) & (position < held)))
            if len(short):
                raise RefGPTError(f"{hook_name}: position {position} is outside a prompt of {held[short[0]]} "
                                  f"positions{_which_row(hook, short[0])}")
        if position < 0 and start > 0:
            raise RefGPTError(f"{hook_name}: a position counted from the end ({position}) is ambiguous "
                              "once a KV cache holds earlier positions")
        wanted = position % held if position < 0 else np.full(len(at), position)  # [batch]
        hit = at == wanted[:, None]  # [batch, pos]
        if not hit.any():
            return None  # computed in an earlier pass (KV cache), replaced there
        out = normalized.copy()  # [batch, pos, d_model]
        out[hit] = limit.astype(normalized.dtype, copy=False)  # [hits, d_model]
        return out

    names = [f"blocks.{M}.ln{i}.hook_normalized" for M in range(first, model.cfg.n_layers) for i in (1, 2)]
    return Intervention(model, [(name, replace) for name in names + ["ln_final.hook_normalized"]],
                        f"limit k→∞ of a vector at layer {first}, position {position}")


def patch(model, tokens, source_cache, names, positions=None) -> Intervention:
    """Replace the activations at hook points ``names`` with ``source_cache``'s, at ``positions``.

    ``positions`` is None (every position of ``tokens``, whose length the source run must have)
    or a list of positions of ``tokens`` (negative ones count from its end); for attention
    scores and patterns it indexes the query axis. The source run must have the same batch size
    as ``tokens`` or batch 1 (broadcast), and at least the patched positions. A run longer than
    ``tokens`` is read as that prompt continued: under ``generate`` the prompt's positions are
    patched once and the generated ones are left alone.
    """
    tokens, _ = model.check_tokens(tokens)
    n_pos = tokens.shape[1]
    names = [names] if isinstance(names, str) else list(names)
    if positions is None:
        where = np.arange(n_pos)
    else:
        where = given = whole_numbers(positions, "patch: positions").reshape(-1)
        outside = where[(where >= n_pos) | (where < -n_pos)]
        if len(outside) or not len(where):
            raise RefGPTError(f"patch: positions {where.tolist()} are not positions of a prompt of {n_pos}")
        where = where % n_pos
    hooks = []
    for name in names:
        if name not in model.hook_names:
            raise RefGPTError(f"patch: {name!r} is not a hook point of this model")
        if name not in source_cache:
            raise RefGPTError(f"patch: {name!r} is not in the source cache")
        source = np.asarray(source_cache[name])
        have = source.shape[position_axis(name)]
        if positions is None and have != n_pos or have <= int(where.max()):
            wanted = f"the prompt has {n_pos}" if positions is None else f"patching needs {int(where.max()) + 1}"
            raise RefGPTError(f"patch: the source's {name} has {have} positions, {wanted}")
        hooks.append((name, _patcher(source, where, name)))
    where = "every position" if positions is None else f"positions {given.tolist()}"
    return Intervention(model, hooks, f"patch {len(names)} hook point(s) at {where}")


# ---- the hook functions ----------------------------------------------------------------------
#
# Each reads ``hook.start`` (refgpt/tl/hooks.py), the absolute position of its activation's first
# row. In an ordinary pass that is 0 and the activation holds the whole
# sequence; in a KV-cached step it holds only the new positions. A hook edits the positions it
# was made for that lie in the rows it sees, and nothing else: under generation the prompt's
# positions are edited once, in the pass that computes them, and later tokens see the edit
# through the cached keys and values, as they would in a full recomputation.


def _scaled(coeff, rows, dtype, what):
    """coeff·rows in the model's dtype: multiplied in float64 (exact for float32 rows, and a
    coefficient beyond float32's range is not rounded to inf first), rounded once to ``dtype``.
    A result that is not finite there is an error: the stream could not hold it."""
    if isinstance(coeff, bool) or not isinstance(coeff, (int, float, np.integer, np.floating)) or not np.isfinite(coeff):
        raise RefGPTError(f"{what}: the coefficient must be a finite number, found {coeff!r}")
    with np.errstate(over="ignore"):
        out = (np.float64(coeff) * np.asarray(rows, np.float64)).astype(dtype)  # [m, d_model]
    if not np.all(np.isfinite(out)):
        raise RefGPTError(f"{what}: coeff·vector overflows {np.dtype(dtype).name} (coeff {coeff:g}, "
                          f"largest entry {np.abs(np.asarray(rows, np.float64)).max():.3g})")
    return out


def _rows_here(where, start, new):
    """Which of the absolute positions ``where`` [m] are among start … start + new − 1:
    (a mask [m], their row indices in the activation)."""
    inside = (where >= start) & (where < start + new)  # [m]
    return inside, where[inside] - start


def _row_positions(hook, activation) -> np.ndarray:
    """[batch, pos] the absolute position of each row of a [batch, pos, …] activation in each
    prompt: counted from the row's first real token in a padded pass (``hook.positions``, −1 at
    pads, so a left-padded row is edited where it would be edited alone), else start + index."""
    if hook.positions is not None:
        return hook.positions
    return np.broadcast_to(hook.start + np.arange(activation.shape[1]), activation.shape[:2])


def _which_row(hook, b) -> str:
    return "" if hook.positions is None else f" (batch row {int(b)}, counted from its first real token)"


def _adder(rows, where, what, n_pos=None):
    """A hook adding rows[i] at absolute position where[i] of a [batch, pos, d_model] activation
    (each batch row's own positions: a left-padded row is steered from its first real token)."""

    def add(resid, hook):
        name, start = hook.name, hook.start
        at = _row_positions(hook, resid)  # [batch, pos]
        if start == 0:  # the pass that computes the prompt must hold every edited position
            if n_pos is not None and resid.shape[1] < n_pos:
                raise RefGPTError(f"{name}: this intervention was made for prompts of {n_pos} positions, "
                                  f"found {resid.shape[1]}")
            held = at.max(axis=1) + 1  # [batch] each row's prompt length (its real tokens)
            short = np.flatnonzero(held <= int(where.max()))
            if len(short):
                raise RefGPTError(f"{name}: the {what} needs at least {int(where.max()) + 1} positions, "
                                  f"the prompt has {held[short[0]]}{_which_row(hook, short[0])}")
        out = None
        for row, p in zip(rows, where):  # distinct positions
            hit = at == p  # [batch, pos]; none: computed in an earlier pass (KV cache), added there
            if hit.any():
                out = resid.copy() if out is None else out  # [batch, pos, d_model]
                out[hit] += row.astype(resid.dtype, copy=False)  # [hits, d_model]
        return out

    return add


def _patcher(source, where, name):
    """A hook writing ``source``'s values at absolute positions ``where`` (query positions for
    attention scores and patterns, whose key axis is fitted to the run's by ``_fit_keys``)."""
    axis = position_axis(name)

    def replace(activation, hook):
        hook_name, start = hook.name, hook.start
        if hook.positions is not None and _left_padded(hook, activation.shape[axis]):
            raise RefGPTError(f"patch {hook_name}: the run is left-padded: its rows' positions start at "
                              "each row's first real token, the source cache's at its first column, so "
                              "which values belong where is ambiguous; patch unpadded or right-padded runs")
        heads_differ = axis == 2 and source.shape[1] != activation.shape[1]
        rest_differs = axis == 1 and source.shape[2:] != activation.shape[2:]
        if source.shape[0] not in (1, activation.shape[0]) or heads_differ or rest_differs:
            raise RefGPTError(f"patch {hook_name}: source has shape {list(source.shape)}, "
                              f"the run has {list(activation.shape)}")
        new = activation.shape[axis]
        if start == 0 and new <= int(where.max()):
            raise RefGPTError(f"patch {hook_name}: patches positions up to {int(where.max())}, "
                              f"the run has {new} positions")
        inside, local = _rows_here(where, start, new)
        if not inside.any():
            return None
        src = np.take(source, where[inside], axis=axis)
        if axis == 2:
            src = _fit_keys(src, activation.shape[3], hook_name)
        out = activation.copy()
        index = [slice(None)] * activation.ndim
        index[axis] = local
        out[tuple(index)] = np.broadcast_to(src.astype(activation.dtype, copy=False), out[tuple(index)].shape)
        return out

    return replace


def _left_padded(hook, new) -> bool:
    """Does some real token of this pass sit at a column other than its position (pads before it)?"""
    at = hook.positions  # [batch, new]
    return bool(np.any((at >= 0) & (at != hook.start + np.arange(new))))


def _fit_keys(rows, keys, name):
    """Source rows of attention scores or a pattern [batch, head, m, source keys] on a run with
    ``keys`` keys. A query sees only keys up to itself, so the keys beyond the source's are future
    keys for every patched query: masked (−∞ in the scores, 0 in the pattern). Padding with that
    value, or dropping masked keys, gives exactly the rows the run would have computed."""
    have = rows.shape[-1]
    if have >= keys:
        return rows[..., :keys]
    fill = -np.inf if name.endswith("hook_attn_scores") else 0.0
    pad = np.full(rows.shape[:-1] + (keys - have,), fill, rows.dtype)
    return np.concatenate([rows, pad], axis=-1)  # [batch, head, m, keys]


def _prompt_tokens(model, prompt, prepend_bos, what):
    if isinstance(prompt, str):
        return model.to_tokens(prompt, prepend_bos=prepend_bos)[0]
    ids, batched = model.check_tokens(prompt)
    if batched:
        raise RefGPTError(f"{what}: expected one prompt [pos], found shape {list(np.shape(prompt))}")
    return ids[0]
