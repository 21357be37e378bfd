"""GPT-2's weights: HF's checkpoint names and layouts → TransformerLens's circuits names, and back.

This is where ports most often go wrong, so it is written out once, and the loader uses it
(refgpt/files/checkpoint.py). HF's GPT-2 (``GPT2LMHeadModel``, OpenAI's TensorFlow layout) stores
its linear layers as **Conv1D**: the weight is [in, out] and y = x·W + b — not torch's nn.Linear
[out, in]. The attention's three input projections are one matrix, ``c_attn`` [d, 3·d], whose
columns are Q | K | V, each d = h·e columns of heads side by side. The unembedding is tied:
W_U = W_Eᵀ unless the checkpoint stores a separate ``lm_head.weight`` [v, d].

    HF key (``transformer.`` taken off)         circuits name              shape
    wte.weight [v, d]                            embed.W_E                  [v, d]
    wpe.weight [n_ctx, d]                        pos_embed.W_pos            [n_ctx, d]
    h.L.ln_1.weight, .bias [d]                   blocks.L.ln1.w, .b         [d]
    h.L.attn.c_attn.weight [d, 3d], columns Q|K|V   blocks.L.attn.W_Q/W_K/W_V  [h, d, e]
    h.L.attn.c_attn.bias [3d]                    blocks.L.attn.b_Q/b_K/b_V  [h, e]
    h.L.attn.c_proj.weight [d, d], rows by head  blocks.L.attn.W_O          [h, e, d]
    h.L.attn.c_proj.bias [d]                     blocks.L.attn.b_O          [d]
    h.L.ln_2.weight, .bias [d]                   blocks.L.ln2.w, .b         [d]
    h.L.mlp.c_fc.weight [d, m], .bias [m]        blocks.L.mlp.W_in, b_in    [d, m], [m]
    h.L.mlp.c_proj.weight [m, d], .bias [d]      blocks.L.mlp.W_out, b_out  [m, d], [d]
    ln_f.weight, .bias [d]                       ln_final.w, .b             [d]
    wte.weight (tied) or lm_head.weight [v, d]   unembed.W_U                [d, v] (the transpose)

Every map below is a reshape or transpose of the stored array (a view wherever NumPy can make one):
no number changes, so ``to_hf(to_circuits(t)) == t`` bit for bit.
"""

import numpy as np


def param_shapes(d_model, n_layers, n_heads, d_mlp, d_vocab, n_ctx):
    """Every parameter's circuits name → shape (``unembed.b_U``, optional, is not among them)."""
    d, h, e, m = d_model, n_heads, d_model // n_heads, d_mlp
    shapes = {"embed.W_E": (d_vocab, d), "pos_embed.W_pos": (n_ctx, d)}
    for L in range(n_layers):
        blk = f"blocks.{L}."
        shapes.update({blk + "ln1.w": (d,), blk + "ln1.b": (d,)})
        for x in "QKV":
            shapes.update({blk + f"attn.W_{x}": (h, d, e), blk + f"attn.b_{x}": (h, e)})
        shapes.update({blk + "attn.W_O": (h, e, d), blk + "attn.b_O": (d,)})
        shapes.update({blk + "ln2.w": (d,), blk + "ln2.b": (d,)})
        shapes.update({blk + "mlp.W_in": (d, m), blk + "mlp.b_in": (m,), blk + "mlp.W_out": (m, d),
                       blk + "mlp.b_out": (d,)})
    shapes.update({"ln_final.w": (d,), "ln_final.b": (d,), "unembed.W_U": (d, d_vocab)})
    return shapes


