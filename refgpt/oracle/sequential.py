"""GPT-2 as a port written in plain loops computes it: every sum in index order, one term at a time.

The oracle's tolerances scale with the error a *correct* float32 implementation makes at each
tensor, which the golden writer measures (refgpt/oracle/golden.py, c_X and r_X). refgpt's own
float32 pass is one correct implementation, but an unusually accurate one: NumPy sums along the
last axis pairwise, so a sum of n terms errs by ~log₂ n roundings. A port written as loops — llm.c's
CPU code, a first C, Rust or Zig port — keeps one accumulator per sum, and its error grows with n
and is correlated along the sum. Where that matters most, a whole row shares it:

* softmax divides every probability of a row by one float32 sum of up to 50,257 terms (a relative
  error of 10⁻⁵–10⁻⁴ in GPT-2's vocabulary softmax): every probability, every ∂logit = p − onehot and
  everything computed from them in the backward pass moves by the same factor;
* LayerNorm divides a row by one σ from one float32 sum of squares, and centres it by one mean.

A bias bound calibrated on refgpt's own pass calls that correlation "systematic" (issue 25: llm.c
as it is failed ``grad.ln_final.w`` on the trained embedded model). So the golden also runs this
second float32 implementation, written the way such a port is: each normalising or reducing sum
(LayerNorm's mean and variance, each softmax's denominator, the log-sum-exp, LayerNorm's and the
softmax's backward sums, every sum over batch and positions) accumulates in index order
(``sequential_sum``, NumPy's cumulative sum, which adds one term at a time), and the matrix
products are BLAS's, which accumulate along the inner dimension in order too. Its errors enter c_X
and r_X beside refgpt's own: a correct port's tolerance covers both orders. It is otherwise the
plain formulas of refgpt/reference/gpt2.py, batched, for the names of a golden file, with padding
(an attention mask) in the forward pass. Run in float64 it agrees with the golden to float64's
rounding (tests/oracle/test_sequential.py), which is the check that it computes GPT-2.
"""

from __future__ import annotations

import numpy as np

from ..gpt2.activations import ACTIVATIONS, BACKWARDS
from ..gpt2.config import Config
from ..gpt2.loss import IGNORE_INDEX
from ..gpt2.padding import position_ids
from .name_maps import GRAD


def sequential_sum(x, axis=-1):
    """Σ over ``axis`` one term at a time, in index order, in x's dtype (keeps the axis, length 1)."""
    total = np.cumsum(x, axis=axis, dtype=x.dtype)  # [..., n, ...]
    return np.take(total, [-1], axis=axis)  # [..., 1, ...]


def _row_sum(x):
    """Σ over every axis but the last, one row at a time: [..., n] → [n]."""
    return sequential_sum(x.reshape(-1, x.shape[-1]), axis=0)[0]  # [n]


def _softmax(x):
    """exp(x − max)/Σ exp(x − max) over the last axis, the Σ one float accumulator; a row that sees
    nothing (all −∞: a left pad's query) is 0, as refgpt's padded softmax."""
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(axis=-1, keepdims=True))  # [..., n]
        p = e / sequential_sum(e)  # [..., n]
    return np.where(np.isnan(p), 0.0, p).astype(x.dtype, copy=False)


def _layer_norm(x, w, b, eps):
    n = x.shape[-1]
    mean = sequential_sum(x) / n  # [..., 1]
    centered = x - mean  # [..., n]
    scale = np.sqrt(sequential_sum(centered * centered) / n + x.dtype.type(eps))  # [..., 1]
    normalized = centered / scale  # [..., n]
    return normalized * w + b, {"hook_mean": mean, "hook_scale": scale, "hook_normalized": normalized}


def _layer_norm_backward(grad, normalized, scale, w):
    """The textbook (ĝ − mean ĝ − x̂·mean(ĝ ⊙ x̂))/σ, as loop ports write it, and refgpt's hook gradients."""
    n = grad.shape[-1]
    g_hat = grad * w  # [..., n]
    mean_g = sequential_sum(g_hat) / n  # [..., 1]
    mean_gx = sequential_sum(g_hat * normalized) / n  # [..., 1]
    dx = (g_hat - mean_g - normalized * mean_gx) / scale  # [..., n]
    d_scale = -n * mean_gx / scale  # [..., 1] = −Σ ĝ·x̂/σ
    d_centered = g_hat / scale + d_scale * normalized / n  # [..., n]
    d_mean = -sequential_sum(d_centered)  # [..., 1]
    return dx, {"w": _row_sum(grad * normalized), "b": _row_sum(grad), "hook_normalized": g_hat,
                "hook_scale": d_scale, "hook_mean": d_mean}


