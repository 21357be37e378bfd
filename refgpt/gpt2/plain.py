"""GPT-2, written plainly: its forward pass and its backward, one small function per op.

This file is the specification. It is GPT-2 as the paper and OpenAI's code define it, in the
shapes and names of TransformerLens's circuits notation, with nothing else: no hooks, no blocking,
no in-place tricks, no validation, one sequence at a time. Everything else in refgpt that computes
GPT-2 — the Model's fast forward (refgpt/model.py), its cached and KV-cached passes, padding, the
analytic backward (refgpt/backward.py), the golden files — is tested against this copy
(tests/core/test_plain.py), to a bound derived from float64's rounding.

    x = W_E[tokens] + W_pos[:pos]                                   [pos, d_model]
    for each block:  x = x + attention(LN1(x));  x = x + mlp(LN2(x))
    logits = LN_final(x) · W_U                                      [pos, d_vocab]

``forward`` returns the logits and every activation under its TransformerLens hook name
(``blocks.0.attn.hook_pattern`` …) without the batch axis; ``backward`` returns the gradient of the
mean next-token cross-entropy with respect to every parameter and the main activations.
Derivations: docs/backward.md.
"""

import numpy as np


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)  # [pos, 1]
    centered = x - mean  # [pos, d_model]
    scale = np.sqrt((centered ** 2).mean(-1, keepdims=True) + eps)  # [pos, 1]
    normalized = centered / scale  # [pos, d_model]
    return normalized * w + b, {"hook_mean": mean, "hook_scale": scale, "hook_normalized": normalized}


def gelu_new(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))  # [pos, d_mlp]


def relu(x):
    return np.maximum(x, 0)  # [pos, d_mlp]


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))  # [..., n]; exp(−∞) = 0
    return e / e.sum(-1, keepdims=True)  # [..., n]


def attention(x, W_Q, b_Q, W_K, b_K, W_V, b_V, W_O, b_O, score_scale):
    pos = x.shape[0]
    q = np.einsum("pd,hde->phe", x, W_Q) + b_Q  # [pos, head, d_head]
    k = np.einsum("pd,hde->phe", x, W_K) + b_K  # [pos, head, d_head]
    v = np.einsum("pd,hde->phe", x, W_V) + b_V  # [pos, head, d_head]
    scores = np.einsum("qhe,khe->hqk", q, k) * score_scale  # [head, query, key]
    future = np.triu(np.ones((pos, pos), dtype=bool), k=1)  # [query, key]: a query sees only its past
    scores = np.where(future, -np.inf, scores)  # [head, query, key]
    pattern = softmax(scores)  # [head, query, key]
    z = np.einsum("hqk,khe->qhe", pattern, v)  # [pos, head, d_head]
    out = np.einsum("phe,hed->pd", z, W_O) + b_O  # [pos, d_model]
    return out, {"hook_q": q, "hook_k": k, "hook_v": v, "hook_attn_scores": scores, "hook_pattern": pattern,
                 "hook_z": z}


def mlp(x, W_in, b_in, W_out, b_out, act):
    pre = x @ W_in + b_in  # [pos, d_mlp]
    post = ACTIVATIONS[act](pre)  # [pos, d_mlp]
    return post @ W_out + b_out, {"hook_pre": pre, "hook_post": post}  # [pos, d_model]


ACTIVATIONS = {"gelu_new": gelu_new, "relu": relu}


def forward(params, cfg, tokens):
    """Logits [pos, d_vocab] of one sequence ``tokens`` [pos], and every activation by hook name."""
    p, acts = params, {}
    pos = len(tokens)
    acts["hook_embed"] = p["embed.W_E"][tokens]  # [pos, d_model]
    acts["hook_pos_embed"] = p["pos_embed.W_pos"][:pos]  # [pos, d_model]
    x = acts["hook_embed"] + acts["hook_pos_embed"]  # [pos, d_model]
    for L in range(cfg.n_layers):
        b = f"blocks.{L}."
        acts[b + "hook_resid_pre"] = x
        h, ln1 = layer_norm(x, p[b + "ln1.w"], p[b + "ln1.b"], cfg.eps)  # [pos, d_model]
        attn_out, attn = attention(h, *(p[b + "attn." + n] for n in ATTN_PARAMS), cfg.score_scale(L))
        x = x + attn_out  # [pos, d_model]
        acts[b + "hook_attn_out"], acts[b + "hook_resid_mid"] = attn_out, x
        h, ln2 = layer_norm(x, p[b + "ln2.w"], p[b + "ln2.b"], cfg.eps)  # [pos, d_model]
        mlp_out, m = mlp(h, *(p[b + "mlp." + n] for n in MLP_PARAMS), cfg.act_fn)
        x = x + mlp_out  # [pos, d_model]
        acts[b + "hook_mlp_out"], acts[b + "hook_resid_post"] = mlp_out, x
        for prefix, named in ((b + "ln1.", ln1), (b + "attn.", attn), (b + "ln2.", ln2), (b + "mlp.", m)):
            acts.update({prefix + name: value for name, value in named.items()})
    final, ln_final = layer_norm(x, p["ln_final.w"], p["ln_final.b"], cfg.eps)  # [pos, d_model]
    acts.update({"ln_final." + name: value for name, value in ln_final.items()})
    logits = final @ p["unembed.W_U"] + p.get("unembed.b_U", 0)  # [pos, d_vocab]
    return logits, acts


