"""Exact logit attribution: every logit split into labelled parts that sum to it.

The final residual stream at a position is a sum of what each piece of the model wrote, and every
constant the model adds is a piece of its own (docs/decomposition.md §2):

    x = embed + pos_embed
        + Σ_L [ Σ_h (z[L,h] − b̃_V[L,h])·W_O[L,h]     "L3H5"      head h's input-dependent part
                + Σ_h b̃_V[L,h]·W_O[L,h]              "L3H5.b_V"  its share of the value bias: a
                                                                 constant, as pattern rows sum to 1
                + b_O[L]                             "L3.b_O"
                + Σ_n post[L,n]·W_out[L,n]           "L3N17"     neuron n
                + b_out[L] ]                         "L3.b_out"

where b̃_V = b_V + ln1.b·W_V is the constant part of the value vectors (ln1's bias reaches v
through W_V; ``value_bias``), so that z − b̃_V = A·((ln1.w ⊙ x̂)·W_V) carries all of the input. The
logit for token t is, with σ ln_final's cached scale and P the centering projection,

    logit_t = Σ_c c·u/σ  +  ln_final.b·W_U[:,t]  +  b_U[t],         u = P(w ⊙ W_U[:,t])

(w = ln_final.w). Holding σ fixed from the cache makes LayerNorm linear (docs/layernorm.md §2),
so this is an identity, not an approximation: ``values.sum(0)`` is the model's logit up to
float rounding (≤ 1e-12 relative in float64), on raw or processed weights. With ``against``
every W_U[:,t] and b_U[t] becomes W_U[:,t] − W_U[:,a] and b_U[t] − b_U[a]: the logit difference.

Each piece is projected onto u *before* anything is expanded: a head contributes z·(W_O·u), a
neuron post·(W_out·u), so no [neuron, d_model] array is ever formed per position.

Granularity: "layer" gives per layer "L3.attn" (all heads), "L3.b_V", "L3.b_O", "L3.mlp" (all
neurons), "L3.b_out"; "head" splits attention into "L3H5" and "L3H5.b_V"; "neuron" also splits the
MLP into "L3N17". Always present: "embed", "pos_embed", "ln_final.b"; "b_U" where the model has
one (GPT-2 has none; ``refgpt.tl.processing.fold_ln`` creates one).
"""

from __future__ import annotations

import numpy as np

from ..tl.decomposition import token_id, token_ids
from ..errors import RefGPTError, need
from ..gpt2.layernorm import scale as ln_scale
from ..gpt2.ln_views import cached_output

_NEEDED_BY = ("attribute", "cache everything, or at least refgpt.analysis.attribution.required_hooks(model.cfg)")

GRANULARITIES = ("layer", "head", "neuron")


def required_hooks(cfg, logits=True) -> list[str]:
    """The cache entries ``attribute`` reads (pass as ``run_with_cache(tokens, names=…)``).

    ``logits=False`` leaves out ln_final's output, needed only when ``attribute`` is not given
    the logits to check against.
    """
    names = ["hook_embed", "hook_pos_embed"]
    for L in range(cfg.n_layers):
        names += [f"blocks.{L}.attn.hook_z", f"blocks.{L}.mlp.hook_post"]
    return names + ["ln_final.hook_scale"] + (["ln_final.hook_normalized"] if logits else [])


class Attribution:
    """Labelled contributions to one logit (or logit difference) at every [batch, pos].

    ``labels`` [component], ``values`` [component, batch, pos] in logit units, ``logit`` [batch,
    pos] the model's own logit (or difference) they sum to; ``target`` and ``against`` are token
    ids (an int, or an array [batch, pos]); ``granularity`` is "layer", "head" or "neuron".
    """

    def __init__(self, labels, values, logit, target, against, granularity):
        self.labels = list(labels)
        self.values = values
        self.logit = logit
        self.target, self.against, self.granularity = target, against, granularity
        self._index = {label: i for i, label in enumerate(self.labels)}

    @property
    def total(self) -> np.ndarray:
        """Σ over components: [batch, pos]."""
        return self.values.sum(0)

    def check(self, relative: bool = False) -> float:
        """max |Σ values − logit| over [batch, pos]; with ``relative``, divided by max(1, max |logit|)."""
        error = float(np.max(np.abs(self.total - self.logit)))
        return error / max(1.0, float(np.max(np.abs(self.logit)))) if relative else error

    def __getitem__(self, label) -> np.ndarray:
        """One component's values [batch, pos]."""
        try:
            return self.values[self._index[label]]
        except KeyError:
            raise KeyError(f"{label!r} is not a component; e.g. {self.labels[:4]}") from None

    def top(self, k: int = 10, batch: int = 0, pos: int = -1) -> list[tuple[str, float]]:
        """The k components largest in absolute value at one [batch, pos], largest first."""
        column = self.values[:, batch, pos]  # [component]
        order = np.argsort(-np.abs(column), kind="stable")[:k]
        return [(self.labels[i], float(column[i])) for i in order]

    def to_dict(self) -> dict:
        """Plain Python (JSON-ready): labels, values [component][batch][pos], logit, sum, error."""
        as_list = lambda ids: None if ids is None else np.asarray(ids).tolist()  # noqa: E731
        return {"granularity": self.granularity, "target": as_list(self.target),
                "against": as_list(self.against), "labels": self.labels,
                "values": self.values.tolist(), "logit": self.logit.tolist(),
                "sum": self.total.tolist(), "max_error": self.check()}

    def __repr__(self) -> str:
        batch, pos = self.logit.shape
        return (f"Attribution({len(self.labels)} components, granularity={self.granularity!r}, "
                f"batch={batch}, pos={pos}, max_error={self.check():.2e})")