def golden_names(cfg: Config) -> list[str]:
    """The names ``stages`` makes (a golden file's forward names, and ``probs``), without padding."""
    from ..tl.hook_points import hook_names

    names = ["tokens", *hook_names(cfg.n_layers), "logits", "log_probs", "probs", "targets", "loss"]
    return names + [n[: -len("hook_normalized")] + "out" for n in names if n.endswith("hook_normalized")]


def _heads(W, h):
    """[head, d_model, d_head] → [d_model, head·d_head]."""
    return W.transpose(1, 0, 2).reshape(W.shape[1], h * W.shape[2])


def compute(cfg: Config, params, tokens, targets=None, backward=False, attention_mask=None, dtype="float32"):
    """The golden tensors (refgpt/oracle/golden.py names) of ``tokens`` [batch, pos], computed with
    sequential sums in ``dtype``, and ``probs`` (the softmax of the logits, as llm.c keeps it); with
    ``backward`` also ``loss_mean`` and the ``grad.*`` tensors. ``targets`` [batch, pos] (llm.c's y)
    or None (next token inside ``tokens``); ``attention_mask`` [batch, pos] 1 real / 0 pad (forward
    only; the loss then counts real pairs, as refgpt's)."""
    if backward and attention_mask is not None:
        raise ValueError("the sequential port's backward has no padding")
    dt = np.dtype(dtype)
    p = {k: np.asarray(v, dt) for k, v in params.items()}
    out, saved = {}, {}
    for stage in stages(cfg, p, tokens, targets, attention_mask, dt, saved if backward else None):
        out.update(stage)
    if backward:
        y = out["targets"]
        out.update(_backward(cfg, p, np.asarray(tokens), y, out, saved, dt))
    return out


