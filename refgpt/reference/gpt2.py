"""GPT-2, written plainly: its forward pass and its backward, one small function per op.

This file is the specification. It is GPT-2 as the paper and OpenAI's code define it, in the
shapes and names of TransformerLens's circuits notation, with nothing else: no hooks, no blocking,
no in-place tricks, no validation, one sequence at a time. Everything else in refgpt that computes
GPT-2 — the Model's fast forward (refgpt/model.py), its cached and KV-cached passes, padding, the
analytic backward (refgpt/backward.py), the golden files — is tested against this copy, op by op,
to the rounding bounds of ``bounds.py`` beside it (tests/core/test_plain.py, tests/reference/).

    x = W_E[tokens] + W_pos[:pos]                                   [pos, d_model]
    for each block:  x = x + attention(LN1(x));  x = x + mlp(LN2(x))
    logits = LN_final(x) · W_U (+ b_U)                              [pos, d_vocab]

The letters of every einsum and shape comment:

    p, q, k   positions: any, a query's, a key's          (pos)
    d         the residual stream's width                 (d_model)
    h         attention heads                             (n_heads)
    e         one head's width                            (d_head = d_model / n_heads)
    m         the MLP's hidden width                      (d_mlp)
    v         the vocabulary                              (d_vocab)

The weights, by TransformerLens name and shape (``weights.py`` maps them from HF's checkpoints):

    embed.W_E [v, d]   pos_embed.W_pos [n_ctx, d]   unembed.W_U [d, v]   unembed.b_U [v] (optional)
    blocks.L.ln1.w, .b [d]   blocks.L.ln2.w, .b [d]   ln_final.w, .b [d]
    blocks.L.attn.W_Q, W_K, W_V [h, d, e]   b_Q, b_K, b_V [h, e]   W_O [h, e, d]   b_O [d]
    blocks.L.mlp.W_in [d, m]   b_in [m]   W_out [m, d]   b_out [d]

``cfg`` is anything with the fields ``n_layers``, ``eps`` (LayerNorm's ε), ``act_fn`` (a key of
``ACTIVATIONS``) and ``score_scale(layer)`` (refgpt's Config; ``score_scale`` below is its
definition). ``forward`` returns the logits and every activation under its TransformerLens hook
name (``blocks.0.attn.hook_pattern`` …) without the batch axis; ``backward`` returns the gradient
of the mean next-token cross-entropy with respect to every parameter and the main activations.
Derivations: docs/backward.md.
"""

import math

import numpy as np


def score_scale(d_head, layer, use_attn_scale=True, scale_attn_by_inverse_layer_idx=False):
    """The factor the scores q·kᵀ of block ``layer`` are multiplied by: 1/√d_head (HF's
    ``scale_attn_weights``), also divided by layer + 1 with ``scale_attn_by_inverse_layer_idx``.
    HF folds both into one factor and multiplies; so does refgpt, to agree with it bit for bit."""
    scale = d_head ** -0.5 if use_attn_scale else 1.0
    if scale_attn_by_inverse_layer_idx:
        scale /= float(layer + 1)
    return scale


# ---- the ops ----------------------------------------------------------------------------------


def layer_norm(x, w, b, eps):
    """x [pos, d] → (w ⊙ x̂ + b [pos, d], {mean [pos, 1], scale σ [pos, 1], normalized x̂ [pos, d]})."""
    mean = x.mean(-1, keepdims=True)  # [pos, 1]
    centered = x - mean  # [pos, d]
    scale = np.sqrt((centered ** 2).mean(-1, keepdims=True) + eps)  # [pos, 1]
    normalized = centered / scale  # [pos, d]
    return normalized * w + b, {"hook_mean": mean, "hook_scale": scale, "hook_normalized": normalized}


def softmax(x):
    """x [..., n] → [..., n], over the last axis; exp(−∞) = 0."""
    e = np.exp(x - x.max(-1, keepdims=True))  # [..., n]
    return e / e.sum(-1, keepdims=True)  # [..., n]


def attention(x, W_Q, b_Q, W_K, b_K, W_V, b_V, W_O, b_O, score_scale):
    """x [pos, d] → (out [pos, d], {q, k, v [pos, h, e], scores, pattern [h, q, k], z [pos, h, e]})."""
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
    """x [pos, d] → (out [pos, d], {pre, post [pos, m]}); ``act`` a key of ACTIVATIONS."""
    pre = x @ W_in + b_in  # [pos, d_mlp]
    post = ACTIVATIONS[act][0](pre)  # [pos, d_mlp]
    return post @ W_out + b_out, {"hook_pre": pre, "hook_post": post}  # [pos, d_model]