def to_circuits(t, n_layers, n_heads, tied=True):
    """HF's tensors ``t`` (keys without ``transformer.``) → circuits names, as views where possible."""
    d = t["wte.weight"].shape[1]
    h, e = n_heads, d // n_heads
    params = {"embed.W_E": t["wte.weight"], "pos_embed.W_pos": t["wpe.weight"]}
    for L in range(n_layers):
        hf, blk = f"h.{L}.", f"blocks.{L}."
        W_qkv = t[hf + "attn.c_attn.weight"]  # [d_model, 3·d_model] = Q | K | V
        b_qkv = t[hf + "attn.c_attn.bias"]  # [3·d_model]
        for i, x in enumerate("QKV"):
            cols = slice(i * d, (i + 1) * d)
            params[blk + f"attn.W_{x}"] = W_qkv[:, cols].reshape(d, h, e).transpose(1, 0, 2)  # [head, d_model, d_head]
            params[blk + f"attn.b_{x}"] = b_qkv[cols].reshape(h, e)  # [head, d_head]
        params[blk + "attn.W_O"] = t[hf + "attn.c_proj.weight"].reshape(h, e, d)  # [head, d_head, d_model]
        params[blk + "attn.b_O"] = t[hf + "attn.c_proj.bias"]  # [d_model]
        params[blk + "mlp.W_in"] = t[hf + "mlp.c_fc.weight"]  # [d_model, d_mlp]
        params[blk + "mlp.b_in"] = t[hf + "mlp.c_fc.bias"]  # [d_mlp]
        params[blk + "mlp.W_out"] = t[hf + "mlp.c_proj.weight"]  # [d_mlp, d_model]
        params[blk + "mlp.b_out"] = t[hf + "mlp.c_proj.bias"]  # [d_model]
        for n in (1, 2):
            params[blk + f"ln{n}.w"] = t[hf + f"ln_{n}.weight"]  # [d_model]
            params[blk + f"ln{n}.b"] = t[hf + f"ln_{n}.bias"]  # [d_model]
    params["ln_final.w"] = t["ln_f.weight"]  # [d_model]
    params["ln_final.b"] = t["ln_f.bias"]  # [d_model]
    lm_head = t["wte.weight"] if tied else t["lm_head.weight"]  # [d_vocab, d_model]
    params["unembed.W_U"] = lm_head.T  # [d_model, d_vocab]
    return params


def to_hf(params, n_layers, tied=True, prefix="transformer."):
    """Circuits names → HF's GPT2LMHeadModel keys and layouts, the inverse of ``to_circuits``;
    ``lm_head.weight`` only when not ``tied`` (HF's save_pretrained stores a tied one once, as wte)."""
    p = params
    d = p["embed.W_E"].shape[1]
    t = {"wte.weight": p["embed.W_E"], "wpe.weight": p["pos_embed.W_pos"]}
    for L in range(n_layers):
        blk, hf = f"blocks.{L}.", f"h.{L}."
        for n in (1, 2):
            t[hf + f"ln_{n}.weight"], t[hf + f"ln_{n}.bias"] = p[blk + f"ln{n}.w"], p[blk + f"ln{n}.b"]  # [d_model]
        t[hf + "attn.c_attn.weight"] = np.concatenate(
            [p[blk + f"attn.W_{x}"].transpose(1, 0, 2).reshape(d, d) for x in "QKV"], axis=1)  # [d_model, 3·d_model]
        t[hf + "attn.c_attn.bias"] = np.concatenate([p[blk + f"attn.b_{x}"].reshape(d) for x in "QKV"])  # [3·d_model]
        t[hf + "attn.c_proj.weight"] = p[blk + "attn.W_O"].reshape(d, d)  # [head·d_head, d_model]
        t[hf + "attn.c_proj.bias"] = p[blk + "attn.b_O"]  # [d_model]
        t[hf + "mlp.c_fc.weight"], t[hf + "mlp.c_fc.bias"] = p[blk + "mlp.W_in"], p[blk + "mlp.b_in"]
        t[hf + "mlp.c_proj.weight"], t[hf + "mlp.c_proj.bias"] = p[blk + "mlp.W_out"], p[blk + "mlp.b_out"]
    t["ln_f.weight"], t["ln_f.bias"] = p["ln_final.w"], p["ln_final.b"]
    tensors = {prefix + k: v for k, v in t.items()}
    if not tied:
        tensors["lm_head.weight"] = p["unembed.W_U"].T  # [d_vocab, d_model]
    return tensors