ATTN_PARAMS = ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O")
MLP_PARAMS = ("W_in", "b_in", "W_out", "b_out")


# ---- the backward pass: each op's backward, then the whole model read backwards ---------------


def layer_norm_backward(grad, w, normalized, scale):
    """∂x, ∂w, ∂b from ∂out: the textbook (ĝ − mean(ĝ) − x̂·mean(ĝ ⊙ x̂)) / σ, with ĝ = ∂out ⊙ w."""
    g = grad * w  # [pos, d_model] ∂loss/∂x̂
    dx = (g - g.mean(-1, keepdims=True) - normalized * (g * normalized).mean(-1, keepdims=True)) / scale
    return dx, (grad * normalized).sum(0), grad.sum(0)  # [pos, d_model], [d_model], [d_model]


def gelu_new_backward(x, grad):
    c = np.sqrt(2 / np.pi)
    t = np.tanh(c * (x + 0.044715 * x ** 3))  # [pos, d_mlp]
    return grad * (0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * c * (1 + 3 * 0.044715 * x ** 2))  # [pos, d_mlp]


def relu_backward(x, grad):
    return grad * (x > 0)  # [pos, d_mlp]


def attention_backward(grad, x, saved, W_Q, W_K, W_V, W_O, score_scale):
    """∂x and the weights' gradients from ∂out [pos, d_model]; ``saved``: the forward's q, k, v, pattern, z."""
    q, k, v, pattern, z = (saved[n] for n in ("hook_q", "hook_k", "hook_v", "hook_pattern", "hook_z"))
    dz = np.einsum("pd,hed->phe", grad, W_O)  # [pos, head, d_head]
    dpattern = np.einsum("qhe,khe->hqk", dz, v)  # [head, query, key]
    dv = np.einsum("hqk,qhe->khe", pattern, dz)  # [pos, head, d_head]
    dscores = pattern * (dpattern - (pattern * dpattern).sum(-1, keepdims=True))  # [head, query, key]
    dq = np.einsum("hqk,khe->qhe", dscores, k) * score_scale  # [pos, head, d_head]
    dk = np.einsum("hqk,qhe->khe", dscores, q) * score_scale  # [pos, head, d_head]
    dx = (np.einsum("phe,hde->pd", dq, W_Q) + np.einsum("phe,hde->pd", dk, W_K)
          + np.einsum("phe,hde->pd", dv, W_V))  # [pos, d_model]
    grads = {"W_O": np.einsum("phe,pd->hed", z, grad), "b_O": grad.sum(0)}
    for name, d in (("Q", dq), ("K", dk), ("V", dv)):
        grads[f"W_{name}"], grads[f"b_{name}"] = np.einsum("pd,phe->hde", x, d), d.sum(0)  # [head, d_model, d_head], [head, d_head]
    grads.update({"hook_z": dz, "hook_pattern": dpattern, "hook_attn_scores": dscores, "hook_q": dq, "hook_k": dk,
                  "hook_v": dv})
    return dx, grads


def mlp_backward(grad, x, saved, W_in, W_out, act):
    """∂x and the weights' gradients from ∂out [pos, d_model]; ``saved``: the forward's pre, post."""
    pre, post = saved["hook_pre"], saved["hook_post"]
    dpost = grad @ W_out.T  # [pos, d_mlp]
    dpre = BACKWARDS[act](pre, dpost)  # [pos, d_mlp]
    grads = {"W_out": post.T @ grad, "b_out": grad.sum(0), "W_in": x.T @ dpre, "b_in": dpre.sum(0),
             "hook_post": dpost, "hook_pre": dpre}
    return dpre @ W_in.T, grads  # [pos, d_model]


