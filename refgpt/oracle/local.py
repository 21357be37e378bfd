"""Local verdicts: every op of a port's forward and backward judged on the port's own inputs (issue 38).

``judge`` walks a port's dumped activations (TransformerLens hook names, [batch, pos, …]) op by op,
then, if it dumped gradients (a golden's ``grad.`` names), its backward in the order the backward
computes them — each op's backward from the port's own upstream gradient and saved activations,
every parameter's gradient (a sum over the batch) last:
each op is recomputed in float64 by the reference (refgpt/reference/local.py) from the port's own
values of its inputs and the checkpoint's weights rounded to the port's storage precision, and the
port's output is held to that within the op's rounding bound at the port's precision. An op over
its bound introduced an error — it is the bug, wherever the drift it inherited came from; an op
whose output drifted from the golden file but is within its local bound inherited that drift.

The report: ``first`` (the first op over its bound, forward then backward, with the introduced error,
the bound, the inherited error when a golden's values are given, the index and both values) and
per op the worst ratio introduced/bound, NMSE (Σ(port − ref)² / Σ ref², ggml's test-backend-ops
metric) and SNR in dB, and which kind of bound judged it. An op whose output or inputs the port did
not dump is listed as skipped with the reason.

``judge_decode`` walks a decode golden's steps (refgpt/oracle/decode.py) the same way, each step's
queries reading the port's own KV cache after the step, and that cache judged as a copy: the port's
cache after the step before, this step's k and v appended (a cache appended twice or not at all is
named there, by its shape). A padded batch (``attention_mask``) is judged at its real positions, the
pad keys masked and positions taken from the golden's ``position_ids``. After the logits come
log_probs, probs and the loss: the vocabulary's sums are judged by the probabilistic bound (P(exceed)
≤ 1e-9 per sum), since the worst case is blind there (float32 at 50,257 terms allows 3e-3: llm.c's
softmax over its padded vocabulary, every probability off by ~1e-3, passes it). Each verdict carries
its step and row.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import RefGPTError
from ..reference import local as rl
from ..reference.bounds import gamma
from . import comparison, llmc_dump
from ..files.checkpoint import load as load_checkpoint
from ..files.default_model import default_model_path
from .golden import weight_hashes
from .gradients import full_targets
from .name_maps import GRAD, decode_to_refgpt, is_gradient, split_step, to_refgpt
from .quantized import snr_db  # −10·log10(NMSE), one home


@dataclass
class OpVerdict:
    """One op (one tensor) over every row: its worst element and its error totals."""

    op: str
    name: str
    layer: int | None
    kind: str
    ratio: float = 0.0  # max |port − ref| / bound
    index: tuple = ()
    port: float = 0.0
    reference: float = 0.0
    introduced: float = 0.0
    bound: float = 0.0
    inherited: float | None = None  # |ref − golden| at that index: what the port's inputs carried in
    drift: float | None = None  # max |port − golden|: the first-divergence view of the same tensor
    largest: float = 0.0  # max |port − ref|
    squared_error: float = 0.0
    squared_reference: float = 0.0
    skipped: str | None = None
    step: int | None = None  # a decode step's op
    mismatch: str | None = None  # the port's tensor has another shape than the op's output (a KV-path bug)

    @property
    def row(self) -> int | None:
        return self.index[0] if self.index else None

    @property
    def flagged(self) -> bool:
        return self.skipped is None and self.ratio > 1

    @property
    def nmse(self) -> float:
        if self.mismatch:
            return math.inf
        return self.squared_error / self.squared_reference if self.squared_reference else (
            0.0 if self.squared_error == 0 else math.inf)

    @property
    def snr_db(self) -> float:
        return snr_db(self.nmse)

    def as_dict(self) -> dict:
        keys = ("op", "name", "layer", "step", "row", "kind", "ratio", "index", "port", "reference", "introduced",
                "bound", "inherited", "drift", "skipped", "mismatch")
        d = {k: getattr(self, k) for k in keys}
        d.update(index=list(self.index), nmse=self.nmse, snr_db=self.snr_db, flagged=self.flagged)
        return d


@dataclass
class LocalReport:
    precision: str
    ops: list[OpVerdict] = field(default_factory=list)

    @property
    def first(self) -> OpVerdict | None:
        """The first op in forward order that introduced an error beyond its bound."""
        return next((v for v in self.ops if v.flagged), None)

    @property
    def flagged(self) -> list[OpVerdict]:
        return [v for v in self.ops if v.flagged]

    def as_dict(self) -> dict:
        first = self.first
        keep = ("op", "name", "layer", "step", "row", "index", "introduced", "bound", "inherited", "port", "reference",
                "mismatch")
        return {"precision": self.precision,
                "local_first": None if first is None else {k: v for k, v in first.as_dict().items() if k in keep},
                "ops": [v.as_dict() for v in self.ops]}


class _Walk:
    """The verdicts so far; ``prefix``/``step`` name a decode step's ops, ``real`` [new] the positions of
    the row being walked that are judged (a padded row's real tokens)."""

    def __init__(self, precision, golden, vocab, layer_norm="two-pass", kv_cache="kept"):
        self.precision, self.golden, self.vocab = precision, golden, vocab  # vocab: the vocabulary's sums' kind
        self.layer_norm = layer_norm  # a key of LAYER_NORMS: how the port computes its LayerNorms
        self.kv_cache = kv_cache  # a key of KV_CACHES: how a decoding port keeps its keys and values
        self.verdicts: dict[str, OpVerdict] = {}
        self.prefix, self.step, self.real = "", None, None

    def verdict(self, op, name, layer, kind=None) -> OpVerdict:
        name = self.prefix + name
        if name not in self.verdicts:
            self.verdicts[name] = OpVerdict(op, name, layer, str(kind or rl.WORST), step=self.step)
        return self.verdicts[name]

    def skip(self, op, name, layer, reason):
        v = self.verdict(op, name, layer)
        if not v.index:  # judged in another row or step: kept
            v.skipped = reason

    def judge(self, op, name, layer, row, port, reference, bound, kind=None, at=None, offset=()):
        """Hold the port's value to the reference's within ``bound`` (masked −∞ entries of both: 0), at
        the entries ``at`` (default: the real positions, the query axis of attention's [head, query, key]);
        ``offset``: the values are a block of the row's tensor, starting at this index (a block never
        splits the positions' axis, so the mask of real positions broadcasts over it)."""
        v = self.verdict(op, name, layer, kind)
        v.skipped = None
        port, reference = np.asarray(port, np.float64), np.asarray(reference, np.float64)
        if port.shape != reference.shape:  # a cache appended twice, a key missing: the op's output is not there
            if v.mismatch is None:
                v.mismatch = f"shape {list(port.shape)}, expected {list(reference.shape)}"
                v.ratio, v.index, v.introduced, v.bound = math.inf, (row,), math.inf, 0.0
            return
        if at is None and self.real is not None:
            attention = name.endswith(("hook_attn_scores", "hook_pattern"))
            at = self.real[None, :, None] if attention else self.real.reshape(-1, *[1] * (port.ndim - 1))
        with np.errstate(invalid="ignore"):
            diff = np.where(port == reference, 0.0, np.abs(port - reference))  # [...]
        diff = np.where(np.isnan(diff), np.inf, diff)  # a NaN on one side is infinitely wrong
        if at is not None:  # pads are not judged (their values are the port's affair)
            diff, port, reference = (np.where(at, a, 0.0) for a in (diff, port, reference))
        bound = np.broadcast_to((np.asarray(bound, np.float64) + self.precision.tiny) * rl.bounds.SLACK,
                                diff.shape)  # [...]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(diff == 0, 0.0, diff / bound)  # [...]
        ratio = np.where(np.isnan(ratio), np.inf, ratio)
        finite = np.isfinite(reference) & np.isfinite(port)  # [...]
        v.largest = max(v.largest, float(diff.max(initial=0.0)))
        v.squared_error += float((diff[finite] ** 2).sum())
        v.squared_reference += float((reference[finite] ** 2).sum())
        worst = float(ratio.max(initial=0.0))
        golden = self.golden(self.prefix + name, row) if self.golden else None
        if golden is not None and np.ndim(golden) == port.ndim:  # the block of it, cast up
            golden = np.asarray(golden[tuple(slice(a, a + n) for a, n in zip(offset, port.shape))], np.float64)
        if golden is not None and np.shape(golden) != port.shape:
            golden = None
        if golden is not None:
            with np.errstate(invalid="ignore"):
                drift = np.where(port == golden, 0.0, np.abs(port - golden))  # [...]
            if at is not None:
                drift = np.where(at, drift, 0.0)
            v.drift = max(v.drift or 0.0, float(np.nanmax(drift, initial=0.0)))
        if v.mismatch is None and (worst > v.ratio or not v.index):
            i = np.unravel_index(int(np.argmax(ratio)), ratio.shape) if ratio.size else ()
            v.ratio, v.index = worst, (row, *(int(j) + (offset[axis] if axis < len(offset) else 0)
                                              for axis, j in enumerate(i)))
            v.port, v.reference, v.introduced, v.bound = (float(port[i]), float(reference[i]), float(diff[i]),
                                                          float(bound[i]))
            if golden is not None:
                v.inherited = float(abs(reference[i] - golden[i]))


@dataclass
class _Row:
    """One row of one pass: ``positions`` [new] its position ids, ``real`` [new] its judged (real)
    positions, ``keys_real`` [keys] the keys its queries may read (not pads); a decode step's
    ``step`` and ``before`` (the port's tensors of the step before: its KV cache), whose queries read
    the port's own cache (None: a forward pass, reading its own k, v); ``targets`` [n] the loss's."""

    r: int
    tokens: np.ndarray
    positions: np.ndarray
    real: np.ndarray
    keys_real: np.ndarray
    step: int | None = None
    before: dict | None = None
    targets: np.ndarray | None = None


def _check(precision, kind, p_fail, layer_norm="two-pass"):
    if layer_norm not in LAYER_NORMS:
        raise RefGPTError(f"local verdicts: unknown LayerNorm algorithm {layer_norm!r}; "
                          f"one of {', '.join(LAYER_NORMS)}")
    if precision not in rl.PRECISIONS:
        raise RefGPTError(f"local verdicts: unknown precision {precision!r}; one of {', '.join(rl.PRECISIONS)}")
    if kind not in ("worst", "probabilistic"):
        raise RefGPTError(f"local verdicts: unknown kind of bound {kind!r}; 'worst' or 'probabilistic'")
    return rl.PRECISIONS[precision], rl.Kind(kind, p_fail)


def judge(params, cfg, tokens, acts, precision="float32", kind="worst", golden=None, p_fail=1e-9, targets=None,
          attention_mask=None, position_ids=None, layer_norm="two-pass", release=None) -> LocalReport:
    """Local verdicts on a port's forward: ``params`` the checkpoint's weights (TransformerLens
    names, any float dtype), ``cfg`` its Config, ``tokens`` [batch, pos], ``acts`` the port's
    activations by hook name ([batch, pos, …], as run_with_cache names them; ``logits``,
    ``log_probs``, ``probs`` [batch, pos, d_vocab] and ``loss`` [batch, n] too), ``precision`` a key of
    refgpt.reference.local.PRECISIONS, ``kind`` "worst" or "probabilistic" (for the long sums: the
    affine ops, z and the softmax's sum; the vocabulary's sums, in log_probs, probs and the loss, are
    always judged by the probabilistic kind: there the worst case is blind), and ``golden`` optionally
    a function (name, row) → the golden's float64 value, for the inherited error. ``targets``
    [batch, n] the loss's (default the next tokens); ``attention_mask`` [batch, pos] (1 real, 0 pad)
    and ``position_ids`` [batch, pos] a padded batch's: pads are neither judged nor read as keys.
    ``layer_norm``: "two-pass" (L7: the statistics and x̂ judged, as TransformerLens and llm.c compute
    them) or "any" (L16: each LayerNorm judged from its input to its dumped output, for a port whose
    mean and variance come from another algorithm — torch's nn.LayerNorm, HF's, by Welford's
    updates — within L16's stated errors). Every row is judged on its own. The walk is streamed
    (``_Held``): a tensor is read (a row of it, cast up) when an op first needs it and let go when the
    walk leaves its block, then ``release(name)`` (if given) drops its file pages; the weights are
    rounded a block's at a time. The backward is streamed the same way, block by block from the last
    (``_backward``): it reads a block's activations again when it gets there."""
    prec, sums = _check(precision, kind, p_fail, layer_norm)
    p = _Held(params, lambda w: rl.round_to(w, prec.store))  # the port's weights, a layer's at a time
    tokens = np.asarray(tokens)
    if tokens.ndim == 1:
        tokens = tokens[None]
    batch, pos = tokens.shape
    mask = np.ones((batch, pos), bool) if attention_mask is None else np.asarray(attention_mask) == 1  # [batch, pos]
    positions = np.broadcast_to(np.arange(pos), (batch, pos)) if position_ids is None else np.asarray(position_ids)
    targets = tokens[:, 1:] if targets is None else np.asarray(targets)  # [batch, n]
    walk = _Walk(prec, golden, rl.Kind("probabilistic", p_fail), layer_norm)
    per_row = {name: a for name, a in acts.items() if np.ndim(a) >= 2 and not _is_parameter_gradient(name)}
    backward = any(is_gradient(name) for name in acts)
    for r in range(batch):  # streamed (_Held): a block's tensors of a row at a time
        row = _Held(per_row, lambda a, r=r: np.asarray(a[r], np.float64), release, r)
        walk.real = None if attention_mask is None else mask[r]
        _forward_row(walk, p, cfg, _Row(r, tokens[r], positions[r], mask[r], mask[r], targets=targets[r]), row,
                     prec, sums)
        row.keep()
    if backward:  # the backward, from the mean loss over the targets
        if attention_mask is not None:
            raise RefGPTError("local verdicts: the backward of a padded batch is not judged (nor made by a golden)")
        walk.real = None
        _backward(walk, p, cfg, tokens, acts, per_row, release, prec, sums, full_targets(tokens, targets))
        order = _parameter_order(cfg)  # the parameters' gradients listed last, in one order
        return LocalReport(str(prec), sorted(walk.verdicts.values(), key=lambda v: (v.name in order,
                                                                                     order.get(v.name, 0))))
    return LocalReport(str(prec), list(walk.verdicts.values()))


#: How a port's decode keeps its keys and values: "kept" (a KV cache, each step appending to the last
#: step's: judged as that copy), "recomputed" (llm.c's loop: every step recomputes the whole sequence,
#: whose old keys may round otherwise than the step before's where a matrix library picks its kernel
#: by the number of rows: only the step's own entries are judged as a copy).
KV_CACHES = ("kept", "recomputed")


def judge_decode(params, cfg, ref, acts, precision="float32", kind="worst", golden=None, p_fail=1e-9,
                 layer_norm="two-pass", kv_cache="kept") -> LocalReport:
    """Local verdicts on a port's decode (refgpt/oracle/decode.py's names): every step's ops on the
    port's own inputs, its attention reading the port's own KV cache after the step
    (``step.S.blocks.L.attn.cache_k``/``cache_v``), that cache judged as the copy of the port's cache
    after step S − 1 with the step's k, v appended. ``ref`` the decode golden's tensors (each step's
    tokens, position ids, the attention mask if padded), ``acts`` the port's, by the same names;
    ``layer_norm`` as judge's; ``kv_cache`` a key of KV_CACHES."""
    prec, sums = _check(precision, kind, p_fail, layer_norm)
    if kv_cache not in KV_CACHES:
        raise RefGPTError(f"local verdicts: unknown KV cache {kv_cache!r}; one of {', '.join(KV_CACHES)}")
    p = _Held(params, lambda w: rl.round_to(w, prec.store))
    steps = sorted({split_step(n)[0] for n in ref if split_step(n)[0] is not None})
    walk = _Walk(prec, golden, rl.Kind("probabilistic", p_fail), layer_norm, kv_cache)
    start, kept = 0, {}  # kept: (row, blocks.L.attn.keys / values) → the port's k, v of every step so far
    for S in steps:
        feed = np.asarray(ref[f"step.{S}.tokens"])  # [batch, new]
        if np.shape(acts.get(f"step.{S}.tokens")) == feed.shape:  # the port's own inputs, if it dumped them
            feed = np.asarray(acts[f"step.{S}.tokens"])
        batch, new = feed.shape
        end = start + new
        mask = (np.asarray(ref["attention_mask"])[:, :end] == 1 if "attention_mask" in ref
                else np.ones((batch, end), bool))  # [batch, keys]
        positions = np.asarray(ref[f"step.{S}.position_ids"])  # [batch, new]
        walk.prefix, walk.step = f"step.{S}.", S
        inner = {split_step(n)[1]: a for n, a in acts.items() if split_step(n)[0] == S and np.ndim(a) >= 2}
        before = {split_step(n)[1]: a for n, a in acts.items()
                  if split_step(n)[0] == S - 1 and split_step(n)[1].endswith(("cache_k", "cache_v"))}
        for r in range(batch):
            row = _Held(inner, lambda a, r=r: np.asarray(a[r], np.float64), row=r)
            walk.real = None if "attention_mask" not in ref else mask[r, start:]
            earlier = {n: np.asarray(a[r], np.float64) for n, a in before.items()}
            earlier.update({n: a for (i, n), a in kept.items() if i == r})
            _forward_row(walk, p, cfg, _Row(r, feed[r], positions[r], mask[r, start:], mask[r], S, earlier), row,
                         prec, sums)
            for L in range(cfg.n_layers):
                for h, n in (("hook_k", "keys"), ("hook_v", "values")):
                    name = f"blocks.{L}.attn."
                    if name + h in row:
                        old = kept.get((r, name + n))
                        kept[r, name + n] = row[name + h] if old is None else np.concatenate([old, row[name + h]])
        start = end
    walk.prefix, walk.step = "", None
    return LocalReport(str(prec), list(walk.verdicts.values()))


def _kv_cache(walk, row, acts, L, prec):
    """Layer L's KV cache after a decode step judged as a copy (the port's cache after the step before,
    then this step's k, v appended); returns the (k, v) [keys, head, d_head] the step's queries read:
    the port's cache, else (a port that dumps no cache, as TransformerLens's run_with_cache) the k, v
    it dumped at every step so far, else (None, None)."""
    a = f"blocks.{L}.attn."
    for c, h in (("cache_k", "hook_k"), ("cache_v", "hook_v")):
        if a + c not in acts:
            walk.skip("kv cache", a + c, L, "not dumped")
        elif a + h not in acts or (row.step > 0 and a + c not in row.before):
            walk.skip("kv cache", a + c, L, f"{a + h} or the cache before the step not dumped")
        elif walk.kv_cache == "recomputed":  # only the step's own keys: the older ones were recomputed, not kept
            port, new = acts[a + c], acts[a + h]  # [keys, head, d_head], [new, head, d_head]
            old = len(port) - len(new)
            at = row.keys_real[old:, None, None] if len(row.keys_real) == len(port) else None  # [new, 1, 1]
            walk.judge("kv cache", a + c, L, row.r, port[old:] if old >= 0 else port, new, rl.copy(new, prec),
                       at=at, offset=(max(old, 0), 0, 0))
        else:
            expected = acts[a + h] if row.step == 0 else np.concatenate([row.before[a + c], acts[a + h]])
            at = row.keys_real[:, None, None] if len(row.keys_real) == len(expected) else None  # [keys, 1, 1]
            walk.judge("kv cache", a + c, L, row.r, acts[a + c], expected, rl.copy(expected, prec), at=at)
    if a + "cache_k" in acts and a + "cache_v" in acts:
        return acts[a + "cache_k"], acts[a + "cache_v"]
    earlier = row.before.get(a + "keys"), row.before.get(a + "values")  # no cache dumped: the port's own k, v
    if a + "hook_k" not in acts or a + "hook_v" not in acts or (row.step > 0 and earlier[0] is None):
        return None, None
    if row.step == 0:
        return acts[a + "hook_k"], acts[a + "hook_v"]
    return np.concatenate([earlier[0], acts[a + "hook_k"]]), np.concatenate([earlier[1], acts[a + "hook_v"]])


#: The largest output block (and weight block) an affine op is judged in, float64 bytes: its
#: reference, bound and errors are a few such blocks.
BLOCK_BYTES = 32 * 2**20


class _Held(Mapping):
    """Streaming: ``tensors`` (a mapping, its arrays possibly memory-mapped), each read through
    ``read`` when an op first asks for it and held until the walk lets it go (``keep``), then
    ``release(name)`` drops its file pages. The walk keeps only what the next ops read: a block's
    tensors and the stream handed on, not the model's every activation (at GPT-2 small's shape
    and T = 1024 those are 3.9 GB in float64, a block's 0.3 GB)."""

    def __init__(self, tensors, read, release=None, row=None):
        self.tensors, self.read, self.release, self.row, self.held = tensors, read, release, row, {}
        self.touched = set()  # read as stored (``stored``), not held

    def __getitem__(self, name):
        if name not in self.held:
            self.held[name] = self.read(self.tensors[name])
        return self.held[name]

    def __contains__(self, name):
        return name in self.tensors

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self):
        return len(self.tensors)

    def stored(self, name):
        """``name``'s row as stored (a view of the file where it is mapped), not cast or held: an
        op's output is read a block at a time."""
        if name in self.held:
            return self.held[name]
        self.touched.add(name)
        return self.tensors[name] if self.row is None else self.tensors[name][self.row]

    def keep(self, *names):
        """Let go of every tensor read but ``names``, and of their pages."""
        for name in [n for n in {*self.held, *self.touched} if n not in names]:
            self.held.pop(name, None)
            self.touched.discard(name)
            if self.release is not None:
                self.release(name)