# ---- the MLP's nonlinearities and their derivatives: f(x) and f_backward(x, ∂f) = ∂f ⊙ f′(x) -----
# GPT-2 uses gelu_new. The others are what other GPT-2-architecture checkpoints put in HF's
# ``activation_function``; each is written as the engine (refgpt/gpt2/activations.py) writes it,
# operation for operation, so the two agree bit for bit. All are elementwise: [...] → [...].

C_TANH = math.sqrt(2 / math.pi)  # √(2/π), GELU's tanh approximation's constant


def gelu_new(x):
    """½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): GELU, tanh approximation, as OpenAI wrote it."""
    return 0.5 * x * (1 + np.tanh(C_TANH * (x + 0.044715 * x ** 3)))


def gelu_new_backward(x, grad):
    """f′ = ½(1 + t) + ½x·(1 − t²)·√(2/π)·(1 + 3·0.044715·x²), t = tanh(√(2/π)·(x + 0.044715·x³))."""
    t = np.tanh(C_TANH * (x + 0.044715 * x ** 3))
    return grad * (0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * C_TANH * (1 + 3 * 0.044715 * x ** 2))


def gelu_fast(x):
    """gelu_new with √(2/π) truncated to 0.7978845608 (HF's FastGELU)."""
    return 0.5 * x * (1.0 + np.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def gelu_fast_backward(x, grad):
    x2 = x * x
    t = np.tanh(0.7978845608 * x * (1.0 + 0.044715 * x2))
    return grad * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (0.7978845608 * (1.0 + 3.0 * 0.044715 * x2)))


_erf = np.frompyfunc(math.erf, 1, 1)  # the C library's erf, elementwise, in float64


def gelu(x):
    """Exact GELU: x·Φ(x) = x·½·(1 + erf(x·√½)), erf in float64 rounded to x's dtype."""
    return x * 0.5 * (1.0 + _erf(np.asarray(x, np.float64) * math.sqrt(0.5)).astype(x.dtype))


def gelu_backward(x, grad):
    """f′ = Φ(x) + x·φ(x), φ(x) = e^(−x²/2)/√(2π)."""
    cdf = 0.5 * (1.0 + _erf(np.asarray(x, np.float64) * math.sqrt(0.5)).astype(x.dtype))
    return grad * (cdf + x * (np.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))))


def sigmoid(x):
    """1/(1 + e^(−x)), as e^x/(1 + e^x) for x < 0, so that neither branch overflows."""
    e = np.exp(-np.abs(x))  # (0, 1]
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def quick_gelu(x):
    """x·σ(1.702·x)."""
    return x * sigmoid(1.702 * x)


def quick_gelu_backward(x, grad):
    s = sigmoid(1.702 * x)
    return grad * (s + 1.702 * x * s * (1.0 - s))


def silu(x):
    """x·σ(x) (also called swish)."""
    return x * sigmoid(x)


def silu_backward(x, grad):
    s = sigmoid(x)
    return grad * (s * (1.0 + x * (1.0 - s)))


def relu(x):
    return np.maximum(x, 0.0)


def relu_backward(x, grad):
    """f′ = 1 where x > 0, else 0 (at 0 too, as torch has it)."""
    return np.where(x > 0, grad, 0.0)


def tanh(x):
    return np.tanh(x)


def tanh_backward(x, grad):
    t = np.tanh(x)
    return grad * (1.0 - t * t)


#: HF's ``activation_function`` name → (f, f_backward): every activation the Model accepts.
ACTIVATIONS = {
    "gelu_new": (gelu_new, gelu_new_backward),
    "gelu_pytorch_tanh": (gelu_new, gelu_new_backward),  # torch's kernel of the same formula
    "gelu": (gelu, gelu_backward),
    "gelu_fast": (gelu_fast, gelu_fast_backward),
    "quick_gelu": (quick_gelu, quick_gelu_backward),
    "relu": (relu, relu_backward),
    "silu": (silu, silu_backward),
    "swish": (silu, silu_backward),
    "tanh": (tanh, tanh_backward),
}


# ---- the forward pass --------------------------------------------------------------------------

ATTN_PARAMS = ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O")
MLP_PARAMS = ("W_in", "b_in", "W_out", "b_out")


