"""Random GPT-2s for tests that need no peer packages: NumPy weights, hypothesis configs, HF files.

Every parameter is drawn non-trivially: biases are not zero and LayerNorm gains are not one, since
zero biases and unit gains hide bugs (a missing bias, a swapped gain) that real checkpoints expose.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hypothesis import strategies as st
from safetensors.numpy import save_file

from refgpt import Config, Model
from refgpt.activations import ACTIVATIONS
from refgpt.model import param_shapes


def random_params(cfg: Config, seed: int, scale: float = 0.3) -> dict[str, np.ndarray]:
    """float64 parameters for ``cfg``: LayerNorm gains 1 + N(0, scale²), everything else N(0, scale²)."""
    rng = np.random.default_rng(seed)
    return {name: (1.0 if name.endswith(".w") else 0.0) + scale * rng.standard_normal(shape)
            for name, shape in param_shapes(cfg).items()}


def random_model(cfg: Config, seed: int = 0, dtype="float64", scale: float = 0.3) -> Model:
    return Model(cfg, random_params(cfg, seed, scale), dtype=dtype)


@st.composite
def configs(draw, max_layers=3, max_width=32, act_fns=None):
    """Small GPT-2 configs covering every knob that changes the forward pass."""
    n_heads = draw(st.integers(1, 4))
    d_head = draw(st.integers(1, max(1, max_width // n_heads)))
    return Config(
        d_model=n_heads * d_head,
        n_layers=draw(st.integers(1, max_layers)),
        n_heads=n_heads,
        d_mlp=draw(st.integers(1, 2 * max_width)),
        d_vocab=draw(st.integers(2, 40)),
        n_ctx=draw(st.integers(1, 12)),
        eps=draw(st.sampled_from([1e-5, 1e-3, 0.1])),
        act_fn=draw(st.sampled_from(sorted(act_fns or ACTIVATIONS))),
        use_attn_scale=draw(st.booleans()),
        scale_attn_by_inverse_layer_idx=draw(st.booleans()),
        tie_word_embeddings=draw(st.booleans()),
    )


@st.composite
def model_and_tokens(draw, batch=None, **config_kwargs):
    """(model, tokens [batch, pos]) for a drawn config, seed and weight scale."""
    cfg = draw(configs(**config_kwargs))
    model = random_model(cfg, seed=draw(st.integers(0, 2**32 - 1)), scale=draw(st.sampled_from([0.1, 0.5, 1.0])))
    n_batch = batch or draw(st.integers(1, 3))
    pos = draw(st.integers(1, cfg.n_ctx))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return model, rng.integers(0, cfg.d_vocab, size=(n_batch, pos))


def hf_tensors(model: Model, prefix: str = "transformer.") -> dict[str, np.ndarray]:
    """The model's weights under HF GPT-2 keys and layouts (inverse of refgpt.checkpoint.to_circuits)."""
    cfg, p = model.cfg, model.params
    d = cfg.d_model
    t = {"wte.weight": p["embed.W_E"], "wpe.weight": p["pos_embed.W_pos"],
         "ln_f.weight": p["ln_final.w"], "ln_f.bias": p["ln_final.b"]}
    for L in range(cfg.n_layers):
        b, h = f"blocks.{L}.", f"h.{L}."
        t[h + "attn.c_attn.weight"] = np.concatenate(
            [p[b + f"attn.W_{x}"].transpose(1, 0, 2).reshape(d, d) for x in "QKV"], axis=1)
        t[h + "attn.c_attn.bias"] = np.concatenate([p[b + f"attn.b_{x}"].reshape(d) for x in "QKV"])
        t[h + "attn.c_proj.weight"] = p[b + "attn.W_O"].reshape(d, d)
        t[h + "attn.c_proj.bias"] = p[b + "attn.b_O"]
        for n in (1, 2):
            t[h + f"ln_{n}.weight"], t[h + f"ln_{n}.bias"] = p[b + f"ln{n}.w"], p[b + f"ln{n}.b"]
        t[h + "mlp.c_fc.weight"], t[h + "mlp.c_fc.bias"] = p[b + "mlp.W_in"], p[b + "mlp.b_in"]
        t[h + "mlp.c_proj.weight"], t[h + "mlp.c_proj.bias"] = p[b + "mlp.W_out"], p[b + "mlp.b_out"]
    tensors = {prefix + k: np.ascontiguousarray(v) for k, v in t.items()}
    if not cfg.tie_word_embeddings:
        tensors["lm_head.weight"] = np.ascontiguousarray(p["unembed.W_U"].T)
    return tensors


def save_checkpoint(model: Model, directory: Path, dtype=np.float32, prefix="transformer.",
                    tensors: dict | None = None, config: dict | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` as HF's save_pretrained lays them out."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if tensors is None:
        tensors = {k: v.astype(dtype) for k, v in hf_tensors(model, prefix).items()}
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config if config is not None else model.cfg.to_hf()))
    return directory


def rel_err(actual, reference) -> float:
    """max |actual − reference| / max(1, max |reference|): the project's relative error."""
    actual, reference = np.asarray(actual, np.float64), np.asarray(reference, np.float64)
    return float(np.max(np.abs(actual - reference)) / max(1.0, float(np.max(np.abs(reference)))))
