"""A GPT-2 port written as a port author writes one at reduced precision, for the local verdicts'
tests (refgpt/oracle/local.py): every tensor stored at ``store`` (float32, bfloat16, float16), every
op computed in float32 from the stored inputs and its result rounded to ``store`` — TransformerLens's
own op order (a two-pass LayerNorm, x̂·w then + b, q·kᵀ then / √d_head, softmax, pattern·v), the
way TransformerLens runs in bfloat16 on a CPU, whose matmuls accumulate in float32.

``attention_mask`` [batch, pos] (1 real, 0 pad): pads are masked keys, and positions count each
row's real tokens (a pad key's score is float32's most negative number, as HF's: a left pad's
query, with no real key, attends its pads and stays finite; pads are not judged). ``port_decode``
decodes as llm.c's generation loop does: the whole sequence so far at every step, each step's
tensors cut from it (its KV cache the k, v of every position so far).

``plant`` puts one bug in, by name (PLANTS), at ``layer`` (and ``position`` / ``head``). With
``outputs`` the port also dumps ``log_probs`` (x − max − log Σ exp, in float32 from its stored
logits), ``probs`` and the next-token ``loss`` (−log_probs at the target); "softmax_padded" is
llm.c's bug: the vocabulary's sum taken over the padded vocabulary (``padded`` logits of 0 more).

``port_backward`` is the same port's backward of the mean next-token loss, as torch's autograd runs
it at reduced precision: every op in float32 from the stored gradients and saved activations, its
result rounded to ``store``; the textbook LayerNorm backward (ĝ − mean ĝ − x̂·mean(ĝ ⊙ x̂))/σ.
BACKWARD_PLANTS are the oracle's backward bugs: the LayerNorm backward without its mean term, GELU's
backward without the 3 of d(x³)/dx, ∂k without the score scale, the softmax backward's sum without
the pattern weight.
"""

from __future__ import annotations

import math

import numpy as np

from refgpt.reference.local import round_to

PLANTS = ("gelu_constant", "ln_eps_outside_sqrt", "score_scale", "W_O_head_1pct", "ln_eps_one_position",
          "softmax_padded")
#: GPT-2 small's shape as an HF config's fields (tests/peers.py's random_hf_config takes them).
GPT2_SMALL = dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257, n_inner=None,
                  layer_norm_epsilon=1e-5, scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                  reorder_and_upcast_attn=False, tie_word_embeddings=True)
BACKWARD_PLANTS = ("ln_backward_mean", "gelu_backward", "key_scale", "softmax_backward_weight")


def port_forward(params, cfg, tokens, store="bfloat16", plant=None, layer=0, position=0, head=0, outputs=False,
                 padded=0, attention_mask=None):
    """tokens [batch, pos] → the port's activations by TransformerLens hook name, [batch, pos, …]
    (the logits under "logits"), float32 arrays holding ``store`` values."""
    if plant is not None and plant not in PLANTS:
        raise ValueError(plant)
    f32 = np.float32
    R = lambda a: round_to(a, store).astype(f32)  # noqa: E731 — the port's storage
    W = {name: R(w) for name, w in params.items()}
    if plant == "W_O_head_1pct":
        W_O = W[f"blocks.{layer}.attn.W_O"].copy()
        W_O[head] = R(W_O[head] * f32(1.01))
        W[f"blocks.{layer}.attn.W_O"] = W_O
    tokens = np.atleast_2d(tokens)
    masks = np.ones(tokens.shape, np.int64) if attention_mask is None else np.asarray(attention_mask)
    rows = [_row(W, cfg, np.asarray(t), R, plant, layer, position, m == 1) for t, m in zip(tokens, masks)]
    if outputs:
        for t, acts in zip(np.atleast_2d(tokens), rows):
            _outputs(acts, np.asarray(t), R, padded if plant == "softmax_padded" else 0)
    return {name: np.stack([r[name] for r in rows]) for name in rows[0]}


def _layer_norm(acts, prefix, x, w, b, eps, R, wrong_eps_at=None):
    f32 = np.float32
    mean = R(x.mean(-1, keepdims=True, dtype=f32))  # [pos, 1]
    centered = R(x - mean)  # [pos, d_model]
    variance = R(R(centered * centered).mean(-1, keepdims=True, dtype=f32))  # [pos, 1]
    eps = np.full(variance.shape, eps, f32)  # [pos, 1]
    if isinstance(wrong_eps_at, tuple):  # one position's ε wrong by enough to move its σ by 5 %
        eps[wrong_eps_at] += f32(0.1025) * variance[wrong_eps_at]
    scale = R(np.sqrt(variance + eps))  # [pos, 1]
    if wrong_eps_at == "outside":
        scale = R(np.sqrt(variance) + f32(eps[0, 0]))
    normalized = R(centered / scale)  # [pos, d_model]
    acts.update({prefix + "hook_mean": mean, prefix + "hook_scale": scale, prefix + "hook_normalized": normalized})
    return R(R(normalized * w) + b)  # [pos, d_model]


