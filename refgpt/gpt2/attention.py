"""Causal multi-head self-attention, head by head in circuits notation.

For each head h, with x the LayerNorm'd residual stream [pos, d_model]:

    q = x·W_Q[h] + b_Q[h]        k = x·W_K[h] + b_K[h]        v = x·W_V[h] + b_V[h]   [pos, d_head]
    scores  = q·kᵀ · s            s = 1/√d_head (and /(layer+1) if configured)      [query, key]
    scores[i, j] = −∞ for j > i   (a position sees only itself and the past)
    pattern = softmax(scores)     each row sums to 1, masked entries are exactly 0  [query, key]
    z = pattern·v                                                                    [pos, d_head]
    out = Σ_h z[h]·W_O[h] + b_O                                                      [pos, d_model]

The heads are computed together. W_Q [head, d_model, d_head] holds the same numbers as one
[d_model, head·d_head] matrix, so q for every head is one matrix product; Σ_h z[h]·W_O[h] is one
product of z [pos, head·d_head] with W_O seen as [head·d_head, d_model]; and q, k, v are one
product with W_Q | W_K | W_V side by side (as GPT-2's checkpoints store them, c_attn). The model
hands this module its weights in that flat layout (``Model.block_weights``).

``attention_backward`` (beside the forward) takes the gradient back through every line above.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .activations import softmax
from .linear import affine
from .. import memory
from ..memory import buffer

#: Queries per block of the blocked attention (``attend_in_blocks``, ``attend``), and so the size of
#: the scratch buffer that holds one block's scores (``block_scores_size``).
ROWS = 64


def attention(x, w, n_heads, score_scale, run_hooks, past=None, score_mask=None, per_head_result=False, out=None):
    """One block's attention. ``w``: W_QKV = W_Q | W_K | W_V [d_model, 3·head·d_head] and b_QKV
    (or only W_Q, W_K, W_V [d_model, head·d_head] and b_Q, b_K, b_V [head·d_head], joined here),
    W_O [head·d_head, d_model], b_O [d_model]. ``run_hooks(name, a)`` runs the hooks at a hook point (a
    HookRun's scope); ``run_hooks.watched(name)`` / ``run_hooks.hooked(name)`` say whether a hook or the cache / a
    hook will see ``name`` (refgpt/tl/hooks.py): the full scores and pattern are made only then.
    ``past(k, v)``, in incremental decoding, stores the new keys and values and returns all of them.
    ``score_mask``: None (causal), or padding's [batch, 1, query, key] mask of 0 and −∞, added to the
    scores (refgpt/gpt2/padding.py).
    ``per_head_result`` (TransformerLens's use_attn_result): make each head's z[h]·W_O[h]
    [batch, pos, head, d_model] at ``hook_result`` and sum those (a different rounding).
    ``x`` may also be three per-head inputs (x_q, x_k, x_v), each [batch, pos, head, d_model]:
    TransformerLens's use_attn_in / use_split_qkv_input, head h's q read from x_q[:, :, h].
    ``out``: the [batch, pos, d_model] array to write the result into (default: a new one). What no
    hook point shows (the heads' copies; q|k|v and z when unwatched) goes into the pass's scratch
    buffers (``run_hooks.buffer``, refgpt/memory.py)."""
    if isinstance(x, tuple):
        x_q, x_k, x_v = x  # [batch, pos, head, d_model] each
        batch, pos = x_q.shape[:2]
        q = run_hooks("hook_q", per_head_affine(x_q, w["W_Q"], w["b_Q"], n_heads))  # [batch, pos, head, d_head]
        k = run_hooks("hook_k", per_head_affine(x_k, w["W_K"], w["b_K"], n_heads))  # [batch, pos, head, d_head]
        v = run_hooks("hook_v", per_head_affine(x_v, w["W_V"], w["b_V"], n_heads))  # [batch, pos, head, d_head]
    else:
        batch, pos, _ = x.shape
        # q = x·W_Q + b_Q, k = x·W_K + b_K, v = x·W_V + b_V, as one product with W_Q | W_K | W_V:
        W_QKV, b_QKV = fused_qkv(w)
        qkv = affine(x, W_QKV, b_QKV, out=buffer(run_hooks, "qkv", (batch, pos, W_QKV.shape[-1]), x.dtype,
                                                 "hook_q", "hook_k", "hook_v"))
        qkv = qkv.reshape(batch, pos, 3, n_heads, -1)  # [batch, pos, q|k|v, head, d_head]
        q = run_hooks("hook_q", qkv[:, :, 0])  # [batch, pos, head, d_head]
        k = run_hooks("hook_k", qkv[:, :, 1])  # [batch, pos, head, d_head]
        v = run_hooks("hook_v", qkv[:, :, 2])  # [batch, pos, head, d_head]

    if past is not None:
        k, v = past(k, v)  # [batch, key, head, d_head]: the earlier positions' keys, then these

    per_head = (0, 2, 1, 3)  # [batch, pos, head, d_head] → [batch, head, pos, d_head]
    qh = np.multiply(q, score_scale, out=buffer(run_hooks, "q_scaled", q.shape, q.dtype))  # [batch, pos, head, d_head]
    qh = qh.transpose(per_head)  # [batch, head, query, d_head], the scale applied once here
    kh = _copy(k.transpose(per_head), buffer(run_hooks, "k_heads", _swapped(k.shape), k.dtype))  # [batch, head, key, d_head]
    vh = _copy(v.transpose(per_head), buffer(run_hooks, "v_heads", _swapped(v.shape), v.dtype))  # [batch, head, key, d_head]
    z = buffer(run_hooks, "z", q.shape, q.dtype, "hook_z")  # [batch, pos, head, d_head], written head by head below
    space = buffer(run_hooks, "block_scores", (block_scores_size(qh, kh),), q.dtype)  # each block's scores in turn
    if run_hooks.watched("hook_attn_scores") or run_hooks.watched("hook_pattern"):
        attend(qh, kh, vh, run_hooks, score_mask, out=z.transpose(per_head), space=space)  # the full arrays made for the hooks
    else:
        attend_in_blocks(qh, kh, vh, score_mask, out=z.transpose(per_head), space=space)  # the same numbers
    z = run_hooks("hook_z", z)  # [batch, pos, head, d_head]
    if per_head_result:
        W_O = w["W_O"].reshape(n_heads, -1, w["W_O"].shape[-1])  # [head, d_head, d_model]
        result = run_hooks("hook_result", np.einsum("bphd,hdm->bphm", z, W_O))  # [batch, pos, head, d_model]
        return np.add(result.sum(axis=2), w["b_O"], out=out)  # [batch, pos, d_model]
    return affine(z.reshape(batch, pos, -1), w["W_O"], w["b_O"], out=out)  # [batch, pos, d_model]


def _swapped(shape):
    """[batch, pos, head, d_head] → [batch, head, pos, d_head]."""
    return (shape[0], shape[2], shape[1], shape[3])


def _copy(source, dest):
    """``source`` copied into ``dest`` (C order), which is returned: np.ascontiguousarray's numbers."""
    np.copyto(dest, source)
    return dest


def fused_qkv(w):
    """(W_QKV, b_QKV) of a block's weights ``w``: as the model keeps them (a view of the checkpoint's
    c_attn), or joined from W_Q, W_K, W_V and b_Q, b_K, b_V (a copy) when ``w`` has only those."""
    if "W_QKV" in w:
        return w["W_QKV"], w["b_QKV"]
    return (np.concatenate([w["W_Q"], w["W_K"], w["W_V"]], axis=-1),  # [d_model, 3·head·d_head]
            np.concatenate([w["b_Q"], w["b_K"], w["b_V"]]))  # [3·head·d_head]


def per_head_affine(x, W, b, n_heads):
    """Head h's x[:, :, h]·W[h] + b[h]: x [batch, pos, head, d_model], W [d_model, head·d_head]."""
    d_model = W.shape[0]
    return np.einsum("bphd,dhe->bphe", x, W.reshape(d_model, n_heads, -1)) + b.reshape(n_heads, -1)  # [batch, pos, head, d_head]


def attend_in_blocks(qh, kh, vh, score_mask=None, rows=ROWS, out=None, space=None):
    """pattern·v when nobody looks at scores or pattern: a block of ``rows`` queries at a time.
    The scores then never exist in full (a block stays in cache through softmax), and a block never
    touches the keys after its last query, which halves the work of a full sequence.
    ``score_mask``: None (causal) or padding's [batch, 1, query, key] mask. ``out``: the array
    [batch, head, query, d_head] to write into (any layout; default: a new one). ``space``: a flat
    array of at least ``block_scores_size`` numbers that holds each block's scores in turn (the
    pass's scratch buffer; default: a new one), so that no block faults in fresh memory."""
    pos, keys = qh.shape[2], kh.shape[2]
    start = keys - pos  # keys held in a KV cache before the first query
    zh = np.empty_like(qh) if out is None else out  # [batch, head, query, d_head]
    space = np.empty(block_scores_size(qh, kh, rows), qh.dtype) if space is None else space  # [batch·head·rows·key]
    for i in range(0, pos, rows):
        seen = start + min(i + rows, pos)  # this block's queries see keys 0 … seen − 1
        scores = block_scores(qh, kh, score_mask, i, rows, seen, space)  # [batch, head, rows, seen]
        pattern = block_probabilities(scores, score_mask is not None)  # [batch, head, rows, seen]
        np.matmul(pattern, vh[:, :, :seen], out=zh[:, :, i:i + rows])  # [batch, head, rows, d_head]
    return zh


def block_scores_size(qh, kh, rows=ROWS):
    """How many numbers the largest block of scores holds: batch · head · rows · key."""
    return qh.shape[0] * qh.shape[1] * min(rows, qh.shape[2]) * kh.shape[2]


def block_scores(qh, kh, score_mask, i, rows, seen, space=None):
    """The scores of queries i … i + rows − 1 against keys 0 … seen − 1, mask added: an array
    [batch, head, rows, seen] (at the start of the flat array ``space`` if given, else new). The plain
    formula: (qh @ khᵀ + score_mask)[:, :, i:i + rows, :seen]."""
    q = qh[:, :, i:i + rows]  # [batch, head, rows, d_head]
    shape = (*q.shape[:3], seen)
    out = None if space is None else space[:math.prod(shape)].reshape(shape)  # C order, at the start of space
    scores = np.matmul(q, kh[:, :, :seen].transpose(0, 1, 3, 2), out=out)  # [batch, head, rows, seen]
    if score_mask is not None:
        scores += score_mask[..., i:i + rows, :seen]  # [batch, head, rows, seen]
    else:  # the causal mask is 0 left of the block's own square: add only its last columns
        pos = qh.shape[2]
        diagonal = max(0, seen - rows)
        mask = causal_score_mask(pos, kh.shape[2] - pos, scores.dtype)  # [query, key]
        scores[..., diagonal:] += mask[i:i + rows, diagonal:seen]  # [batch, head, rows, seen − diagonal]
    return scores


def block_probabilities(scores, padded):
    """softmax(scores) over the last axis, in place (the caller owns ``scores``); in a padded
    batch a row that sees no key at all is 0 (``padded_softmax``)."""
    return (padded_softmax if padded else softmax)(scores, in_place=True)  # [..., key]


def attend(qh, kh, vh, run_hooks, score_mask=None, rows=ROWS, out=None, space=None):
    """pattern·v with the full scores and/or pattern [batch, head, query, key] made for the hook
    points that are watched (hooked or cached), and only those.

    The numbers are ``attend_in_blocks``'s, bit for bit: each block of queries is computed by the
    same calls on the same keys 0 … seen − 1, and the full arrays receive copies, with the masked
    keys filled in (scores −∞, pattern 0). A hook sees and may edit the full arrays, as in
    TransformerLens. After a scores hook, a block whose masked scores are all still −∞ takes the
    softmax of its first ``seen`` keys (exp(−∞) = 0: the same function); a block where a hook
    unmasked a key takes the softmax of its whole rows. Likewise after a pattern hook, pattern·v
    reads only keys < seen while the pattern beyond is all 0, and whole rows otherwise.
    ``space``: as for ``attend_in_blocks``.
    """
    batch, heads, pos, _ = qh.shape
    keys = kh.shape[2]
    start = keys - pos  # keys held in a KV cache before the first query
    padded = score_mask is not None
    blocks = [(i, start + min(i + rows, pos)) for i in range(0, pos, rows)]  # queries i … i + rows − 1 see keys < seen
    square = (batch, heads, pos, keys)
    scores = memory.empty(square, qh.dtype) if run_hooks.watched("hook_attn_scores") else None  # [batch, head, query, key]
    pattern = memory.empty(square, qh.dtype) if run_hooks.watched("hook_pattern") else None  # [batch, head, query, key]
    edited_scores, edited_pattern = run_hooks.hooked("hook_attn_scores"), run_hooks.hooked("hook_pattern")
    zh = np.empty_like(qh) if out is None else out  # [batch, head, query, d_head]

    def through_pattern(i, seen, probabilities):
        """The block's pattern [batch, head, rows, seen or key] into the full pattern, and ·v."""
        if pattern is not None:
            pattern[:, :, i:i + rows, :probabilities.shape[-1]] = probabilities  # [batch, head, rows, ·]
            pattern[:, :, i:i + rows, probabilities.shape[-1]:] = 0.0  # the masked keys
        if not edited_pattern:  # written as attend_in_blocks writes it: the same BLAS call
            np.matmul(probabilities, vh[:, :, :probabilities.shape[-1]], out=zh[:, :, i:i + rows])  # [batch, head, rows, d_head]

    space = np.empty(block_scores_size(qh, kh, rows), qh.dtype) if space is None else space  # [batch·head·rows·key]
    for i, seen in blocks:
        block = block_scores(qh, kh, score_mask, i, rows, seen, space)  # [batch, head, rows, seen]
        if scores is not None:
            scores[:, :, i:i + rows, :seen] = block  # [batch, head, rows, seen]
            scores[:, :, i:i + rows, seen:] = -np.inf  # [batch, head, rows, key − seen], the causal mask
        if not edited_scores:  # nothing will change the scores: go on from the block in hand
            through_pattern(i, seen, block_probabilities(block, padded))
    if scores is not None:
        scores = run_hooks("hook_attn_scores", scores)  # [batch, head, query, key]
    if edited_scores:
        for i, seen in blocks:
            hooked = scores[:, :, i:i + rows]  # [batch, head, rows, key]
            visible = seen if np.isneginf(hooked[..., seen:]).all() else keys  # a hook may have unmasked keys
            through_pattern(i, seen, block_probabilities(hooked[..., :visible].copy(), padded))
    if pattern is not None:
        pattern = run_hooks("hook_pattern", pattern)  # [batch, head, query, key]
    if edited_pattern:
        for i, seen in blocks:
            hooked = pattern[:, :, i:i + rows]  # [batch, head, rows, key]
            visible = seen if not hooked[..., seen:].any() else keys  # a hook may have put weight on masked keys
            zh[:, :, i:i + rows] = np.ascontiguousarray(hooked[..., :visible]) @ vh[:, :, :visible]  # [batch, head, rows, d_head]
    return zh


def padded_softmax(scores, in_place=False):
    """``softmax`` for a padded batch: a query that sees no key at all (a left pad) has
    softmax(all −∞) = NaN; its pattern row becomes 0, as in TransformerLens."""
    with np.errstate(invalid="ignore"):
        pattern = softmax(scores, in_place)  # [..., key]
    pattern[np.isnan(pattern)] = 0.0
    return pattern


@functools.lru_cache(maxsize=8)
def causal_score_mask(pos, start, dtype):
    """0 where a query may look, −∞ where it may not: added to the scores. Query i is position
    start + i and sees keys 0 … start + i (``start`` > 0 when earlier keys come from a KV cache)."""
    score_mask = np.triu(np.full((pos, start + pos), -np.inf, dtype=dtype), k=start + 1)  # [query, key]
    score_mask.flags.writeable = False
    return score_mask


def attention_backward(grad, x, w, q, k, v, pattern, z, score_scale, run_hooks=None, per_head_result=False):
    """∂loss/∂(everything attention read or computed), from grad = ∂loss/∂out [batch, pos,
    d_model], the input ``x`` and the forward's q, k, v, z [batch, pos, head, d_head] and
    ``pattern`` [batch, head, query, key]. ``w`` and ``score_scale`` as in ``attention``.

    Returns a dict: ``x``; the weights in ``w``'s flat layout (``W_Q`` [d_model, head·d_head], …,
    ``b_O`` [d_model]); and ``hook_z``, ``hook_pattern``, ``hook_attn_scores``, ``hook_q``,
    ``hook_k``, ``hook_v``, each the gradient with respect to that hook point's value.

    Derivation (docs/backward.md §3), each line the backward of one forward line, per head:
        out = z·W_O + b_O        ∂z = ∂out·W_Oᵀ      ∂W_O = Σ zᵀ·∂out     ∂b_O = Σ ∂out
        z = pattern·v            ∂pattern = ∂z·vᵀ    ∂v = patternᵀ·∂z
        pattern = softmax(s)     ∂s = pattern ⊙ (∂pattern − Σ_key pattern ⊙ ∂pattern)
                                 (masked keys have pattern 0, so ∂s is 0 there)
        s = score_scale·q·kᵀ + mask   ∂q = score_scale·∂s·k  ∂k = score_scale·∂sᵀ·q
        q = x·W_Q + b_Q, …       ∂x = ∂q·W_Qᵀ + ∂k·W_Kᵀ + ∂v·W_Vᵀ, ∂W_Q = Σ xᵀ·∂q, ∂b_Q = Σ ∂q
    (Σ: over batch and position.) ``run_hooks(name, ∂)``, if given, sees each hook point's gradient as
    it is made and returns the one that flows on (backward hooks, refgpt/tl/hooks.py).
    ``per_head_result`` (the forward made ``hook_result``): out = Σ_h result[h] + b_O, so
    ∂result[h] = ∂out for every head (``hook_result`` in the returned dict), and
    ∂z[h] = ∂result[h]·W_O[h]ᵀ, ∂W_O[h] = Σ z[h]ᵀ·∂result[h] (the same numbers unless a backward
    hook replaced ∂result).
    """
    run_hooks = run_hooks or (lambda name, g: g)
    batch, pos, d_model = x.shape
    flat = (batch * pos, -1)
    out = {"b_O": grad.sum(axis=(0, 1))}  # [d_model]
    if per_head_result:
        heads = z.shape[2]
        W_O = w["W_O"].reshape(heads, -1, d_model)  # [head, d_head, d_model]
        grad_result = run_hooks("hook_result", np.repeat(grad[:, :, None, :], heads, axis=2))  # [batch, pos, head, d_model]
        out["hook_result"] = grad_result
        out["W_O"] = np.einsum("bphd,bphm->hdm", z, grad_result).reshape(-1, d_model)  # [head·d_head, d_model]
        grad_z = run_hooks("hook_z", np.einsum("bphm,hdm->bphd", grad_result, W_O))  # [batch, pos, head, d_head]
    else:
        out["W_O"] = z.reshape(flat).T @ grad.reshape(flat)  # [head·d_head, d_model]
        grad_z = run_hooks("hook_z", (grad @ w["W_O"].T).reshape(z.shape))  # [batch, pos, head, d_head]

    per_head = (0, 2, 1, 3)  # [batch, pos, head, d_head] ↔ [batch, head, pos, d_head]
    gz, vh = grad_z.transpose(per_head), v.transpose(per_head)  # [batch, head, pos, d_head]
    grad_pattern = run_hooks("hook_pattern", gz @ vh.transpose(0, 1, 3, 2))  # [batch, head, query, key]
    grad_v = run_hooks("hook_v", (pattern.transpose(0, 1, 3, 2) @ gz).transpose(per_head))  # [batch, pos, head, d_head]
    grad_scores = run_hooks("hook_attn_scores", pattern * (grad_pattern - (pattern * grad_pattern).sum(-1, keepdims=True)))  # [batch, head, query, key]
    grad_q = run_hooks("hook_q", (grad_scores @ k.transpose(per_head)).transpose(per_head) * score_scale)  # [batch, pos, head, d_head]
    grad_k = run_hooks("hook_k", (grad_scores.transpose(0, 1, 3, 2) @ q.transpose(per_head)).transpose(per_head) * score_scale)  # [batch, pos, head, d_head]

    x_rows = x.reshape(flat)  # [batch·pos, d_model]
    grad_x = np.zeros_like(x)  # [batch, pos, d_model]
    for name, g in (("Q", grad_q), ("K", grad_k), ("V", grad_v)):
        g_rows = g.reshape(flat)  # [batch·pos, head·d_head]
        out[f"W_{name}"] = x_rows.T @ g_rows  # [d_model, head·d_head]
        out[f"b_{name}"] = g_rows.sum(axis=0)  # [head·d_head]
        grad_x += (g_rows @ w[f"W_{name}"].T).reshape(x.shape)  # [batch, pos, d_model]
    out.update(x=grad_x, hook_z=grad_z, hook_pattern=grad_pattern, hook_attn_scores=grad_scores,
               hook_q=grad_q, hook_k=grad_k, hook_v=grad_v)
    return out