def value_bias(params, layer):
    """The constant part of each head's value vectors, b_V + ln1.b·W_V: [head, d_head].

    v = LN1(x)·W_V + b_V = (w ⊙ x̂)·W_V + (ln1.b·W_V + b_V), and x̂ carries all of the input.
    (fold_ln moves ln1.b·W_V into b_V; this is that b_V, so processing moves nothing here.)
    """
    b = f"blocks.{layer}."
    return params[b + "attn.b_V"] + np.einsum("d,hde->he", params[b + "ln1.b"], params[b + "attn.W_V"])


def _ids(model, tokens, shape, what):
    """An int (one token at every position) or an int array [batch, pos]."""
    if isinstance(tokens, str) or np.ndim(tokens) == 0:
        return token_id(model, tokens, what)
    ids = token_ids(model, tokens, what)
    try:
        return np.broadcast_to(ids, shape)  # [batch, pos]
    except ValueError:
        raise RefGPTError(f"{what}: token ids of shape {list(ids.shape)} do not broadcast to the "
                          f"cache's [batch, pos] = {list(shape)}") from None


def readout(cache, target, against=None):
    """What turns a write to the final stream into logit units: (σ [batch, pos] ln_final's cached
    scale, t and a the token ids, d = W_U[:, t] (− W_U[:, a]), u = P(w ⊙ d)); a write c adds c·u/σ
    to the logit. d and u are [d_model], or [batch, pos, d_model] with one target per position."""
    model = cache.model
    p = model.params
    scale = need(cache, "ln_final.hook_scale", *_NEEDED_BY)[..., 0]  # [batch, pos]
    shape = scale.shape
    t = _ids(model, target, shape, "target")
    a = None if against is None else _ids(model, against, shape, "against")
    W_U = p["unembed.W_U"]  # [d_model, d_vocab]
    direction = np.moveaxis(W_U[:, t], 0, -1)  # [d_model] or [batch, pos, d_model]
    if a is not None:
        direction = direction - np.moveaxis(W_U[:, a], 0, -1)
    u = p["ln_final.w"] * direction  # w ⊙ d: [d_model] or [batch, pos, d_model]
    u = u - u.mean(-1, keepdims=True)  # P(w ⊙ d)
    return scale, t, a, direction, u


