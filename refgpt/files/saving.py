"""Write a Model as a Hugging Face GPT-2 checkpoint directory: the inverse of ``refgpt.load``.

    refgpt.save(model, "out/")    # config.json, model.safetensors (+ vocab.json, merges.txt)

``config.json`` is the GPT2Config of the model's real values (``Config.to_hf``: sizes, eps, the
activation function, the attention-scale flags, tied embeddings; the context length as both
``n_positions``, which HF reads, and ``n_ctx``, which TransformerLens 3.9 reads, as GPT-2's own
config.json has it), ``model.safetensors`` holds the
weights under GPT2LMHeadModel's keys (``transformer.h.0.attn.c_attn.weight``, Conv1D's [in, out]
orientation; ``checkpoint.hf_tensors``), and a model with a tokenizer gets ``vocab.json`` and
``merges.txt``. So ``refgpt.load`` gives the same model back bit for bit, and
``transformers.GPT2LMHeadModel.from_pretrained`` the same logits (tests/core/test_saving.py).

Tied embeddings are stored once, as HF stores them (``transformer.wte.weight``, no lm_head), which
is only honest when the model's W_U *is* W_Eᵀ; otherwise ``save`` refuses. GPT-2 has no
unembedding bias, so neither can a saved model (a processed model's b_U is refused too).

Every file is written to a temporary name beside it and renamed into place (atomic on POSIX), and
config.json comes last, so a reader never sees a half-written file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from .checkpoint import hf_tensors
from ..dtypes import compute_dtype
from .atomic_write import write_atomically
from ..errors import RefGPTError, as_path
from ..gpt2.tokenizer import Tokenizer


def save(model, directory, dtype=None, config: dict | None = None) -> Path:
    """Write ``model`` as an HF GPT-2 checkpoint in ``directory`` (created if needed); returns it.

    ``dtype``: how the weights are stored, 'float64' or 'float32' (default: the model's dtype, so
    the round trip is exact). ``config``: extra config.json fields (e.g. ``initializer_range``;
    not one of the model's own, such as ``n_embd``, with another value);
    ``bos_token_id``/``eos_token_id`` default to the tokenizer's <|endoftext|> when it has one.
    """
    directory = as_path(directory, "save: directory")
    cfg, p = model.cfg, model.params
    storage = compute_dtype(model.dtype if dtype is None else dtype)
    if cfg.tie_word_embeddings and not np.array_equal(p["unembed.W_U"], p["embed.W_E"].T):
        raise RefGPTError("save: tie_word_embeddings is true but W_U is not W_Eᵀ; HF would store W_E only "
                          "and lose W_U (make a Model with tie_word_embeddings=False to keep both)")
    if "unembed.b_U" in p and np.any(p["unembed.b_U"]):
        raise RefGPTError("save: the model has an unembedding bias b_U, which an HF GPT-2 checkpoint cannot hold")
    hf = cfg.to_hf()
    if clash := sorted(key for key, value in (config or {}).items() if key in hf and value != hf[key]):
        raise RefGPTError(f"save: config would set {', '.join(clash)}, which the model itself fixes "
                          f"({', '.join(f'{key}={hf[key]!r}' for key in clash)})")
    hf.update(config or {})
    directory = _make_directory(directory)
    tensors = {k: np.ascontiguousarray(v, dtype=storage) for k, v in hf_tensors(cfg, p).items()}
    write_atomically(directory / "model.safetensors",
                lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    if model.tokenizer is not None:
        save_tokenizer(model.tokenizer, directory)
        if model.tokenizer.eot_token is not None:
            hf.setdefault("bos_token_id", model.tokenizer.eot_token)
            hf.setdefault("eos_token_id", model.tokenizer.eot_token)
    _write_text(directory / "config.json", json.dumps(hf, indent=2) + "\n")
    return directory


def save_tokenizer(tokenizer: Tokenizer, directory) -> Path:
    """Write ``vocab.json`` (token → id, in id order) and ``merges.txt`` (ranked pairs) as HF lays them out."""
    directory = _make_directory(directory)
    _write_text(directory / "vocab.json", json.dumps(tokenizer.encoder, ensure_ascii=False) + "\n")
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in tokenizer.merges]
    _write_text(directory / "merges.txt", "\n".join(lines) + "\n")
    return directory


def _make_directory(directory) -> Path:
    """``directory``, created with its parents if absent; a RefGPTError if a file (or a link to
    nowhere) is in the way."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise RefGPTError(f"save: {directory} exists and is not a directory") from None
    except OSError as error:
        raise RefGPTError(f"save: cannot make the directory {directory}: {error.strerror}") from None
    return directory


def _write_text(path: Path, text: str):
    write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
