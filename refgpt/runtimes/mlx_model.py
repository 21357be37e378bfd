"""A GPT-2 in MLX (mlx-lm's own model and loader) run on a golden's tokens, its modules' tensors captured.

    refgpt compare golden.safetensors my-gpt2/ --runtime mlx

mlx-lm loads the HF directory itself (``mlx_lm.utils.load_model``; its GPT-2 reads the hub's
layout, keys without ``transformer.``). MLX has no hooks, so refgpt wraps modules of the loaded
model — each wrapper calls the module and keeps its input and output — and runs the model once:

    wte → hook_embed, wpe → hook_pos_embed (broadcast over the batch),
    h.L.ln_1: input blocks.L.hook_resid_pre, output blocks.L.ln1.out,
    h.L.attn: output blocks.L.hook_attn_out,
    h.L.ln_2: input blocks.L.hook_resid_mid, output blocks.L.ln2.out,
    h.L.mlp.c_fc: output blocks.L.mlp.hook_pre; h.L.mlp.c_proj: input blocks.L.mlp.hook_post,
    h.L.mlp: output blocks.L.hook_mlp_out; h.L: output blocks.L.hook_resid_post,
    ln_f: output ln_final.out; the model's output: logits.

**Unjudged**: attention's q, k, v, scores, pattern and z (mlx-lm calls one fused
scaled_dot_product_attention) and the LayerNorm statistics (``mx.fast.layer_norm`` exposes none).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import RefGPTError, as_path
from .extras import require

NOTES = ["MLX: attention runs as one fused kernel and LayerNorm exposes no statistics: q, k, v, scores, "
         "pattern, z, hook_mean, hook_scale and hook_normalized are not judged"]


def load(directory):
    """mlx-lm's model of the HF GPT-2 in ``directory``, by mlx-lm's loader."""
    require("mlx.core", "mlx", "running an MLX candidate")
    utils = require("mlx_lm.utils", "mlx", "running an MLX candidate")
    directory = as_path(directory, "MLX model directory")
    if not (Path(directory) / "config.json").is_file():
        raise RefGPTError(f"{directory}: not an HF model directory (no config.json) for mlx-lm to load")
    try:
        model, _ = utils.load_model(Path(directory))
    except (ValueError, KeyError, FileNotFoundError, TypeError) as error:  # TypeError: a config it cannot read
        raise RefGPTError(f"{directory}: mlx-lm cannot load it ({type(error).__name__}: "
                          f"{' '.join(str(error).split())[:300]})") from None
    return model


def capture(model, tokens, n_layers: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """Run mlx-lm's ``model`` (or the directory it loads from) on ``tokens`` [batch, pos]:
    (its modules' tensors under refgpt's names, notes)."""
    mx = require("mlx.core", "mlx", "running an MLX candidate")
    nn = require("mlx.nn", "mlx", "running an MLX candidate")
    if isinstance(model, (str, Path)):
        model = load(model)
    gpt2 = model.model
    if len(gpt2.h) != n_layers:
        raise RefGPTError(f"the MLX model has {len(gpt2.h)} blocks; the golden's has {n_layers}")
    seen: dict[str, np.ndarray] = {}

    class Kept(nn.Module):
        """Calls ``inner`` and keeps its input and output under the names given (None: not kept)."""

        def __init__(self, inner, input_name=None, output_name=None):
            super().__init__()
            self.inner, self.names = inner, (input_name, output_name)

        def __call__(self, x, *args, **kwargs):
            out = self.inner(x, *args, **kwargs)
            for name, value in zip(self.names, (x, out)):
                if name is not None:
                    seen[name] = np.array(value.astype(mx.float32))
            return out

        def as_linear(self, x):  # the tied unembedding: mlx-lm calls wte.as_linear for the logits
            return self.inner.as_linear(x)

    gpt2.wte = Kept(gpt2.wte, output_name="hook_embed")
    gpt2.wpe = Kept(gpt2.wpe, output_name="hook_pos_embed")
    for layer, block in enumerate(gpt2.h):
        b = f"blocks.{layer}"
        block.ln_1 = Kept(block.ln_1, f"{b}.hook_resid_pre", f"{b}.ln1.out")
        block.attn = Kept(block.attn, output_name=f"{b}.hook_attn_out")
        block.ln_2 = Kept(block.ln_2, f"{b}.hook_resid_mid", f"{b}.ln2.out")
        block.mlp.c_fc = Kept(block.mlp.c_fc, output_name=f"{b}.mlp.hook_pre")
        block.mlp.c_proj = Kept(block.mlp.c_proj, input_name=f"{b}.mlp.hook_post")
        block.mlp = Kept(block.mlp, output_name=f"{b}.hook_mlp_out")
        gpt2.h[layer] = Kept(block, output_name=f"{b}.hook_resid_post")
    gpt2.ln_f = Kept(gpt2.ln_f, output_name="ln_final.out")
    tokens = np.asarray(tokens, np.int64)  # [batch, pos]
    logits = model(mx.array(tokens.astype(np.int32)))
    captured = {"tokens": tokens, **seen, "logits": np.array(logits.astype(mx.float32))}  # [batch, pos, d_vocab]
    pos = captured["hook_pos_embed"]
    captured["hook_pos_embed"] = np.broadcast_to(pos.reshape(-1, *pos.shape[-2:]), (tokens.shape[0], *pos.shape[-2:]))
    return captured, list(NOTES)
