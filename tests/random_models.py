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

import refgpt
from refgpt import Config, Model
from refgpt.files import checkpoint
from refgpt.gpt2.activations import ACTIVATIONS
from refgpt.gpt2.params import param_shapes


#: GPT-2 small's shape (124M parameters), for tests of peers and runtimes at the real width and depth.
GPT2_SMALL = Config(d_model=768, n_layers=12, n_heads=12, d_mlp=3072, d_vocab=50257, n_ctx=1024)


def random_params(cfg: Config, seed: int, scale: float = 0.3) -> dict[str, np.ndarray]:
    """float64 parameters for ``cfg``: LayerNorm gains 1 + N(0, scale²), everything else N(0, scale²)."""
    rng = np.random.default_rng(seed)
    return {name: (1.0 if name.endswith(".w") else 0.0) + scale * rng.standard_normal(shape)
            for name, shape in param_shapes(cfg).items()}


def decode_case(cfg: Config, params, rng, steps: int = 5, longest: int = 8):
    """A batch of two random prompts of P = 2 … ``longest`` − 1 tokens, row 1 left-padded by 0 … P − 2
    (drawn from ``rng``), and the float64 greedy decode of ``steps`` steps from it → (prompt [2, P],
    mask [2, P], ref, chosen [2, steps]): ref the decode golden's tensors (the tokens, each step's, the
    attention mask), for local verdicts of a port's decode forced along ``chosen``."""
    from refgpt.oracle import decode
    P = int(rng.integers(2, longest))
    prompt = rng.integers(0, cfg.d_vocab, (2, P))  # [batch, P]
    mask = np.ones((2, P), np.int64)  # [batch, P]
    mask[1, : int(rng.integers(0, P - 1))] = 0  # row 1 left-padded (maybe by nothing)
    tensors, chosen = decode.run(Model(cfg, params), prompt, steps, attention_mask=mask)
    ref = {"tokens": np.concatenate([prompt, chosen], 1), **tensors,
           "attention_mask": np.concatenate([mask, np.ones((2, steps), np.int64)], 1)}
    return prompt, mask, ref, chosen


def random_model(cfg: Config, seed: int = 0, dtype="float64", scale: float = 0.3) -> Model:
    return Model(cfg, random_params(cfg, seed, scale), dtype=dtype)


def tied_model(cfg: Config, seed: int = 0, tokenizer: bool = False) -> Model:
    """A random GPT-2 whose W_U is W_Eᵀ, as its tie_word_embeddings says (random_model draws the two
    apart), for the formats that store one matrix (GGUF, CTranslate2). With ``tokenizer``, a
    byte-level BPE of cfg.d_vocab ≥ 259 tokens: the 256 bytes, 'Ġt', 'Ġth' (two merges), fillers
    ``w0``, ``w1``, … and <|endoftext|> last."""
    params = random_params(cfg, seed)
    params["unembed.W_U"] = params["embed.W_E"].T.copy()  # [d_model, d_vocab]
    model = Model(cfg, params)
    if tokenizer:
        model.tokenizer = byte_tokenizer(cfg.d_vocab)
    return model


def byte_tokenizer(d_vocab: int) -> refgpt.Tokenizer:
    """A byte-level BPE of ``d_vocab`` ≥ 259 tokens: the 256 bytes, 'Ġt', 'Ġth' (two merges), fillers
    ``w0``, ``w1``, … and <|endoftext|> last (converters that need a vocabulary, as CTranslate2's)."""
    from refgpt.gpt2.tokenizer import bytes_to_unicode

    tokens = list(bytes_to_unicode().values()) + ["Ġt", "Ġth"]
    tokens += [f"w{i}" for i in range(d_vocab - len(tokens) - 1)] + ["<|endoftext|>"]
    return refgpt.Tokenizer({t: i for i, t in enumerate(tokens)}, [("Ġ", "t"), ("Ġt", "h")])


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
    """The model's weights under HF GPT-2 keys and layouts (refgpt.files.checkpoint.hf_tensors, contiguous)."""
    return {k: np.ascontiguousarray(v) for k, v in checkpoint.hf_tensors(model.cfg, model.params, prefix).items()}


def save_checkpoint(model: Model, directory: Path, dtype=np.float32, tensors: dict | None = None,
                    config: dict | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` with ``refgpt.save`` (weights stored in ``dtype``).

    A tied config's W_U is saved as W_Eᵀ, as HF stores it (a random model draws W_U on its own).
    ``tensors`` / ``config``: write these instead, as they are (for tests of broken checkpoints).
    """
    directory = Path(directory)
    if tensors is None and config is None:
        if model.cfg.tie_word_embeddings:
            tokenizer = model.tokenizer
            model = Model(model.cfg, {**model.params, "unembed.W_U": model.params["embed.W_E"].T}, dtype=model.dtype)
            model.tokenizer = tokenizer
        return refgpt.save(model, directory, dtype=dtype)
    directory.mkdir(parents=True, exist_ok=True)
    if tensors is None:
        tensors = {k: v.astype(dtype) for k, v in hf_tensors(model).items()}
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config if config is not None else model.cfg.to_hf()))
    return directory


def random_tokens(cfg: Config, pos: int, batch: int = 2, seed: int = 0) -> np.ndarray:
    """Token ids [batch, pos] drawn uniformly from the vocabulary."""
    return np.random.default_rng(seed).integers(0, cfg.d_vocab, (batch, pos))


def rel_err(actual, reference) -> float:
    """max |actual − reference| / max(1, max |reference|): the project's relative error."""
    actual, reference = np.asarray(actual, np.float64), np.asarray(reference, np.float64)
    return float(np.max(np.abs(actual - reference)) / max(1.0, float(np.max(np.abs(reference)))))


def saved(tmp_path_factory, cfg, name, scale, pos):
    """(the golden file, the directory refgpt.save wrote) of a random model with ``cfg`` on 2 × ``pos``
    tokens; the golden is the saved (float32-stored, tied) model's."""
    from refgpt.oracle import golden

    where = tmp_path_factory.mktemp(name)
    model = random_model(cfg, seed=1, scale=scale)
    model.tokenizer = byte_tokenizer(cfg.d_vocab) if cfg.d_vocab >= 259 else None  # for CTranslate2's converter
    model = refgpt.load(save_checkpoint(model, where / "model"))
    tokens = random_tokens(cfg, pos, batch=2, seed=2)
    return golden.write(where / "golden.safetensors", golden.make(model, tokens)), where / "model"