def forward(params, cfg, tokens):
    """tokens [pos] → (logits [pos, d_vocab], every activation by hook name, without the batch axis)."""
    p, acts = params, {}
    pos = len(tokens)
    acts["hook_embed"] = p["embed.W_E"][tokens]  # [pos, d_model]
    acts["hook_pos_embed"] = p["pos_embed.W_pos"][:pos]  # [pos, d_model]
    x = acts["hook_embed"] + acts["hook_pos_embed"]  # [pos, d_model]
    for L in range(cfg.n_layers):
        blk = f"blocks.{L}."
        acts[blk + "hook_resid_pre"] = x
        h, ln1 = layer_norm(x, p[blk + "ln1.w"], p[blk + "ln1.b"], cfg.eps)  # [pos, d_model]
        attn_out, attn = attention(h, *(p[blk + "attn." + n] for n in ATTN_PARAMS), cfg.score_scale(L))
        x = x + attn_out  # [pos, d_model]
        acts[blk + "hook_attn_out"], acts[blk + "hook_resid_mid"] = attn_out, x
        h, ln2 = layer_norm(x, p[blk + "ln2.w"], p[blk + "ln2.b"], cfg.eps)  # [pos, d_model]
        mlp_out, m = mlp(h, *(p[blk + "mlp." + n] for n in MLP_PARAMS), cfg.act_fn)
        x = x + mlp_out  # [pos, d_model]
        acts[blk + "hook_mlp_out"], acts[blk + "hook_resid_post"] = mlp_out, x
        for prefix, named in ((blk + "ln1.", ln1), (blk + "attn.", attn), (blk + "ln2.", ln2), (blk + "mlp.", m)):
            acts.update({prefix + name: value for name, value in named.items()})
    final, ln_final = layer_norm(x, p["ln_final.w"], p["ln_final.b"], cfg.eps)  # [pos, d_model]
    acts.update({"ln_final." + name: value for name, value in ln_final.items()})
    logits = final @ p["unembed.W_U"] + p.get("unembed.b_U", 0)  # [pos, d_vocab]
    return logits, acts


# ---- the backward pass: each op's backward, then the whole model read backwards ---------------


def layer_norm_backward(grad, w, normalized, scale):
    """∂out [pos, d] → ∂x [pos, d], ∂w [d], ∂b [d]: the textbook (ĝ − mean ĝ − x̂·mean(ĝ ⊙ x̂))/σ,
    ĝ = ∂out ⊙ w, from the forward's x̂ [pos, d] and σ [pos, 1]."""
    g = grad * w  # [pos, d_model] ∂loss/∂x̂
    dx = (g - g.mean(-1, keepdims=True) - normalized * (g * normalized).mean(-1, keepdims=True)) / scale
    return dx, (grad * normalized).sum(0), grad.sum(0)  # [pos, d_model], [d_model], [d_model]


def attention_backward(grad, x, saved, W_Q, W_K, W_V, W_O, score_scale):
    """∂out [pos, d] → ∂x [pos, d] and the weights' and activations' gradients, from attention's
    input x [pos, d] and ``saved``, the forward's q, k, v, pattern and z."""
    q, k, v, pattern, z = (saved[n] for n in ("hook_q", "hook_k", "hook_v", "hook_pattern", "hook_z"))
    dz = np.einsum("pd,hed->phe", grad, W_O)  # [pos, head, d_head]
    dpattern = np.einsum("qhe,khe->hqk", dz, v)  # [head, query, key]
    dv = np.einsum("hqk,qhe->khe", pattern, dz)  # [pos, head, d_head]
    dscores = pattern * (dpattern - (pattern * dpattern).sum(-1, keepdims=True))  # [head, query, key]
    dq = np.einsum("hqk,khe->qhe", dscores, k) * score_scale  # [pos, head, d_head]
    dk = np.einsum("hqk,qhe->khe", dscores, q) * score_scale  # [pos, head, d_head]
    dx = (np.einsum("phe,hde->pd", dq, W_Q) + np.einsum("phe,hde->pd", dk, W_K)
          + np.einsum("phe,hde->pd", dv, W_V))  # [pos, d_model]
    grads = {"W_O": np.einsum("phe,pd->hed", z, grad), "b_O": grad.sum(0)}  # [head, d_head, d_model], [d_model]
    for name, d in (("Q", dq), ("K", dk), ("V", dv)):
        grads[f"W_{name}"] = np.einsum("pd,phe->hde", x, d)  # [head, d_model, d_head]
        grads[f"b_{name}"] = d.sum(0)  # [head, d_head]
    grads.update({"hook_z": dz, "hook_pattern": dpattern, "hook_attn_scores": dscores, "hook_q": dq, "hook_k": dk,
                  "hook_v": dv})
    return dx, grads