def _forward_row(walk, p, cfg, row, acts, prec, sums):
    tokens, r = row.tokens, row.r
    missing = lambda *names: [n for n in names if n not in acts]  # noqa: E731
    W_pos = p.stored("pos_embed.W_pos")  # [n_ctx, d_model] as given: only the gathered rows are rounded
    positions = np.clip(row.positions, 0, W_pos.shape[0] - 1)  # [new] (a pad's id is not judged)
    gathered = (p.stored("embed.W_E")[tokens], W_pos[positions])  # [new, d_model] each
    for name, ref in zip(("hook_embed", "hook_pos_embed"), (rl.round_to(g, prec.store) for g in gathered)):
        if name in acts:
            walk.judge("embed", name, None, r, acts[name], ref, rl.copy(ref, prec))
        else:
            walk.skip("embed", name, None, "not dumped")
    for L in range(cfg.n_layers):
        b = f"blocks.{L}."
        if L:  # the previous block's tensors and weights are read no more; its output is this block's input
            acts.keep(f"blocks.{L - 1}.hook_resid_post")
            p.keep()
        if L == 0:
            _add(walk, b + "hook_resid_pre", L, r, acts, "hook_embed", "hook_pos_embed", prec, missing)
        elif not missing(b + "hook_resid_pre", f"blocks.{L - 1}.hook_resid_post"):
            ref = acts[f"blocks.{L - 1}.hook_resid_post"]  # [pos, d_model]: the stream handed on
            walk.judge("residual", b + "hook_resid_pre", L, r, acts[b + "hook_resid_pre"], ref, rl.copy(ref, prec))
        h, dh = _layer_norm(walk, acts, b + "ln1.", b + "hook_resid_pre", p, cfg.eps, L, r, prec, missing)
        a = b + "attn."
        for n in "qkv":
            _affine(walk, n, a + f"hook_{n}", L, r, acts, h, dh,
                    p[a + f"W_{n.upper()}"], p[a + f"b_{n.upper()}"], "pd,hde->phe", prec, sums, missing)
        pos = len(row.tokens)
        heads = max(1, BLOCK_BYTES // (8 * pos * pos))  # a head's scores are pos² numbers: 8 MB at T = 1024
        for hs in range(0, cfg.n_heads, heads):
            _attention(walk, cfg, row, acts, a, L, slice(hs, hs + heads), prec, sums, missing)
        _affine(walk, "attn out", b + "hook_attn_out", L, r, acts, acts.get(a + "hook_z"), None,
                p[a + "W_O"], p[a + "b_O"], "phe,hed->pd", prec, sums, missing, a + "hook_z")
        _add(walk, b + "hook_resid_mid", L, r, acts, b + "hook_resid_pre", b + "hook_attn_out", prec, missing)
        h, dh = _layer_norm(walk, acts, b + "ln2.", b + "hook_resid_mid", p, cfg.eps, L, r, prec, missing)
        m = b + "mlp."
        _affine(walk, "mlp pre", m + "hook_pre", L, r, acts, h, dh, p[m + "W_in"], p[m + "b_in"], "pd,dm->pm",
                prec, sums, missing)
        if missing(m + "hook_pre", m + "hook_post"):
            walk.skip(cfg.act_fn, m + "hook_post", L, "not dumped, or pre not dumped")
        elif cfg.act_fn not in ("gelu_new", "gelu_pytorch_tanh"):
            walk.skip(cfg.act_fn, m + "hook_post", L, f"no local bound for {cfg.act_fn} yet (gelu_new only)")
        else:
            ref, bound = rl.gelu_new(acts[m + "hook_pre"], prec)
            walk.judge(cfg.act_fn, m + "hook_post", L, r, acts[m + "hook_post"], ref, bound)
        _affine(walk, "mlp out", b + "hook_mlp_out", L, r, acts, acts.get(m + "hook_post"), None,
                p[m + "W_out"], p[m + "b_out"], "pm,md->pd", prec, sums, missing, m + "hook_post")
        _add(walk, b + "hook_resid_post", L, r, acts, b + "hook_resid_mid", b + "hook_mlp_out", prec, missing)
    last = f"blocks.{cfg.n_layers - 1}.hook_resid_post"
    acts.keep(last)
    p.keep()
    h, dh = _layer_norm(walk, acts, "ln_final.", last, p, cfg.eps, None, r, prec, missing)
    W_U = p.stored("unembed.W_U")  # [d_model, d_vocab] as given: rounded a block at a time
    b_U = p.get("unembed.b_U", np.zeros(W_U.shape[-1]))
    _affine(walk, "logits", "logits", None, r, acts, h, dh, W_U, b_U, "pd,dv->pv", prec, sums, missing)
    _outputs(walk, row, acts, prec, walk.vocab)


def _attention(walk, cfg, row, acts, a, L, hs, prec, sums, missing):
    """Scores, pattern and z of one layer's heads ``hs`` (a slice); the keys and values the port's
    queries read are its own: this pass's k, v, or a decode step's KV cache. Pad keys and the future
    are masked. Judged a block of heads at a time, the [head, query, key] tensors read as stored and
    cast up a block at a time, never held whole."""
    r = row.r
    block = lambda name: np.asarray(acts.stored(name)[hs], np.float64)  # noqa: E731 [heads, query, key]
    kv = (acts.get(a + "hook_k"), acts.get(a + "hook_v")) if row.step is None else _kv_cache(walk, row, acts, L, prec)
    keys = None if kv[0] is None else len(kv[0])
    allowed = None
    if keys is not None and keys == len(row.keys_real):  # [query, key]
        allowed = rl.causal(len(row.tokens), keys) & row.keys_real[None, :]
    if missing(a + "hook_q", a + "hook_attn_scores") or kv[0] is None:
        walk.skip("scores", a + "hook_attn_scores", L, "not dumped, or q, k not dumped")
    elif allowed is None:
        walk.skip("scores", a + "hook_attn_scores", L, f"the KV cache holds {keys} positions, not "
                                                        f"{len(row.keys_real)} (judged at its cache)")
    else:
        ref, bound = rl.scores(acts[a + "hook_q"][:, hs], kv[0][:, hs], cfg.score_scale(L), prec, sums, allowed)
        finite = np.isfinite(ref)  # [head, query, key]: the mask's entries are the port's own affair
        port = block(a + "hook_attn_scores")
        if port.shape == ref.shape:
            port = np.where(finite, port, 0.0)
        walk.judge("scores", a + "hook_attn_scores", L, r, port, np.where(finite, ref, 0.0),
                   np.where(finite, bound, 0.0), sums, offset=(hs.start, 0, 0))
    if missing(a + "hook_attn_scores", a + "hook_pattern") or allowed is None \
            or acts.stored(a + "hook_attn_scores").shape[-1] != allowed.shape[-1]:
        walk.skip("pattern", a + "hook_pattern", L, "not dumped, or scores not dumped")
    else:
        ref, bound = rl.softmax(block(a + "hook_attn_scores"), prec, sums, allowed)
        walk.judge("pattern", a + "hook_pattern", L, r, block(a + "hook_pattern"), ref, bound, sums,
                   offset=(hs.start, 0, 0))
    if missing(a + "hook_pattern", a + "hook_z") or kv[1] is None \
            or acts.stored(a + "hook_pattern").shape[-1] != len(kv[1]):
        walk.skip("z", a + "hook_z", L, "not dumped, or pattern, v not dumped")
    else:
        ref, bound = rl.mix(block(a + "hook_pattern"), kv[1][:, hs], prec, sums)
        walk.judge("z", a + "hook_z", L, r, acts[a + "hook_z"][:, hs], ref, bound, sums, offset=(0, hs.start, 0))


def _outputs(walk, row, acts, prec, vocab):
    """log_probs, probs and the loss from the port's logits (and the loss from its log_probs or probs),
    by the probabilistic kind ``vocab``: a vocabulary's sum is where the worst case is blind. A block
    of positions at a time: a row's [pos, d_vocab] is 412 MB in float64 at T = 1024, and the bounds'
    temporaries are a dozen of it."""
    r = row.r
    logits = acts.stored("logits") if "logits" in acts else None  # [pos, d_vocab] as stored
    everything = None if logits is None else np.ones(logits.shape[-1], bool)  # [vocab]: every logit is read
    real = walk.real  # [pos] or None: the judged positions
    blocks = [] if logits is None else _position_blocks(*logits.shape)
    for name, op, of in (("log_probs", "log_softmax", rl.log_softmax),
                         ("probs", "softmax", lambda x, pr, k: rl.softmax(x, pr, k, everything))):
        if name not in acts:
            continue
        if logits is None:
            walk.skip(op, name, None, "logits not dumped")
            continue
        port = acts.stored(name)  # [pos, d_vocab] as stored: cast up a block at a time
        for s in blocks:
            ref, bound = of(np.asarray(logits[s], np.float64), prec, vocab)  # [block, d_vocab]
            walk.judge(op, name, None, r, port[s], ref, bound, vocab, at=None if real is None else real[s, None],
                       offset=(s.start, 0))
    if "loss" not in acts or row.targets is None:
        return
    loss = acts["loss"]  # [n]
    n = min(len(loss), len(row.targets))
    at, i, t = np.zeros(len(loss), bool), np.arange(n), row.targets[:n]
    at[:n] = row.real[:n] & (row.real[1:n + 1] if len(row.real) > n else True)  # a real position, a real target
    ref, bound = np.zeros(len(loss)), np.zeros(len(loss))
    if "log_probs" in acts:  # −log_probs[t]: a negated copy
        op, k = "loss", None
        ref[:n] = -np.asarray(acts.stored("log_probs")[i, t], np.float64)
        bound = rl.copy(ref, prec)
    elif "probs" in acts:
        op, k = "loss", None
        ref[:n], bound[:n] = rl.neg_log(np.asarray(acts.stored("probs")[i, t], np.float64), prec)
    elif logits is not None:
        op, k = "log_softmax → loss", vocab
        for s in blocks:
            q = np.arange(s.start, min(s.stop, n))  # [block] this block's positions with a target
            y, b = rl.log_softmax(np.asarray(logits[q], np.float64), prec, vocab)  # [block, d_vocab]
            ref[q], bound[q] = -y[q - s.start, t[q]], b[q - s.start, t[q]]
    else:
        walk.skip("loss", "loss", None, "logits not dumped")
        return
    walk.judge(op, "loss", None, r, loss, ref, bound, k, at=at)


def _add(walk, name, L, r, acts, left, right, prec, missing):
    """A residual add; at block 0 the stream is hook_embed + hook_pos_embed."""
    if missing(name, left, right):
        walk.skip("residual", name, L, f"{', '.join(missing(name, left, right))} not dumped")
        return
    ref, bound = rl.add(acts[left], acts[right], prec)
    walk.judge("residual", name, L, r, acts[name], ref, bound)


#: How a port computes its LayerNorms' mean and variance: "two-pass" (L7, the default), "any" (L16).
LAYER_NORMS = ("two-pass", "any")


def _layer_norm(walk, acts, prefix, x_name, p, eps, L, r, prec, missing):
    """The LayerNorm's statistics judged on the port's input; returns what its readers are handed:
    (the port's output and None) if it dumped one, else (w ⊙ x̂ + b from its x̂, that line's bound)
    — the reader is then judged as a span — or (None, None)."""
    w, b = p[prefix + "w"], p[prefix + "b"]
    if walk.layer_norm == "any":  # L16: from the input to the dumped output; no statistic is L7's
        for stat in ("hook_mean", "hook_scale", "hook_normalized"):
            walk.skip(f"ln {stat[5:]}", prefix + stat, L, "layer_norm 'any': the LayerNorm is judged input to output")
        if x_name in acts and prefix + "out" in acts:
            ref, bound = rl.layer_norm_any(acts[x_name], w, b, eps, prec)
            walk.judge("ln", prefix + "out", L, r, acts[prefix + "out"], ref, bound)
            return acts[prefix + "out"], None
        walk.skip("ln", prefix + "out", L, f"{', '.join(missing(x_name, prefix + 'out'))} not dumped")
        return None, None
    if x_name in acts:
        for stat, (ref, bound) in rl.layer_norm(acts[x_name], w, b, eps, prec).items():
            if prefix + stat in acts:
                walk.judge(f"ln {stat[5:]}", prefix + stat, L, r, acts[prefix + stat], ref, bound)
            else:
                walk.skip(f"ln {stat[5:]}", prefix + stat, L, "not dumped")
    else:
        walk.skip("ln", prefix + "hook_scale", L, f"its input {x_name} not dumped")
    if prefix + "hook_normalized" not in acts:  # the readers take the port's dumped output, if any (llm.c's)
        return (acts[prefix + "out"], None) if prefix + "out" in acts else (None, None)
    ref, bound = rl.layer_norm_out(acts[prefix + "hook_normalized"], w, b, prec)
    if prefix + "out" in acts:
        walk.judge("ln out", prefix + "out", L, r, acts[prefix + "out"], ref, bound)
        return acts[prefix + "out"], None
    return ref, bound


def _affine(walk, op, name, L, r, acts, x, dx, W, b, spec, prec, sums, missing, x_name=None):
    """An affine op on the port's input x; ``dx`` not None: x is the LayerNorm output rebuilt from
    the port's x̂, and the op is judged as the span "ln out → op"."""
    if x is None or name not in acts:
        what = missing(name, *([x_name] if x_name else [])) or ["its LayerNorm's normalized"]
        walk.skip(op, name, L, f"{', '.join(what)} not dumped")
        return
    port = acts.stored(name)  # [pos, …] as stored, not held: cast up a block at a time
    # Blocks of the output's last axis, which is W's and b's last too (d_vocab for the logits: at GPT-2
    # small's shape and T = 1024 they are 412 MB a row in float64, W_U 309 MB): each column its own sum.
    cols = max(1, BLOCK_BYTES // (8 * max(port[..., 0].size, W[..., 0].size)))
    for c in range(0, port.shape[-1], cols):
        w = rl.round_to(W[..., c:c + cols], prec.store)  # [..., cols] the port's weights (W_U given as stored)
        ref, bound = rl.affine(x, w, b[..., c:c + cols], spec, prec, sums, dx)
        walk.judge(op if dx is None else f"ln out → {op}", name, L, r, port[..., c:c + cols], ref, bound, sums,
                   offset=(0,) * (port.ndim - 1) + (c,))


# ---- the backward: each op's backward from the port's own upstream gradient and saved values ------

#: A gradient whose last name part is one of these is an activation's (judged row by row); any
#: other ``grad.`` name is a parameter's (summed over the batch: judged whole).
_ACTIVATION_LEAVES = ("out", "logits")


def _is_parameter_gradient(name):
    leaf = name.rsplit(".", 1)[-1]
    return is_gradient(name) and not leaf.startswith("hook_") and leaf not in _ACTIVATION_LEAVES


def _judged(walk, op, name, L, r, acts, needs, compute, kind=None, heads=None):
    """Judge ``name`` by ``compute()`` → (reference, bound) when it and ``needs`` were dumped, else
    skip it naming what was not. True if judged (``compute`` None: if it can be, by the caller).
    ``heads`` (a slice of heads, their axis): the block of ``name`` at those heads, read as stored."""
    lacking = [n for n in (name, *needs) if n not in acts]
    if lacking:
        walk.skip(op, name, L, f"{', '.join(lacking)} not dumped")
        return False
    if compute is None:
        return True
    ref, bound = compute()
    port, offset = acts[name], ()
    if heads is not None:
        hs, axis = heads
        port = np.asarray(acts.stored(name)[(slice(None),) * axis + (hs,)], np.float64)
        offset = (0,) * axis + (hs.start,)
    walk.judge(op, name, L, r, port, ref, bound, kind, offset=offset)
    return True


def _backward(walk, p, cfg, tokens, acts, per_row, release, prec, sums, targets):
    """The backward, streamed in the order it computes: the loss and the unembedding, then each block
    from the last to the first, then the embeddings. Each row reads a block's saved activations and
    gradients (``_Held``) when the walk reaches that block and lets them go, with their pages, when it
    leaves (keeping the gradient handed on: ∂resid_pre); each block's parameters' gradients (sums
    over the rows and positions) are judged when the walk leaves it; the vocabulary's (W_U, b_U, W_E,
    tied_W_E) a block of the vocabulary at a time, last. ``targets`` [batch, pos] (−100: none)."""
    G, count = GRAD, int((targets >= 0).sum())
    rows = [_Held(per_row, lambda a, r=r: np.asarray(a[r], np.float64), release, r) for r in range(len(tokens))]
    whole = _Held(acts, lambda a: np.asarray(a, np.float64), release)  # [batch, …]: the parameters' gradients'
    last = f"blocks.{cfg.n_layers - 1}."
    for r, row in enumerate(rows):
        _backward_top(walk, p, cfg, row, r, prec, sums, targets[r], count)
        row.keep(G + last + "hook_resid_post")
    p.keep()
    _ln_weight_gradients(walk, whole, p, "ln_final.", None, last + "hook_resid_post", np.ones(tokens.shape), prec,
                         sums)
    whole.keep()
    for L in reversed(range(cfg.n_layers)):
        for r, row in enumerate(rows):
            _backward_block(walk, p, cfg, row, L, r, prec, sums)
            row.keep(G + f"blocks.{L}.hook_resid_pre")
        _block_weight_gradients(walk, whole, p, L, np.ones(tokens.shape), prec, sums)
        whole.keep()
        p.keep()
    for r, row in enumerate(rows):
        for name in ("hook_embed", "hook_pos_embed"):
            _copy(walk, G + name, G + "blocks.0.hook_resid_pre", None, r, row, prec, "embed backward")
        row.keep()
    _vocabulary_gradients(walk, whole, p, cfg, tokens, prec, sums)
    whole.keep()


def _position_blocks(n_positions, width):
    """Slices of at most BLOCK_BYTES of float64 [position, width] rows."""
    step = max(1, BLOCK_BYTES // (8 * width))
    return [slice(i, min(i + step, n_positions)) for i in range(0, n_positions, step)]


def _backward_top(walk, p, cfg, acts, r, prec, sums, targets, count):
    """The loss's backward (L14) and the unembedding's (L3), a block of positions at a time (a row's
    [pos, d_vocab] is 412 MB in float64 at T = 1024), then ln_final's backward."""
    G = GRAD
    if _judged(walk, "loss backward", G + "logits", None, r, acts, ["logits"], None):
        for at in _position_blocks(acts.stored("logits").shape[0], acts.stored("logits").shape[-1]):
            ref, bound = rl.cross_entropy_backward(np.asarray(acts.stored("logits")[at], np.float64), targets[at],
                                                   count, prec, sums)
            walk.judge("loss backward", G + "logits", None, r, np.asarray(acts.stored(G + "logits")[at], np.float64),
                       ref, bound, sums, offset=(at.start, 0))

    def unembed():  # ∂ln_final.out = ∂logits·W_Uᵀ: [pos, d_model], a block of positions and of W_U's rows
        logits, W_U = acts.stored(G + "logits"), p.stored("unembed.W_U")  # [pos, d_vocab], [d_model, d_vocab]
        ref, bound = np.empty((logits.shape[0], W_U.shape[0])), np.empty((logits.shape[0], W_U.shape[0]))
        rows = _position_blocks(W_U.shape[0], W_U.shape[-1])  # each output's sum over the vocabulary whole
        for at in _position_blocks(logits.shape[0], logits.shape[-1]):
            d_logits = np.asarray(logits[at], np.float64)  # [block, d_vocab]
            for d in rows:  # the rounded W_U and its |W_U| a block of rows at a time (309 MB each whole)
                ref[at, d], bound[at, d] = rl.affine(d_logits, rl.round_to(W_U[d], prec.store), 0.0, "pv,dv->pd",
                                                     prec, sums)
        return ref, bound

    reader = ("unembed backward", [G + "logits"], unembed)
    _judged(walk, reader[0], G + "ln_final.out", None, r, acts, reader[1], reader[2], sums)
    last = f"blocks.{cfg.n_layers - 1}."
    _ln_backward(walk, acts, "ln_final.", last + "hook_resid_post", None, reader, p, None, r, prec, sums)


def _backward_block(walk, p, cfg, acts, L, r, prec, sums):
    """Block L's activation gradients for row ``r``, in the order the backward computes them."""
    G = GRAD
    b, a, m = f"blocks.{L}.", f"blocks.{L}.attn.", f"blocks.{L}.mlp."
    if L < cfg.n_layers - 1:
        _copy(walk, G + b + "hook_resid_post", G + f"blocks.{L + 1}.hook_resid_pre", L, r, acts, prec)
    _copy(walk, G + b + "hook_mlp_out", G + b + "hook_resid_post", L, r, acts, prec)
    _judged(walk, "W_out backward", G + m + "hook_post", L, r, acts, [G + b + "hook_mlp_out"],
            lambda: rl.affine(acts[G + b + "hook_mlp_out"], p[m + "W_out"], 0.0, "pd,md->pm", prec, sums), sums)
    _judged(walk, f"{cfg.act_fn} backward", G + m + "hook_pre", L, r, acts, [m + "hook_pre", G + m + "hook_post"],
            lambda: rl.activation_backward(cfg.act_fn, acts[m + "hook_pre"], acts[G + m + "hook_post"], prec))
    w_in = ("W_in backward", [G + m + "hook_pre"],
            lambda: rl.affine(acts[G + m + "hook_pre"], p[m + "W_in"], 0.0, "pm,dm->pd", prec, sums))
    _judged(walk, w_in[0], G + b + "ln2.out", L, r, acts, w_in[1], w_in[2], sums)
    _ln_backward(walk, acts, b + "ln2.", b + "hook_resid_mid", G + b + "hook_resid_post", w_in, p, L, r, prec, sums)
    _copy(walk, G + b + "hook_attn_out", G + b + "hook_resid_mid", L, r, acts, prec)
    _judged(walk, "W_O backward", G + a + "hook_z", L, r, acts, [G + b + "hook_attn_out"],
            lambda: rl.affine(acts[G + b + "hook_attn_out"], p[a + "W_O"], 0.0, "pd,hed->phe", prec, sums), sums)
    _attention_backward(walk, acts, a, L, r, cfg, prec, sums)
    qkv = ("q, k, v backward", [G + a + f"hook_{n}" for n in "qkv"], lambda: _qkv_backward(acts, p, a, prec, sums))
    _judged(walk, qkv[0], G + b + "ln1.out", L, r, acts, qkv[1], qkv[2], sums)
    _ln_backward(walk, acts, b + "ln1.", b + "hook_resid_pre", G + b + "hook_resid_mid", qkv, p, L, r, prec, sums)


def _copy(walk, name, source, L, r, acts, prec, op="residual backward"):
    """A residual connection hands its gradient on unchanged (L1)."""
    _judged(walk, op, name, L, r, acts, [source], lambda: (acts[source], rl.copy(acts[source], prec)))


def _attention_backward(walk, acts, a, L, r, cfg, prec, sums):
    """∂z → ∂pattern and ∂v (L3), the softmax's backward (L13), ∂scores → ∂q and ∂k (L3 with the scale):
    a block of heads at a time, as the forward's attention, its [head, query, key] tensors read as
    stored and cast up a block at a time."""
    G, scale = GRAD, cfg.score_scale(L)
    pos = next((acts[n].shape[0] for n in (a + "hook_q", a + "hook_v") if n in acts), 0)
    future = np.triu(np.ones((pos, pos), dtype=bool), k=1)  # [query, key]: never read, never judged
    step = max(1, BLOCK_BYTES // (8 * max(pos, 1) ** 2))  # heads per block
    for hs in (slice(h, min(h + step, cfg.n_heads)) for h in range(0, cfg.n_heads, step)):
        block = lambda name, hs=hs: np.asarray(acts.stored(name)[hs], np.float64)  # noqa: E731 [heads, query, key]
        part = lambda name, hs=hs: acts[name][:, hs]  # noqa: E731 [pos, heads, d_head]

        def pattern_grad(hs=hs):
            ref, bound = rl.affine(part(G + a + "hook_z"), part(a + "hook_v"), 0.0, "qhe,khe->hqk", prec, sums)
            return np.where(future, block(G + a + "hook_pattern"), ref), np.where(future, 0.0, bound)

        _judged(walk, "z backward → pattern", G + a + "hook_pattern", L, r, acts, [G + a + "hook_z", a + "hook_v"],
                pattern_grad, sums, (hs, 0))
        _judged(walk, "z backward → v", G + a + "hook_v", L, r, acts, [G + a + "hook_z", a + "hook_pattern"],
                lambda: rl.affine(block(a + "hook_pattern"), part(G + a + "hook_z"), 0.0, "hqk,qhe->khe", prec, sums),
                sums, (hs, 1))
        _judged(walk, "softmax backward", G + a + "hook_attn_scores", L, r, acts,
                [G + a + "hook_pattern", a + "hook_pattern"],
                lambda: rl.softmax_backward(block(a + "hook_pattern"),
                                            np.where(future, 0.0, block(G + a + "hook_pattern")), prec, sums),
                sums, (hs, 0))
        for n, spec, other in (("q", "hqk,khe->qhe", "hook_k"), ("k", "hqk,qhe->khe", "hook_q")):
            _judged(walk, f"scores backward → {n}", G + a + f"hook_{n}", L, r, acts,
                    [G + a + "hook_attn_scores", a + other],
                    lambda spec=spec, other=other: rl.affine(block(G + a + "hook_attn_scores"), part(a + other), 0.0,
                                                             spec, prec, sums, scale=scale), sums, (hs, 1))


def _qkv_backward(acts, p, a, prec, sums):
    """∂ln1.out = ∂q·W_Qᵀ + ∂k·W_Kᵀ + ∂v·W_Vᵀ: one sum of 3·n_heads·d_head terms (llm.c's one matmul),
    or three and two adds: each partial product and sum stored, 2·(u_el + u_store) more."""
    dqkv = np.concatenate([acts[GRAD + a + f"hook_{n}"] for n in "qkv"], axis=1)  # [pos, 3·head, d_head]
    W = np.concatenate([p[a + f"W_{n}"] for n in "QKV"])  # [3·head, d_model, d_head]
    ref, bound = rl.affine(dqkv, W, 0.0, "phe,hde->pd", prec, sums)
    magnitude = np.einsum("phe,hde->pd", np.abs(dqkv), np.abs(W), optimize=True)  # [pos, d_model]
    return ref, bound + 2 * (prec.u_el + prec.u_store) * magnitude


def _ln_backward(walk, acts, prefix, x_name, upstream, reader, p, L, r, prec, sums):
    """LayerNorm ``prefix``'s backward (L12) from the port's ∂out, x̂ and σ, plus the ``upstream``
    residual gradient (L2; None for ln_final): judged at ∂``x_name``. Without a dumped ∂out, from
    ``reader`` = (its op, its inputs, compute → (∂out, bound)) as the span "reader → ln backward";
    without a dumped x̂, x̂ = (x − μ)/σ from the port's x, μ and σ (llm.c's: two roundings at u_el)."""
    G, w = GRAD, p[prefix + "w"]
    name, op = G + x_name, "ln backward"
    if G + prefix + "out" in acts:
        grad, dgrad = acts[G + prefix + "out"], None
    elif all(n in acts for n in reader[1]):
        (grad, dgrad), op = reader[2](), f"{reader[0]} → ln backward"
    else:
        walk.skip(op, name, L, f"{G + prefix}out not dumped, nor {', '.join(reader[1])}")
        return
    normalized, dnormalized = _normalized(acts, prefix, x_name, prec)
    if normalized is None:
        walk.skip(op, name, L, f"{prefix}hook_normalized not dumped, nor {x_name}, {prefix}hook_mean")
        return
    needs = [prefix + "hook_scale"] + ([upstream] if upstream else [])
    if G + prefix + "hook_normalized" in acts and dgrad is None:  # ∂x̂ = ∂out ⊙ w: one product
        _judged(walk, "ln backward x̂", G + prefix + "hook_normalized", L, r, acts, [], lambda: (
            y := grad * w, (prec.u_el + prec.u_store + rl.U) * np.abs(y)))

    def compute():
        dx, bound = rl.layer_norm_backward(grad, w, normalized, acts[prefix + "hook_scale"], prec, sums, dgrad,
                                           dnormalized)
        if upstream is None:
            return dx, bound
        y, added = rl.add(acts[upstream], dx, prec)
        return y, bound + added

    _judged(walk, op, name, L, r, acts, needs, compute, sums)


def _normalized(acts, prefix, x_name, prec):
    """(x̂, None) as the port dumped it, or (x̂ = (x − μ)/σ from the port's x, μ and σ, and the bound
    on the port's own x̂: llm.c's (x − μ)·rstd, two roundings at u_el), or (None, None)."""
    if prefix + "hook_normalized" in acts:
        return np.asarray(acts[prefix + "hook_normalized"], np.float64), None
    if all(n in acts for n in (x_name, prefix + "hook_mean", prefix + "hook_scale")):
        normalized = (np.asarray(acts[x_name], np.float64) - acts[prefix + "hook_mean"]) / acts[prefix + "hook_scale"]
        return normalized, (gamma(2, prec.u_el) + 2 * rl.U) * np.abs(normalized)  # [(batch,) pos, d_model]
    return None, None


def _parameter_order(cfg):
    """The parameters' gradients as the report lists them, after every activation's: the
    unembedding's, the LayerNorms', each block's weights, the embeddings'."""
    names = ["unembed.W_U", "unembed.b_U", "ln_final.w", "ln_final.b"]
    names += [f"blocks.{L}.{ln}{x}" for L in range(cfg.n_layers) for ln in ("ln1.", "ln2.") for x in "wb"]
    names += [f"blocks.{L}.{n}" for L in range(cfg.n_layers) for n in (
        "mlp.W_out", "mlp.b_out", "mlp.W_in", "mlp.b_in", "attn.W_O", "attn.b_O", "attn.W_Q", "attn.b_Q", "attn.W_K",
        "attn.b_K", "attn.W_V", "attn.b_V")]
    return {GRAD + n: i for i, n in enumerate(names + ["embed.W_E", "pos_embed.W_pos", "tied_W_E"])}


def _weight(walk, acts, name, L, x, dx, g_name, spec, x_name, prec, sums, needed=False, cols=slice(None)):
    """Judge ∂``name`` (a sum over the batch's rows and positions: L3 with k = batch·pos) if dumped,
    at the output's last-axis block ``cols`` (the gradient's too); (reference, bound) if judged or
    ``needed`` (tied_W_E's part)."""
    G = GRAD
    lacking = [n for n in ([] if needed else [G + name]) + [g_name] if n not in acts] + (
        [] if x is not None else [x_name])
    if lacking:
        walk.skip("weight backward", G + name, L, f"{', '.join(lacking)} not dumped")
        return None
    g = acts[g_name] if cols == slice(None) else np.asarray(acts.stored(g_name)[..., cols], np.float64)
    ref, bound = rl.affine(x, g, 0.0, spec, prec, sums, dx, stored=True)
    if G + name in acts:
        port = acts[G + name] if cols == slice(None) else np.asarray(acts.stored(G + name)[..., cols], np.float64)
        walk.judge("weight backward", G + name, L, None, port, ref, bound, sums,
                   offset=(0,) * (port.ndim - 1) + (cols.start or 0,))
    return ref, bound


def _ln_out(acts, p, prefix, prec):
    """The forward's LayerNorm output as the port handed it on, with its bound if rebuilt from x̂."""
    if prefix + "out" in acts:
        return acts[prefix + "out"], None
    if prefix + "hook_normalized" in acts:
        return rl.layer_norm_out(acts[prefix + "hook_normalized"], p[prefix + "w"], p[prefix + "b"], prec)
    return None, None


def _ln_weight_gradients(walk, acts, p, prefix, L, x_name, ones, prec, sums):
    """∂w and ∂b of LayerNorm ``prefix`` from the port's ∂out and x̂ (or x, μ and σ); ``ones`` [batch, pos]."""
    normalized, d_normalized = _normalized(acts, prefix, x_name, prec)
    g_name = GRAD + prefix + "out"
    _weight(walk, acts, prefix + "w", L, normalized, d_normalized, g_name, "bpd,bpd->d", prefix + "hook_normalized",
            prec, sums)
    _weight(walk, acts, prefix + "b", L, ones, None, g_name, "bp,bpd->d", "", prec, sums)


def _block_weight_gradients(walk, acts, p, L, ones, prec, sums):
    """Block L's parameters' gradients, from the port's own gradients and forward values (``acts``
    [batch, …] each, read when needed and let go when the walk leaves the block); ``ones`` [batch, pos]."""
    G, b, a, m = GRAD, f"blocks.{L}.", f"blocks.{L}.attn.", f"blocks.{L}.mlp."
    A = lambda name: acts[name] if name in acts else None  # noqa: E731
    for weight, bias, x, dx, g_name, spec, bias_spec, x_name in (
            (m + "W_out", m + "b_out", A(m + "hook_post"), None, G + b + "hook_mlp_out", "bpm,bpd->md", "bp,bpd->d",
             m + "hook_post"),
            (m + "W_in", m + "b_in", *_ln_out(acts, p, b + "ln2.", prec), G + m + "hook_pre", "bpd,bpm->dm",
             "bp,bpm->m", b + "ln2.out"),
            (a + "W_O", a + "b_O", A(a + "hook_z"), None, G + b + "hook_attn_out", "bphe,bpd->hed", "bp,bpd->d",
             a + "hook_z"),
            *((a + f"W_{n}", a + f"b_{n}", *_ln_out(acts, p, b + "ln1.", prec), G + a + f"hook_{n.lower()}",
               "bpd,bphe->hde", "bp,bphe->he", b + "ln1.out") for n in "QKV")):
        _weight(walk, acts, weight, L, x, dx, g_name, spec, x_name, prec, sums)
        _weight(walk, acts, bias, L, ones, None, g_name, bias_spec, "", prec, sums)
    _ln_weight_gradients(walk, acts, p, b + "ln2.", L, b + "hook_resid_mid", ones, prec, sums)
    _ln_weight_gradients(walk, acts, p, b + "ln1.", L, b + "hook_resid_pre", ones, prec, sums)


def _vocabulary_gradients(walk, acts, p, cfg, tokens, prec, sums):
    """∂W_U, ∂b_U (L3), ∂W_E (a scatter-add over the tokens, L15), ∂W_pos and ∂tied_W_E (the two
    summed), a block of the vocabulary at a time: each is [d_vocab, d_model] (309 MB in float64 at
    GPT-2's vocabulary), their references and bounds a few times that."""
    G = GRAD
    B, pos = tokens.shape
    flat = tokens.reshape(-1)  # [batch·pos]
    final, d_final = _ln_out(acts, p, "ln_final.", prec)
    embed = next((n for n in (G + "hook_embed", G + "blocks.0.hook_resid_pre") if n in acts), None)
    tied = G + "tied_W_E" in acts
    most = int(np.bincount(flat, minlength=cfg.d_vocab).max()) if flat.size else 0  # L15's largest count
    cols = max(1, BLOCK_BYTES // (8 * cfg.d_model))
    for c in range(0, cfg.d_vocab, cols):
        at = slice(c, min(c + cols, cfg.d_vocab))
        W_U = _weight(walk, acts, "unembed.W_U", None, final, d_final, G + "logits", "bpd,bpv->dv", "ln_final.out",
                      prec, sums, needed=tied, cols=at)
        if "unembed.b_U" in p:
            _weight(walk, acts, "unembed.b_U", None, np.ones((B, pos)), None, G + "logits", "bp,bpv->v", "", prec,
                    sums, cols=at)
        if embed is None:
            continue
        inside = (flat >= at.start) & (flat < at.stop)  # [batch·pos] the positions holding this block's tokens
        grad = acts[embed].reshape(B * pos, -1)[inside]  # [n, d_model]
        # L15 at this block's tokens; a phantom token (gradient 0) holding the largest count keeps the
        # probabilistic kind's λ (from the largest count) the whole vocabulary's
        W_E = rl.scatter(np.concatenate([flat[inside] - at.start, np.full(most, at.stop - at.start)]),
                         np.concatenate([grad, np.zeros((most, grad.shape[-1]))]), at.stop - at.start + 1, prec, sums)
        W_E = tuple(e[:-1] for e in W_E)  # [block, d_model] each
        if G + "embed.W_E" in acts:
            walk.judge("weight backward", G + "embed.W_E", None, None,
                       np.asarray(acts.stored(G + "embed.W_E")[at], np.float64), *W_E, sums, offset=(at.start, 0))
        if tied and W_U is not None:  # one matrix used twice: the two summed
            ref, bound = rl.add(W_E[0], W_U[0].T, prec)
            walk.judge("weight backward", G + "tied_W_E", None, None,
                       np.asarray(acts.stored(G + "tied_W_E")[at], np.float64), ref, bound + W_E[1] + W_U[1].T, sums,
                       offset=(at.start, 0))
    if embed is not None and G + "pos_embed.W_pos" in acts:
        ref, bound = rl.affine(np.ones(B), acts[next((n for n in (G + "hook_pos_embed", embed) if n in acts))], 0.0,
                               "b,bpd->pd", prec, sums, stored=True)
        full = np.zeros(p.stored("pos_embed.W_pos").shape)  # [n_ctx, d_model]: the positions not used get 0
        full_bound = full.copy()
        full[:pos], full_bound[:pos] = ref, bound
        walk.judge("weight backward", G + "pos_embed.W_pos", None, None, acts[G + "pos_embed.W_pos"], full, full_bound,
                   sums)


def judge_files(reference, candidate, model, name_map="refgpt", precision=None, kind="worst", forward_only=False,
                layer_norm="two-pass", kv_cache="kept"):
    """``refgpt compare --local``: (LocalReport, None), or (None, the one line saying why local
    verdicts were skipped). ``model`` is the checkpoint's Model in float64 (or None: skipped); a
    golden that recorded its weights' sha256 must have been made from ``model``'s files."""
    if model is None:
        return None, ("local verdicts skipped: no weights (give --local-model DIR, the checkpoint the golden was "
                      "made from)")
    ref, _, g = comparison.load(reference)
    steps = sorted({split_step(n)[0] for n in ref} - {None})
    recorded = json.loads(g.metadata.get("weights_sha256", "{}")) if g is not None else {}
    if recorded and recorded != weight_hashes(model.source):
        raise RefGPTError(f"{model.source}: not the weights {reference} was made from (its recorded weights_sha256 "
                          f"differs): local verdicts need the golden's own checkpoint")
    shape = comparison._model_shape(ref, g)
    if steps and isinstance(candidate, (str, Path)) and Path(candidate).is_dir():  # llm.c's per-step dumps
        candidate, name_map = llmc_dump.read_steps(candidate, ref, g), "refgpt"
    cand, dtypes, cand_file = comparison.load(candidate, name_map, shape)
    if cand is None:  # an llm.c .bin: its activations, losses and gradients
        cand = {k: v for k, v in comparison._read_llmc_bin(candidate, ref, g).items()
                if not k.startswith(("tokens", "targets"))}
    if name_map == "llmc" and any(k.startswith(("grads.", "grads_acts.")) for k in cand):
        if g is None or g.config is None:
            raise RefGPTError("llm.c gradients need a refgpt golden file as the reference (its config gives the "
                              "model's shape)")
        cand, _ = llmc_dump.to_refgpt_gradients(cand, g.config)
    cand, _ = (decode_to_refgpt(cand, name_map, shape, steps[-1]) if steps else to_refgpt(cand, name_map, shape))
    if forward_only:
        cand = {k: v for k, v in cand.items() if not is_gradient(k)}
    precision = precision or comparison.default_profile(cand, dtypes)
    golden = lambda name, row: ref[name][row] if name in ref else None  # noqa: E731 — as stored: judge reads its block
    if steps:
        return judge_decode(model.params, model.cfg, ref, cand, precision, kind, golden, layer_norm=layer_norm,
                            kv_cache=kv_cache), None

    def release(name):  # the pages of a tensor the walk is done with, in both files
        if cand_file is not None and name_map == "refgpt":
            cand_file.release(name)
        if g is not None:
            g.release(name)

    return judge(model.params, model.cfg, np.asarray(ref["tokens"]), cand, precision, kind, golden,
                 targets=ref.get("targets"), attention_mask=ref.get("attention_mask"),
                 position_ids=ref.get("position_ids"), layer_norm=layer_norm, release=release), None


def embedded_if_recorded(reference):
    """The embedded model in float64 if ``reference`` is a golden that recorded having been made from
    it (its weights_sha256), else None: found from the golden's own record, never guessed."""
    _, _, g = comparison.load(reference)
    recorded = json.loads(g.metadata.get("weights_sha256", "{}")) if g is not None else {}
    path = default_model_path()
    if recorded and recorded == weight_hashes(path):
        return load_checkpoint(path, dtype="float64", tokenizer=False)
    return None


def format_local(report: LocalReport, all_ops=False, out_of_tolerance=()) -> str:
    """The per-op table and the verdict, as ``refgpt compare --local`` prints them; a tensor in
    ``out_of_tolerance`` (the whole-tensor comparison's failures) whose op is clean says "inherited"."""
    lines = [f"local verdicts at {report.precision}: each op recomputed in float64 from the port's own inputs"]
    first = report.first
    if first is None:
        lines.append(f"OK: no op introduced an error beyond its bound ({sum(v.skipped is None for v in report.ops)}"
                     " ops judged)")
    elif first.mismatch:
        lines.append(f"FIRST LOCAL FAILURE: {first.op} at {first.name} ({_where(first)}row {first.row}): "
                     f"{first.mismatch}")
    else:
        where = "summed over the batch" if first.index[0] is None else f"row {first.index[0]}"
        lines.append(f"FIRST LOCAL FAILURE: {first.op} at {first.name} ({_where(first)}{where}, index "
                     f"{list(first.index[1:])}): port {first.port:.9g}, reference {first.reference:.9g}, "
                     f"introduced {first.introduced:.3g} > bound {first.bound:.3g}"
                     + ("" if first.inherited is None else f", inherited {first.inherited:.3g}"))
    lines.append(f"{'op':20s} {'tensor':34s} {'worst/bound':>11s} {'NMSE':>9s} {'SNR dB':>7s}  bound")
    for v in report.ops:
        if v.skipped:
            if all_ops:
                lines.append(f"{v.op:20s} {v.name:34s} skipped: {v.skipped}")
            continue
        note = "  FLAGGED" if v.flagged else ("  out of tolerance, op clean: inherited" if v.name in out_of_tolerance
                                               else "")
        lines.append(f"{v.op:20s} {v.name:34s} {v.ratio:11.3g} {v.nmse:9.2g} {v.snr_db:7.1f}  {v.kind}{note}")
    return "\n".join(lines)


def _where(v: OpVerdict) -> str:
    return "" if v.step is None else f"step {v.step}, "