def attribute(cache, target, against=None, granularity="layer", logits=None) -> Attribution:
    """Split the logit for ``target`` (minus ``against``) into labelled parts that sum to it.

    ``target``/``against``: a token id, a string that is exactly one token, or ids [batch, pos]
    (one target per position). ``logits`` (optional): the logits the forward pass returned, to
    check the sum against; without them the logit is recomputed from ln_final's cached output,
    which is the same arithmetic the forward pass did.
    """
    if granularity not in GRANULARITIES:
        raise RefGPTError(f"attribute: granularity must be one of {list(GRANULARITIES)}, found {granularity!r}")
    model = cache.model
    p = model.params
    scale, t, a, direction, u = readout(cache, target, against)
    shape = scale.shape
    per_pos = u.ndim == 3  # one target per position

    def onto(x, v):  # x [batch, pos, d_model]·v → [batch, pos]
        return np.einsum("bpd,bpd->bp", x, v) if v.ndim == 3 else x @ v

    def const(b, v):  # a constant vector b [d_model]·v → [batch, pos]
        return v @ b if v.ndim == 3 else np.full(shape, b @ v, model.dtype)

    labels, parts = ["embed", "pos_embed"], [onto(need(cache, "hook_embed", *_NEEDED_BY), u)[None],
                                             onto(need(cache, "hook_pos_embed", *_NEEDED_BY), u)[None]]
    for L in range(model.cfg.n_layers):
        blk = f"blocks.{L}."
        z = need(cache, blk + "attn.hook_z", *_NEEDED_BY)  # [batch, pos, head, d_head]
        W_O = p[blk + "attn.W_O"]  # [head, d_head, d_model]
        b_V = value_bias(p, L)  # [head, d_head]
        if per_pos:  # one direction per position: BLAS matrix products, [batch, pos, ·]
            g = (u @ W_O.reshape(-1, W_O.shape[-1]).T).reshape(z.shape)  # W_O[h]·u: [batch, pos, head, d_head]
            shares = np.moveaxis((b_V * g).sum(-1), -1, 0)  # [head, batch, pos]
        else:
            g = W_O @ u  # [head, d_head]
            shares = np.broadcast_to((b_V * g).sum(-1)[:, None, None], (len(g), *shape))  # [head, batch, pos]
        heads = np.moveaxis((z * g).sum(-1), -1, 0) - shares  # (z − b_V)·W_O·u: [head, batch, pos]
        post = need(cache, blk + "mlp.hook_post", *_NEEDED_BY)  # [batch, pos, d_mlp]
        W_out = p[blk + "mlp.W_out"]  # [d_mlp, d_model]
        k = u @ W_out.T  # W_out[n]·u: [batch, pos, d_mlp] or [d_mlp]
        neurons = post * k  # [batch, pos, d_mlp]
        b_O, b_out = const(p[blk + "attn.b_O"], u)[None], const(p[blk + "mlp.b_out"], u)[None]  # [1, batch, pos]
        if granularity == "layer":
            labels += [f"L{L}.attn", f"L{L}.b_V", f"L{L}.b_O"]
            parts += [heads.sum(0)[None], shares.sum(0)[None], b_O]
        else:
            labels += [f"L{L}H{h}" for h in range(len(heads))] + [f"L{L}H{h}.b_V" for h in range(len(heads))]
            labels.append(f"L{L}.b_O")
            parts += [heads, shares, b_O]
        if granularity == "neuron":
            labels += [f"L{L}N{n}" for n in range(neurons.shape[-1])]
            parts.append(np.moveaxis(neurons, -1, 0))  # [d_mlp, batch, pos]
        else:
            labels.append(f"L{L}.mlp")
            parts.append(neurons.sum(-1)[None])  # [1, batch, pos]
        labels.append(f"L{L}.b_out")
        parts.append(b_out)
    values = np.concatenate(parts) / scale  # [component, batch, pos]: everything written to the stream

    constants, names = [const(p["ln_final.b"], direction)], ["ln_final.b"]  # [batch, pos]
    b_U = p.get("unembed.b_U")
    if b_U is not None:
        names.append("b_U")
        constants.append(np.full(shape, 0.0, model.dtype) + (b_U[t] if a is None else b_U[t] - b_U[a]))
    values = np.concatenate([values, np.stack(constants)])  # [component, batch, pos]
    labels += names

    logit = _true_logit(cache, logits, t, a, direction, b_U, shape)
    return Attribution(labels, values, logit, t, a, granularity)


def _true_logit(cache, logits, t, a, direction, b_U, shape):
    """The model's logit for t (minus a) at every [batch, pos]: [batch, pos]."""
    if logits is not None:
        logits = np.asarray(logits)
        if logits.ndim == 2:
            logits = logits[None]  # [batch, pos, d_vocab]
        if logits.shape[:2] != shape:
            raise RefGPTError(f"attribute: logits of shape {list(logits.shape)} do not match the cache's "
                              f"[batch, pos] = {list(shape)}")
        pick = lambda ids: np.take_along_axis(logits, np.broadcast_to(ids, shape)[..., None], -1)[..., 0]  # noqa: E731
        return pick(t) if a is None else pick(t) - pick(a)
    final = cached_output(cache, "ln_final.", *_NEEDED_BY)  # [batch, pos, d_model]
    logit = np.einsum("bpd,bpd->bp", final, direction) if direction.ndim == 3 else final @ direction  # [batch, pos]
    if b_U is not None:
        logit = logit + (b_U[t] if a is None else b_U[t] - b_U[a])
    return logit


# ---- Question (1): each piece by its own scale, beside the cached one ---------------------------------


def naive_hooks(cfg) -> list[str]:
    """The cache entries ``naive_attribution`` reads (pass as ``run_with_cache(tokens, names=…)``)."""
    names = ["hook_embed", "hook_pos_embed", "ln_final.hook_scale"]
    for L in range(cfg.n_layers):
        names += [f"blocks.{L}.hook_attn_out", f"blocks.{L}.hook_mlp_out"]
    return names