BACKWARDS = {"gelu_new": gelu_new_backward, "relu": relu_backward}


def cross_entropy(logits, tokens):
    """Mean next-token loss over positions 0 … pos − 2, and ∂loss/∂logits [pos, d_vocab]."""
    targets = tokens[1:]  # [pos − 1]: position i predicts token i + 1
    probs = softmax(logits[:-1])  # [pos − 1, d_vocab]
    n = len(targets)
    loss = -np.log(probs[np.arange(n), targets]).mean()
    dlogits = np.zeros_like(logits)  # [pos, d_vocab]; the last position has no target
    dlogits[:-1] = probs
    dlogits[np.arange(n), targets] -= 1
    return loss, dlogits / n


def backward(params, cfg, tokens, acts, logits):
    """(loss, gradients): ∂loss/∂ every parameter (its TransformerLens name and shape; W_E's is the
    embedding's use only, W_U's the unembedding's) and ∂loss/∂ each activation named in ``forward``
    (the residual stream, attention's q … z, the MLP's pre and post)."""
    p, grads = params, {}
    loss, dlogits = cross_entropy(logits, tokens)  # [pos, d_vocab]
    final = acts["ln_final.hook_normalized"] * p["ln_final.w"] + p["ln_final.b"]  # [pos, d_model]
    grads["unembed.W_U"] = final.T @ dlogits  # [d_model, d_vocab]
    if "unembed.b_U" in p:
        grads["unembed.b_U"] = dlogits.sum(0)  # [d_vocab]
    dx, grads["ln_final.w"], grads["ln_final.b"] = layer_norm_backward(
        dlogits @ p["unembed.W_U"].T, p["ln_final.w"], acts["ln_final.hook_normalized"], acts["ln_final.hook_scale"])
    for L in reversed(range(cfg.n_layers)):
        b = f"blocks.{L}."
        grads[b + "hook_resid_post"] = grads[b + "hook_mlp_out"] = dx  # a residual sum copies the gradient
        h = acts[b + "ln2.hook_normalized"] * p[b + "ln2.w"] + p[b + "ln2.b"]  # [pos, d_model], what the MLP read
        dh, m = mlp_backward(dx, h, {n: acts[b + "mlp." + n] for n in ("hook_pre", "hook_post")},
                             p[b + "mlp.W_in"], p[b + "mlp.W_out"], cfg.act_fn)
        dln, grads[b + "ln2.w"], grads[b + "ln2.b"] = layer_norm_backward(
            dh, p[b + "ln2.w"], acts[b + "ln2.hook_normalized"], acts[b + "ln2.hook_scale"])
        dx = dx + dln  # [pos, d_model]
        grads[b + "hook_resid_mid"] = grads[b + "hook_attn_out"] = dx
        h = acts[b + "ln1.hook_normalized"] * p[b + "ln1.w"] + p[b + "ln1.b"]  # [pos, d_model], what attention read
        saved = {n: acts[b + "attn." + n] for n in ("hook_q", "hook_k", "hook_v", "hook_pattern", "hook_z")}
        dh, a = attention_backward(dx, h, saved, *(p[b + "attn.W_" + n] for n in "QKVO"), cfg.score_scale(L))
        dln, grads[b + "ln1.w"], grads[b + "ln1.b"] = layer_norm_backward(
            dh, p[b + "ln1.w"], acts[b + "ln1.hook_normalized"], acts[b + "ln1.hook_scale"])
        dx = dx + dln  # [pos, d_model]
        grads[b + "hook_resid_pre"] = dx
        grads.update({b + "mlp." + n: g for n, g in m.items()})
        grads.update({b + "attn." + n: g for n, g in a.items()})
    grads["hook_embed"] = grads["hook_pos_embed"] = dx
    grads["embed.W_E"] = np.zeros_like(p["embed.W_E"])  # [d_vocab, d_model]
    np.add.at(grads["embed.W_E"], tokens, dx)  # a token that occurs twice gets both rows
    grads["pos_embed.W_pos"] = np.zeros_like(p["pos_embed.W_pos"])  # [n_ctx, d_model]
    grads["pos_embed.W_pos"][:len(tokens)] = dx
    return loss, grads
