"""A golden file: every number of one GPT-2 pass, laid out so that any language can read it.

The file is safetensors: 8 bytes (a little-endian u64 n), n bytes of JSON header, then the raw
little-endian arrays back to back. The header maps each tensor's name to {"dtype", "shape",
"data_offsets": [begin, end)} (offsets into the data after the header), and "__metadata__" to
strings. ``read`` below is a complete reader.

The tensors, in this order (the order the forward pass computes them), batch first:

    tokens [batch, pos] int64
    hook_embed, hook_pos_embed [batch, pos, d_model]
    for each block L, blocks.L. + BLOCK (below)
    ln_final.hook_mean, .hook_scale [batch, pos, 1], ln_final.hook_normalized, ln_final.out [batch, pos, d_model]
    logits, log_probs [batch, pos, d_vocab]
    targets [batch, pos − 1] int64 (the next tokens), loss [batch, pos − 1] (each position's −log p);
    both [batch, pos] when the tokens came with their own targets (llm.c's x and y)

Every activation is the hook point's of TransformerLens (gpt2.py's ``forward``, plus a batch
axis); ``….out`` is a LayerNorm's output w ⊙ x̂ + b, which TransformerLens has no hook for.
q, k, v and z are [batch, pos, head, d_head], scores and pattern [batch, head, query, key] with
scores −∞ above the diagonal; the MLP's pre and post [batch, pos, d_mlp]; a LayerNorm's mean and
scale [batch, pos, 1]. A golden made with ``--backward`` adds ``loss_mean`` and ∂loss_mean/∂X as
``grad.X`` for every activation and parameter X, in the order the backward pass computes them
(a tied model adds ``grad.tied_W_E``, the one matrix's gradient from both uses); a
decode golden prefixes each step's tensors with ``step.S.``; a padded one adds
``attention_mask`` and ``position_ids``.

The metadata (strings; JSON where structured): ``format`` ("refgpt-golden"), ``format_version``,
``refgpt_version``, ``config`` (HF's config.json of the model), ``weights_sha256`` ({file: sha256}),
``dtype``, ``numpy_version``, ``blas``, ``python_version``, ``command``, and what the oracle's
rule reads (compare.py): ``conditioning`` {name: c_X}, ``error_rms`` {name: r_X} and
``row_freedom`` {name: f_X}, each in units of 2⁻²⁴, measured by float32 passes of the same model.
"""

import json

import numpy as np

#: A block's tensors, each ``blocks.L.`` + one of these, in the order the block computes them.
BLOCK = ("hook_resid_pre", "ln1.hook_mean", "ln1.hook_scale", "ln1.hook_normalized", "ln1.out",
         "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z",
         "hook_attn_out", "hook_resid_mid", "ln2.hook_mean", "ln2.hook_scale", "ln2.hook_normalized", "ln2.out",
         "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out", "hook_resid_post")
FINAL = ("ln_final.hook_mean", "ln_final.hook_scale", "ln_final.hook_normalized", "ln_final.out", "logits",
         "log_probs", "targets", "loss")


def names(n_layers):
    """A forward golden's tensors, in file order."""
    return ["tokens", "hook_embed", "hook_pos_embed",
            *(f"blocks.{L}.{n}" for L in range(n_layers) for n in BLOCK), *FINAL]


DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "U8": "u1", "BOOL": "?"}


def read(path):
    """(tensors: name → array, metadata: name → str) of a golden file (bfloat16, "BF16", is widened to
    float32 exactly: its 16 bits are float32's upper half). Raises ValueError on a malformed file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: {len(data)} bytes, not a safetensors file")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise ValueError(f"{path}: the header says {n} bytes, the file has {len(data) - 8} after the length")
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", None) or {}
    body = data[8 + n:]
    tensors = {}
    for name, info in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        begin, end = info["data_offsets"]
        if info["dtype"] == "BF16":
            upper = np.frombuffer(body[begin:end], "<u2").astype(np.uint32) << 16
            tensors[name] = upper.view(np.float32).reshape(info["shape"])
        elif info["dtype"] in DTYPES:
            tensors[name] = np.frombuffer(body[begin:end], DTYPES[info["dtype"]]).reshape(info["shape"])
        else:
            raise ValueError(f"{path}: {name} has dtype {info['dtype']}, not one of {sorted(DTYPES)} or BF16")
    return tensors, metadata