def _row(W, cfg, tokens, R, plant, layer, position, real):
    f32, acts, pos = np.float32, {}, len(tokens)
    positions = np.where(real, np.cumsum(real) - 1, 0)  # [pos]: each real token's count of real ones before it
    acts["hook_embed"], acts["hook_pos_embed"] = W["embed.W_E"][tokens], W["pos_embed.W_pos"][positions]
    x = R(acts["hook_embed"] + acts["hook_pos_embed"])  # [pos, d_model]
    future = np.triu(np.ones((pos, pos), dtype=bool), k=1)  # [query, key]
    c = f32(math.sqrt(2 / (3.14 if plant == "gelu_constant" else math.pi)))
    for L in range(cfg.n_layers):
        b, here = f"blocks.{L}.", L == layer
        acts[b + "hook_resid_pre"] = x
        wrong = ("outside" if plant == "ln_eps_outside_sqrt" else
                 (position, 0) if plant == "ln_eps_one_position" else None) if here else None
        h = _layer_norm(acts, b + "ln1.", x, W[b + "ln1.w"], W[b + "ln1.b"], cfg.eps, R, wrong)
        a = b + "attn."
        q, k, v = (R(np.einsum("pd,hde->phe", h, W[a + "W_" + n]) + W[a + "b_" + n]) for n in "QKV")
        scale = f32(1 / cfg.d_head if plant == "score_scale" and here else cfg.score_scale(L))
        scores = R(R(np.einsum("qhe,khe->hqk", q, k)) * scale)  # [head, query, key]
        scores = np.where(future, -np.inf, np.where(real, scores, np.finfo(f32).min)).astype(f32)  # pads: HF's min
        e = np.exp(scores - scores.max(-1, keepdims=True))  # [head, query, key]
        pattern = R(e / e.sum(-1, keepdims=True))  # [head, query, key]
        z = R(np.einsum("hqk,khe->qhe", pattern, v))  # [pos, head, d_head]
        attn_out = R(np.einsum("phe,hed->pd", z, W[a + "W_O"]) + W[a + "b_O"])  # [pos, d_model]
        acts.update({a + "hook_q": q, a + "hook_k": k, a + "hook_v": v, a + "hook_attn_scores": scores,
                     a + "hook_pattern": pattern, a + "hook_z": z, b + "hook_attn_out": attn_out})
        x = acts[b + "hook_resid_mid"] = R(x + attn_out)
        h = _layer_norm(acts, b + "ln2.", x, W[b + "ln2.w"], W[b + "ln2.b"], cfg.eps, R)
        m = b + "mlp."
        pre = R(h @ W[m + "W_in"] + W[m + "b_in"])  # [pos, d_mlp]
        post = R(f32(0.5) * pre * (f32(1) + np.tanh(c * (pre + f32(0.044715) * pre ** 3))))  # [pos, d_mlp]
        mlp_out = R(post @ W[m + "W_out"] + W[m + "b_out"])  # [pos, d_model]
        acts.update({m + "hook_pre": pre, m + "hook_post": post, b + "hook_mlp_out": mlp_out})
        x = acts[b + "hook_resid_post"] = R(x + mlp_out)
    h = _layer_norm(acts, "ln_final.", x, W["ln_final.w"], W["ln_final.b"], cfg.eps, R)
    acts["logits"] = R(h @ W["unembed.W_U"])  # [pos, d_vocab]
    return acts


def _outputs(acts, tokens, R, padded):
    f32 = np.float32
    logits = acts["logits"]  # [pos, d_vocab]
    m = logits.max(-1, keepdims=True)  # [pos, 1]
    d = R(logits - m)  # [pos, d_vocab]
    e = np.exp(d)  # [pos, d_vocab] float32
    total = e.sum(-1, keepdims=True, dtype=f32) + f32(padded) * np.exp(-m)  # [pos, 1] (+ the padding's e⁰⁻ᵐ)
    acts["log_probs"] = R(d - R(np.log(total)))  # [pos, d_vocab]
    acts["probs"] = R(e / total)  # [pos, d_vocab]
    acts["loss"] = R(-acts["log_probs"][np.arange(len(tokens) - 1), tokens[1:]])  # [pos − 1]


