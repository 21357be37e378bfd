"""A naive NumPy GPT-2 forward pass, written the straightforward way (as picoGPT does).

This is the baseline refgpt is measured against: the textbook formulas with no thought for speed —
heads split into a Python list and looped over, a boolean mask built per call, GELU with x**3,
temporaries everywhere. It reads HF-layout weights (``wte``, ``h.L.attn.c_attn.weight`` …).
"""

from __future__ import annotations

import numpy as np


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def layer_norm(x, g, b, eps=1e-5):
    mean = np.mean(x, axis=-1, keepdims=True)
    var = np.var(x, axis=-1, keepdims=True)
    return g * (x - mean) / np.sqrt(var + eps) + b


def linear(x, w, b):
    return x @ w + b


def attention(q, k, v, mask):
    return softmax(q @ k.T / np.sqrt(q.shape[-1]) + mask) @ v


def mha(x, c_attn_w, c_attn_b, c_proj_w, c_proj_b, n_head):
    x = linear(x, c_attn_w, c_attn_b)
    qkv = np.split(x, 3, axis=-1)
    qkv_heads = [np.split(t, n_head, axis=-1) for t in qkv]
    mask = (1 - np.tri(x.shape[0], dtype=x.dtype)) * -1e10
    out_heads = [attention(q, k, v, mask) for q, k, v in zip(*qkv_heads)]
    return linear(np.hstack(out_heads), c_proj_w, c_proj_b)


def forward(tokens, w, n_head, n_layer):
    """Logits [pos, d_vocab] for one sequence of tokens [pos]; ``w`` maps HF keys to arrays."""
    x = w["wte.weight"][tokens] + w["wpe.weight"][range(len(tokens))]
    for i in range(n_layer):
        h = f"h.{i}."
        a = layer_norm(x, w[h + "ln_1.weight"], w[h + "ln_1.bias"])
        x = x + mha(a, w[h + "attn.c_attn.weight"], w[h + "attn.c_attn.bias"],
                    w[h + "attn.c_proj.weight"], w[h + "attn.c_proj.bias"], n_head)
        m = layer_norm(x, w[h + "ln_2.weight"], w[h + "ln_2.bias"])
        x = x + linear(gelu(linear(m, w[h + "mlp.c_fc.weight"], w[h + "mlp.c_fc.bias"])),
                       w[h + "mlp.c_proj.weight"], w[h + "mlp.c_proj.bias"])
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"])
    return x @ w["wte.weight"].T