def stages(cfg: Config, params, tokens, targets=None, attention_mask=None, dtype="float32", saved=None):
    """Yield the forward pass's golden tensors one stage at a time (the embedding, each block, the
    unembedding, the softmax and loss), as dicts name → array: ``compute`` without holding more than a stage. ``saved``:
    a dict that receives what the backward pass needs (None: nothing is kept)."""
    dt = np.dtype(dtype)
    p = {k: np.asarray(v, dt) for k, v in params.items()}
    tokens = np.asarray(tokens)
    B, T = tokens.shape
    H, dh = cfg.n_heads, cfg.d_head
    if attention_mask is None:
        positions, real = np.broadcast_to(np.arange(T), (B, T)), np.ones((B, T), bool)
        allowed = np.tril(np.ones((T, T), bool))[None, None]  # [1, 1, query, key]
    else:
        mask = np.asarray(attention_mask)
        positions, real = position_ids(mask), mask == 1
        allowed = np.tril(np.ones((T, T), bool))[None, None] & real[:, None, None, :]  # [batch, 1, query, key]
    embed = p["embed.W_E"][tokens]  # [batch, pos, d_model]
    pos_embed = p["pos_embed.W_pos"][positions] * real[..., None].astype(dt)  # [batch, pos, d_model]
    yield {"tokens": tokens, "hook_embed": embed, "hook_pos_embed": pos_embed}
    x = embed + pos_embed  # [batch, pos, d_model]
    for L in range(cfg.n_layers):
        b = f"blocks.{L}."
        out = {b + "hook_resid_pre": x}
        h1, ln1 = _layer_norm(x, p[b + "ln1.w"], p[b + "ln1.b"], cfg.eps)  # [batch, pos, d_model]
        qkv = [(h1 @ _heads(p[b + f"attn.W_{n}"], H) + p[b + f"attn.b_{n}"].reshape(-1)).reshape(B, T, H, dh)
               for n in "QKV"]  # [batch, pos, head, d_head] each
        q, k, v = (a.transpose(0, 2, 1, 3) for a in qkv)  # [batch, head, pos, d_head]
        scores = np.where(allowed, (q @ k.transpose(0, 1, 3, 2)) * dt.type(cfg.score_scale(L)), -np.inf).astype(dt)  # [batch, head, query, key]
        pattern = _softmax(scores)  # [batch, head, query, key]
        z = pattern @ v  # [batch, head, pos, d_head]
        z_flat = z.transpose(0, 2, 1, 3).reshape(B, T, H * dh)  # [batch, pos, head·d_head]
        attn_out = z_flat @ p[b + "attn.W_O"].reshape(H * dh, -1) + p[b + "attn.b_O"]  # [batch, pos, d_model]
        x = x + attn_out
        h2, ln2 = _layer_norm(x, p[b + "ln2.w"], p[b + "ln2.b"], cfg.eps)  # [batch, pos, d_model]
        pre = h2 @ p[b + "mlp.W_in"] + p[b + "mlp.b_in"]  # [batch, pos, d_mlp]
        post = ACTIVATIONS[cfg.act_fn](pre)  # [batch, pos, d_mlp]
        mlp_out = post @ p[b + "mlp.W_out"] + p[b + "mlp.b_out"]  # [batch, pos, d_model]
        out.update({b + "ln1." + n: a for n, a in ln1.items()})
        out[b + "ln1.out"] = h1
        out.update({b + "attn.hook_q": qkv[0], b + "attn.hook_k": qkv[1], b + "attn.hook_v": qkv[2],
                    b + "attn.hook_attn_scores": scores, b + "attn.hook_pattern": pattern,
                    b + "attn.hook_z": z.transpose(0, 2, 1, 3), b + "hook_attn_out": attn_out,
                    b + "hook_resid_mid": x})
        out.update({b + "ln2." + n: a for n, a in ln2.items()})
        out[b + "ln2.out"] = h2
        x = x + mlp_out
        out.update({b + "mlp.hook_pre": pre, b + "mlp.hook_post": post, b + "hook_mlp_out": mlp_out,
                    b + "hook_resid_post": x})
        if saved is not None:
            saved[L] = (h1, q, k, v, pattern, z_flat, h2, pre, post)
        yield out
    final, lnf = _layer_norm(x, p["ln_final.w"], p["ln_final.b"], cfg.eps)  # [batch, pos, d_model]
    out = {"ln_final." + n: a for n, a in lnf.items()}
    out["ln_final.out"] = final
    logits = final @ p["unembed.W_U"]  # [batch, pos, d_vocab]
    if "unembed.b_U" in p:
        logits += p["unembed.b_U"]
    out["logits"] = logits
    yield out  # the softmax made after: a reader measuring the logits does not hold it too (golden._passes)
    shifted = logits - logits.max(axis=-1, keepdims=True)  # [batch, pos, d_vocab]
    del logits  # a streaming reader has let go of it: at GPT-2 medium's shape, T = 1024, 200 MB
    e = np.exp(shifted)  # [batch, pos, d_vocab]
    total = sequential_sum(e)  # [batch, pos, 1]: the softmax's one float accumulator per row
    out = {"log_probs": np.subtract(shifted, np.log(total), out=shifted), "probs": np.divide(e, total, out=e)}  # in place
    del shifted, e  # held by ``out`` alone, which its reader empties
    y = tokens[:, 1:] if targets is None else np.asarray(targets)  # [batch, pos − 1] or [batch, pos]
    out["targets"] = y
    bi, ti = np.indices(y.shape)
    out["loss"] = -out["log_probs"][bi, ti, y]  # [batch, pos − 1] or [batch, pos]
    if attention_mask is not None:
        counted = real[:, :y.shape[1]] & real[:, 1:y.shape[1] + 1] if targets is None else real
        out["loss"] = np.where(counted, out["loss"], 0.0).astype(dt)
    yield out