def mlp_backward(grad, x, saved, W_in, W_out, act):
    """∂out [pos, d] → ∂x [pos, d] and the weights' and activations' gradients, from the MLP's
    input x [pos, d] and ``saved``, the forward's pre and post [pos, m]."""
    pre, post = saved["hook_pre"], saved["hook_post"]
    dpost = grad @ W_out.T  # [pos, d_mlp]
    dpre = ACTIVATIONS[act][1](pre, dpost)  # [pos, d_mlp]
    grads = {"W_out": post.T @ grad, "b_out": grad.sum(0), "W_in": x.T @ dpre, "b_in": dpre.sum(0),
             "hook_post": dpost, "hook_pre": dpre}
    return dpre @ W_in.T, grads  # [pos, d_model]


def cross_entropy(logits, tokens):
    """logits [pos, v], tokens [pos] → (the mean next-token loss over positions 0 … pos − 2,
    ∂loss/∂logits [pos, v])."""
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
    (the residual stream, attention's q … z, the MLP's pre and post), from ``forward``'s outputs."""
    p, grads = params, {}
    loss, dlogits = cross_entropy(logits, tokens)  # [pos, d_vocab]
    final = acts["ln_final.hook_normalized"] * p["ln_final.w"] + p["ln_final.b"]  # [pos, d_model]
    grads["unembed.W_U"] = final.T @ dlogits  # [d_model, d_vocab]
    if "unembed.b_U" in p:
        grads["unembed.b_U"] = dlogits.sum(0)  # [d_vocab]
    dx, grads["ln_final.w"], grads["ln_final.b"] = layer_norm_backward(
        dlogits @ p["unembed.W_U"].T, p["ln_final.w"], acts["ln_final.hook_normalized"], acts["ln_final.hook_scale"])
    for L in reversed(range(cfg.n_layers)):
        blk = f"blocks.{L}."
        grads[blk + "hook_resid_post"] = grads[blk + "hook_mlp_out"] = dx  # a residual sum copies the gradient
        h = acts[blk + "ln2.hook_normalized"] * p[blk + "ln2.w"] + p[blk + "ln2.b"]  # [pos, d_model], the MLP's input
        dh, m = mlp_backward(dx, h, {n: acts[blk + "mlp." + n] for n in ("hook_pre", "hook_post")},
                             p[blk + "mlp.W_in"], p[blk + "mlp.W_out"], cfg.act_fn)
        dln, grads[blk + "ln2.w"], grads[blk + "ln2.b"] = layer_norm_backward(
            dh, p[blk + "ln2.w"], acts[blk + "ln2.hook_normalized"], acts[blk + "ln2.hook_scale"])
        dx = dx + dln  # [pos, d_model]
        grads[blk + "hook_resid_mid"] = grads[blk + "hook_attn_out"] = dx
        h = acts[blk + "ln1.hook_normalized"] * p[blk + "ln1.w"] + p[blk + "ln1.b"]  # [pos, d_model], attention's input
        saved = {n: acts[blk + "attn." + n] for n in ("hook_q", "hook_k", "hook_v", "hook_pattern", "hook_z")}
        dh, a = attention_backward(dx, h, saved, *(p[blk + "attn.W_" + n] for n in "QKVO"), cfg.score_scale(L))
        dln, grads[blk + "ln1.w"], grads[blk + "ln1.b"] = layer_norm_backward(
            dh, p[blk + "ln1.w"], acts[blk + "ln1.hook_normalized"], acts[blk + "ln1.hook_scale"])
        dx = dx + dln  # [pos, d_model]
        grads[blk + "hook_resid_pre"] = dx
        grads.update({blk + "mlp." + n: g for n, g in m.items()})
        grads.update({blk + "attn." + n: g for n, g in a.items()})
    grads["hook_embed"] = grads["hook_pos_embed"] = dx
    grads["embed.W_E"] = np.zeros_like(p["embed.W_E"])  # [d_vocab, d_model]
    np.add.at(grads["embed.W_E"], tokens, dx)  # a token that occurs twice gets both rows
    grads["pos_embed.W_pos"] = np.zeros_like(p["pos_embed.W_pos"])  # [n_ctx, d_model]
    grads["pos_embed.W_pos"][:len(tokens)] = dx
    return loss, grads