def port_decode(params, cfg, ref, store="bfloat16", **plant):
    """The port's decode along a decode golden's tensors ``ref`` (each step's tokens; its
    attention_mask if padded) → the step tensors under the golden's names (refgpt/oracle/decode.py);
    ``plant``: port_forward's plant, layer, position, head."""
    from refgpt.oracle.decode import step_rows
    from refgpt.oracle.name_maps import split_step
    steps = sorted({split_step(n)[0] for n in ref} - {None})
    sequence = np.concatenate([np.asarray(ref[f"step.{S}.tokens"]) for S in steps], axis=1)  # [batch, P + N − 1]
    mask = ref.get("attention_mask")
    out, start = {}, 0
    for S in steps:
        end = start + np.shape(ref[f"step.{S}.tokens"])[1]
        full = port_forward(params, cfg, sequence[:, :end], store, outputs=True,
                            attention_mask=None if mask is None else np.asarray(mask)[:, :end], **plant)
        for name in ref:
            step, inner = split_step(name)
            value = step_rows(full, inner, start, end) if step == S else None
            if value is not None:
                out[name] = value
        start = end
    return out


def port_backward(params, cfg, tokens, acts, store="bfloat16", plant=None, layer=0):
    """The gradients of the mean next-token loss under a golden's names (``grad.`` + what was
    differentiated: activations [batch, pos, …], parameters their own shape), float32 arrays of
    ``store`` values, from ``acts`` = port_forward's activations (the saved values)."""
    if plant is not None and plant not in BACKWARD_PLANTS:
        raise ValueError(plant)
    f32 = np.float32
    R = lambda a: round_to(a, store).astype(f32)  # noqa: E731
    W = {name: R(w) for name, w in params.items()}
    A = {name: np.asarray(a, f32) for name, a in acts.items()}
    tokens = np.atleast_2d(tokens)
    B, pos = tokens.shape
    g = {}
    logits = A["logits"]  # [batch, pos, d_vocab]
    e = np.exp(logits - logits.max(-1, keepdims=True))
    dl = e / e.sum(-1, keepdims=True, dtype=f32)  # [batch, pos, d_vocab] the probabilities, in float32
    b_i, p_i = np.meshgrid(np.arange(B), np.arange(pos - 1), indexing="ij")
    dl[b_i, p_i, tokens[:, 1:]] -= f32(1)
    dl[:, -1] = 0  # the last position has no target
    g["logits"] = dl = R(dl / f32(B * (pos - 1)))
    g["ln_final.out"] = d = R(dl @ W["unembed.W_U"].T)  # [batch, pos, d_model]
    final = R(R(A["ln_final.hook_normalized"] * W["ln_final.w"]) + W["ln_final.b"])  # what the unembedding read
    g["unembed.W_U"] = R(np.einsum("bpd,bpv->dv", final, dl, optimize=True))
    dx = _ln_backward(g, "ln_final.", d, A, W, R, None, plant == "ln_backward_mean" and layer == cfg.n_layers)
    c = f32(math.sqrt(2 / math.pi))
    for L in reversed(range(cfg.n_layers)):
        b, a, m, here = f"blocks.{L}.", f"blocks.{L}.attn.", f"blocks.{L}.mlp.", L == layer
        g[b + "hook_resid_post"] = g[b + "hook_mlp_out"] = dx
        g[m + "W_out"] = R(np.einsum("bpm,bpd->md", A[m + "hook_post"], dx, optimize=True))
        g[m + "b_out"] = R(dx.sum((0, 1), dtype=f32))
        g[m + "hook_post"] = d_post = R(dx @ W[m + "W_out"].T)  # [batch, pos, d_mlp]
        x = A[m + "hook_pre"]
        t = np.tanh(c * (x + f32(0.044715) * x ** 3))
        slope = f32(0.044715 if plant == "gelu_backward" and here else 3 * 0.044715)
        g[m + "hook_pre"] = d_pre = R((f32(0.5) * (1 + t) + f32(0.5) * x * (1 - t * t) * c * (1 + slope * x * x))
                                      * d_post)
        h = R(R(A[b + "ln2.hook_normalized"] * W[b + "ln2.w"]) + W[b + "ln2.b"])  # the MLP's input
        g[m + "W_in"] = R(np.einsum("bpd,bpm->dm", h, d_pre, optimize=True))
        g[m + "b_in"] = R(d_pre.sum((0, 1), dtype=f32))
        g[b + "ln2.out"] = d = R(d_pre @ W[m + "W_in"].T)
        dx = _ln_backward(g, b + "ln2.", d, A, W, R, dx, plant == "ln_backward_mean" and here)
        g[b + "hook_resid_mid"] = g[b + "hook_attn_out"] = dx
        g[a + "W_O"] = R(np.einsum("bphe,bpd->hed", A[a + "hook_z"], dx, optimize=True))
        g[a + "b_O"] = R(dx.sum((0, 1), dtype=f32))
        g[a + "hook_z"] = dz = R(np.einsum("bpd,hed->bphe", dx, W[a + "W_O"], optimize=True))
        q, k, v, pattern = (A[a + n] for n in ("hook_q", "hook_k", "hook_v", "hook_pattern"))
        g[a + "hook_pattern"] = dp = R(np.einsum("bqhe,bkhe->bhqk", dz, v, optimize=True))  # every entry, as autograd
        g[a + "hook_v"] = R(np.einsum("bhqk,bqhe->bkhe", pattern, dz, optimize=True))
        weights = pattern if not (plant == "softmax_backward_weight" and here) else np.ones_like(pattern)
        weighted = (weights * dp).sum(-1, keepdims=True, dtype=f32)  # [batch, head, query, 1]
        g[a + "hook_attn_scores"] = ds = R(pattern * R(dp - weighted))
        scale = f32(cfg.score_scale(L))
        g[a + "hook_q"] = R(R(np.einsum("bhqk,bkhe->bqhe", ds, k, optimize=True)) * scale)
        key_scale = f32(1) if plant == "key_scale" and here else scale
        g[a + "hook_k"] = R(R(np.einsum("bhqk,bqhe->bkhe", ds, q, optimize=True)) * key_scale)
        h = R(R(A[b + "ln1.hook_normalized"] * W[b + "ln1.w"]) + W[b + "ln1.b"])  # attention's input
        d = None
        for n in "QKV":
            dn = g[a + f"hook_{n.lower()}"]  # [batch, pos, head, d_head]
            g[a + f"W_{n}"] = R(np.einsum("bpd,bphe->hde", h, dn, optimize=True))
            g[a + f"b_{n}"] = R(dn.sum((0, 1), dtype=f32))
            part = R(np.einsum("bphe,hde->bpd", dn, W[a + f"W_{n}"], optimize=True))
            d = part if d is None else R(d + part)
        g[b + "ln1.out"] = d
        dx = _ln_backward(g, b + "ln1.", d, A, W, R, dx, False)
        g[b + "hook_resid_pre"] = dx
    g["hook_embed"] = g["hook_pos_embed"] = dx
    W_E = np.zeros(W["embed.W_E"].shape, f32)  # [d_vocab, d_model]
    np.add.at(W_E, tokens.reshape(-1), dx.reshape(B * pos, -1))
    g["embed.W_E"] = R(W_E)
    W_pos = np.zeros(W["pos_embed.W_pos"].shape, f32)  # [n_ctx, d_model]
    W_pos[:pos] = dx.sum(0, dtype=f32)
    g["pos_embed.W_pos"] = R(W_pos)
    return {"grad." + name: value for name, value in g.items()}


def _ln_backward(g, prefix, d, A, W, R, upstream, drop_mean):
    """The textbook LayerNorm backward from ∂out ``d``, the saved x̂ and σ; ∂w, ∂b and ∂x̂ into ``g``;
    returns ∂input plus ``upstream`` (the residual stream's gradient, or None)."""
    f32 = np.float32
    xh, scale = A[prefix + "hook_normalized"], A[prefix + "hook_scale"]
    g[prefix + "w"] = R(np.einsum("bpd,bpd->d", d, xh, optimize=True))
    g[prefix + "b"] = R(d.sum((0, 1), dtype=f32))
    g[prefix + "hook_normalized"] = gh = R(d * W[prefix + "w"])  # [batch, pos, d_model] ∂x̂
    mean_g = f32(0) if drop_mean else R(gh.mean(-1, keepdims=True, dtype=f32))
    mean_gx = R(R(gh * xh).mean(-1, keepdims=True, dtype=f32))
    dx = R(R(R(gh - mean_g) - R(xh * mean_gx)) / scale)
    return dx if upstream is None else R(upstream + dx)