def _backward(cfg, p, tokens, y, out, saved, dt):
    B, T = tokens.shape
    H, dh = cfg.n_heads, cfg.d_head
    targets = np.full((B, T), IGNORE_INDEX)
    targets[:, :y.shape[1]] = y
    keep = targets != IGNORE_INDEX  # [batch, pos]
    count = int(keep.sum())
    g = {"loss_mean": np.asarray(_row_sum(out["loss"].reshape(-1, 1))[0] / dt.type(out["loss"].size), dt)}
    d_logits = out["probs"].copy()  # [batch, pos, d_vocab]: p − onehot, over the count
    bi, ti = np.nonzero(keep)
    d_logits[bi, ti, targets[bi, ti]] -= 1
    d_logits[~keep] = 0
    d_logits /= dt.type(count)
    g["logits"] = d_logits
    rows = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731 [batch·pos, n]
    g["unembed.W_U"] = rows(out["ln_final.out"]).T @ rows(d_logits)  # [d_model, d_vocab]
    if "unembed.b_U" in p:
        g["unembed.b_U"] = _row_sum(d_logits)
    d = d_logits @ p["unembed.W_U"].T  # [batch, pos, d_model]

    def ln_step(prefix, d):
        g[prefix + "out"] = d
        dx, lg = _layer_norm_backward(d, out[prefix + "hook_normalized"], out[prefix + "hook_scale"], p[prefix + "w"])
        g.update({prefix + n: a for n, a in lg.items()})
        return dx

    d = ln_step("ln_final.", d)
    for L in reversed(range(cfg.n_layers)):
        b = f"blocks.{L}."
        h1, q, k, v, pattern, z_flat, h2, pre, post = saved[L]
        g[b + "hook_resid_post"] = g[b + "hook_mlp_out"] = d
        g[b + "mlp.W_out"], g[b + "mlp.b_out"] = rows(post).T @ rows(d), _row_sum(d)
        d_post = d @ p[b + "mlp.W_out"].T  # [batch, pos, d_mlp]
        d_pre = BACKWARDS[cfg.act_fn](pre, d_post)  # [batch, pos, d_mlp]
        g[b + "mlp.hook_post"], g[b + "mlp.hook_pre"] = d_post, d_pre
        g[b + "mlp.W_in"], g[b + "mlp.b_in"] = rows(h2).T @ rows(d_pre), _row_sum(d_pre)
        d = d + ln_step(b + "ln2.", d_pre @ p[b + "mlp.W_in"].T)  # [batch, pos, d_model]
        g[b + "hook_resid_mid"] = g[b + "hook_attn_out"] = d
        W_O = p[b + "attn.W_O"].reshape(H * dh, -1)  # [head·d_head, d_model]
        g[b + "attn.W_O"] = (rows(z_flat).T @ rows(d)).reshape(H, dh, -1)
        g[b + "attn.b_O"] = _row_sum(d)
        d_z = (d @ W_O.T).reshape(B, T, H, dh).transpose(0, 2, 1, 3)  # [batch, head, pos, d_head]
        d_pattern = d_z @ v.transpose(0, 1, 3, 2)  # [batch, head, query, key]
        d_v = pattern.transpose(0, 1, 3, 2) @ d_z  # [batch, head, key, d_head]
        d_scores = pattern * (d_pattern - sequential_sum(pattern * d_pattern))  # [batch, head, query, key]
        scale = dt.type(cfg.score_scale(L))
        d_q, d_k = (d_scores @ k) * scale, (d_scores.transpose(0, 1, 3, 2) @ q) * scale  # [batch, head, pos, d_head]
        g.update({b + "attn.hook_z": d_z.transpose(0, 2, 1, 3), b + "attn.hook_pattern": d_pattern,
                  b + "attn.hook_attn_scores": d_scores, b + "attn.hook_v": d_v.transpose(0, 2, 1, 3),
                  b + "attn.hook_q": d_q.transpose(0, 2, 1, 3), b + "attn.hook_k": d_k.transpose(0, 2, 1, 3)})
        d_h1 = 0
        for n, dn in zip("QKV", (d_q, d_k, d_v)):
            dn = dn.transpose(0, 2, 1, 3).reshape(B, T, H * dh)  # [batch, pos, head·d_head]
            g[b + f"attn.W_{n}"] = (rows(h1).T @ rows(dn)).reshape(-1, H, dh).transpose(1, 0, 2)
            g[b + f"attn.b_{n}"] = _row_sum(dn).reshape(H, dh)
            d_h1 = d_h1 + dn @ _heads(p[b + f"attn.W_{n}"], H).T  # [batch, pos, d_model]
        d = d + ln_step(b + "ln1.", d_h1)
        g[b + "hook_resid_pre"] = d
    g["hook_embed"] = g["hook_pos_embed"] = d
    W_E = np.zeros_like(p["embed.W_E"])  # [d_vocab, d_model]
    np.add.at(W_E, tokens.reshape(-1), rows(d))
    W_pos = np.zeros_like(p["pos_embed.W_pos"])  # [n_ctx, d_model]
    W_pos[:T] = sequential_sum(d, axis=0)[0]
    g["embed.W_E"], g["pos_embed.W_pos"] = W_E, W_pos
    g["tied_W_E"] = W_E + g["unembed.W_U"].T
    return {("loss_mean" if n == "loss_mean" else GRAD + n): a for n, a in g.items()}


__all__ = ["compute", "sequential_sum"]