class NaiveAttribution:
    """One logit at one [batch, pos], split over the final stream's pieces two ways (docs/decomposition.md §1).

    ``labels`` [piece]: embed, pos_embed, each attn_out and mlp_out, then the constants
    ("ln_final.b", and "b_U" where the model has one). ``own_scale`` [piece]: σ(c) of each piece
    alone (NaN for a constant); ``scale``: ln_final's cached σ of the whole stream at that position.
    ``naive`` [piece] = (w ⊙ Pc/σ(c))·d, each piece normalised by its own scale, what normalising
    "each component" means; ``exact`` [piece] = (w ⊙ Pc/σ)·d, through the cached scale (d =
    W_U[:,t], or W_U[:,t] − W_U[:,a]). ``exact`` sums to ``logit`` to rounding; ``naive`` does not.
    """

    def __init__(self, labels, own_scale, scale, naive, exact, logit, position, batch):
        self.labels = list(labels)
        self.own_scale, self.scale = own_scale, scale
        self.naive, self.exact = naive, exact
        self.logit, self.position, self.batch = logit, position, batch

    @property
    def naive_sum(self) -> float:
        return float(self.naive.sum())

    @property
    def exact_sum(self) -> float:
        return float(self.exact.sum())

    def __repr__(self) -> str:
        return (f"NaiveAttribution({len(self.labels)} pieces at position {self.position}: naive sum "
                f"{self.naive_sum:.6g}, exact sum {self.exact_sum:.6g}, logit {self.logit:.6g}, σ {self.scale:.6g})")


def naive_attribution(cache, target, against=None, pos: int = -1, batch: int = 0, logits=None) -> NaiveAttribution:
    """The logit of ``target`` (minus ``against``) at one ``pos`` split over the final stream's
    pieces, once through ln_final's cached scale (exact) and once with each piece normalised by
    its own scale (naive): question (1) of docs/decomposition.md §1 as numbers.

    ``target``/``against``: a token id or text that is one token. ``logits`` (optional): the
    forward pass's logits [pos, d_vocab] or [batch, pos, d_vocab], else the logit is recomputed from
    ln_final's cached output. Needs the entries ``naive_hooks`` names (and, without ``logits``,
    ln_final.hook_normalized).
    """
    model = cache.model
    p = model.params
    sigma = need(cache, "ln_final.hook_scale", *_NEEDED_BY)[..., 0]  # [batch, pos]
    shape = sigma.shape
    if not -shape[0] <= batch < shape[0] or not -shape[1] <= pos < shape[1]:
        raise RefGPTError(f"naive_attribution: [batch, pos] = [{batch}, {pos}] is outside the cache's {list(shape)}")
    batch, pos = batch % shape[0], pos % shape[1]
    t = token_id(model, target, "target")
    a = None if against is None else token_id(model, against, "against")
    W_U = p["unembed.W_U"]  # [d_model, d_vocab]
    direction = W_U[:, t] if a is None else W_U[:, t] - W_U[:, a]  # [d_model]
    u = p["ln_final.w"] * direction  # w ⊙ d: [d_model]
    labels, pieces = ["embed", "pos_embed"], [need(cache, "hook_embed", *_NEEDED_BY)[batch, pos],
                                              need(cache, "hook_pos_embed", *_NEEDED_BY)[batch, pos]]
    for L in range(model.cfg.n_layers):
        for kind in ("attn_out", "mlp_out"):
            labels.append(f"{L}_{kind}")
            pieces.append(need(cache, f"blocks.{L}.hook_{kind}", *_NEEDED_BY)[batch, pos])
    pieces = np.stack(pieces)  # [piece, d_model]
    own = ln_scale(pieces, model.cfg.eps)[:, 0]  # [piece] σ(c) of each piece alone
    centred = pieces - pieces.mean(-1, keepdims=True)  # [piece, d_model] P·c
    final = float(sigma[batch, pos])
    constants, names = [float(p["ln_final.b"] @ direction)], ["ln_final.b"]
    b_U = p.get("unembed.b_U")
    if b_U is not None:
        constants.append(float(b_U[t] if a is None else b_U[t] - b_U[a]))
        names.append("b_U")
    naive = np.concatenate([centred @ u / own, constants])  # [piece]
    exact = np.concatenate([centred @ u / final, constants])  # [piece]
    own = np.concatenate([own, np.full(len(constants), np.nan)])  # [piece]
    if logits is not None:
        logits = np.asarray(logits)
        logits = logits[None] if logits.ndim == 2 else logits  # [batch, pos, d_vocab]
        if logits.shape[:2] != shape:
            raise RefGPTError(f"naive_attribution: logits of shape {list(logits.shape)} do not match the cache's "
                              f"[batch, pos] = {list(shape)}")
        row = logits[batch, pos]  # [d_vocab]
        logit = float(row[t] if a is None else row[t] - row[a])
    else:
        logit = float(_true_logit(cache, None, t, a, direction, b_U, shape)[batch, pos])
    return NaiveAttribution(labels + names, own, final, naive, exact, logit, pos, batch)
