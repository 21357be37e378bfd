"""Write a Model as a Hugging Face GPT-2 checkpoint directory: the inverse of ``refgpt.load``.

    refgpt.save(model, "out/")    # config.json, model.safetensors (+ vocab.json, merges.txt), refgpt-manifest.json

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

**One unit.** The directory changes as a whole: the new files are written into a fresh directory
beside it, which then takes its place in one atomic exchange (refgpt/files/atomic_write.py), so a
kill at any moment leaves the old checkpoint or the new one, never new weights with an old
config. Files of the old directory that ``save`` does not write (a README, a training log) are
carried over; the old model's own files (and an old shard index with its shards) are not. The
manifest written last, ``refgpt-manifest.json``, lets ``refgpt.load`` refuse a directory mixed by
other hands (refgpt/files/manifest.py). Every failure — a full or read-only disk included — is a
``RefGPTError`` naming the directory and the first cause, and leaves the old directory as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np

from .checkpoint import hf_tensors
from ..dtypes import compute_dtype
from .atomic_write import write_directory_atomically
from ..errors import RefGPTError, as_path
from ..gpt2.tokenizer import Tokenizer
from .manifest import MANIFEST, WEIGHTS, file_entry, manifest_text
from .safetensors_file import SafetensorsWriter

#: The files a save writes, in the order it writes them (the manifest last).
SAVED = (WEIGHTS, "vocab.json", "merges.txt", "config.json", MANIFEST)
TOKENIZER_FILES = ("vocab.json", "merges.txt")
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


def save(model, directory, dtype=None, config: dict | None = None, type: str | None = None) -> Path:
    """Write ``model`` as an HF GPT-2 checkpoint in ``directory`` (created if needed); returns it.

    A path ending in ``.gguf`` is written instead as llama.cpp's GPT-2 GGUF file, its weight
    matrices of ``type`` ('F32' by default; 'F16', 'BF16', 'Q8_0', 'Q4_0', 'Q4_1', 'Q5_0', 'Q5_1'),
    as llama.cpp's converter writes them (refgpt/files/gguf_file.py); ``dtype`` and ``config`` do
    not apply there.

    ``dtype``: how the weights are stored, 'float64' or 'float32' (default: the model's dtype, so
    the round trip is exact). ``config``: extra config.json fields (e.g. ``initializer_range``;
    not one of the model's own, such as ``n_embd``, with another value);
    ``bos_token_id``/``eos_token_id`` default to the tokenizer's <|endoftext|> when it has one.
    """
    directory = as_path(directory, "save: directory")
    if directory.suffix.lower() == ".gguf":
        if dtype is not None or config:
            raise RefGPTError("save: a GGUF file takes type= (F32, F16, Q8_0, Q4_0, …), not dtype= or config=")
        from .gguf_file import untied, write_model

        hf = hf_tensors(untied(model.cfg), model.params, prefix="")
        return write_model(model, directory, hf, "F32" if type is None else type)
    if type is not None:
        raise RefGPTError(f"save: type={type!r} is for GGUF files (a path ending in .gguf); "
                          f"{str(directory)!r} is an HF checkpoint directory (use dtype=)")
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
    tensors = hf_tensors(cfg, p)
    texts = tokenizer_texts(model.tokenizer) if model.tokenizer is not None else {}
    if model.tokenizer is not None and model.tokenizer.eot_token is not None:
        hf.setdefault("bos_token_id", model.tokenizer.eot_token)
        hf.setdefault("eos_token_id", model.tokenizer.eot_token)
    texts["config.json"] = json.dumps(hf, indent=2) + "\n"

    def fill(staging: Path):
        save_id = _write_weights(staging / WEIGHTS, tensors, storage, texts)
        for name in SAVED[1:-1]:
            if name in texts:
                _write_new(staging / name, texts[name].encode("utf-8"))
        files = {name: file_entry(staging / name) for name in SAVED[:-1] if (staging / name).is_file()}
        _write_new(staging / MANIFEST, manifest_text(save_id, files).encode("utf-8"))

    return write_directory_atomically(directory, fill, owned=_owned_by_a_save(directory))


def save_tokenizer(tokenizer: Tokenizer, directory) -> Path:
    """Write ``vocab.json`` (token → id, in id order) and ``merges.txt`` (ranked pairs) as HF lays
    them out, the two as one unit (a kill never pairs one tokenizer's vocabulary with another's merges)."""
    texts = tokenizer_texts(tokenizer)

    def fill(staging: Path):
        for name, text in texts.items():
            _write_new(staging / name, text.encode("utf-8"))

    return write_directory_atomically(as_path(directory, "save_tokenizer: directory"), fill,
                                      owned=lambda name: name in TOKENIZER_FILES, what="save_tokenizer")


def tokenizer_texts(tokenizer: Tokenizer) -> dict[str, str]:
    """The texts of ``vocab.json`` and ``merges.txt`` for ``tokenizer``."""
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in tokenizer.merges]
    return {"vocab.json": json.dumps(tokenizer.encoder, ensure_ascii=False) + "\n",
            "merges.txt": "\n".join(lines) + "\n"}


def _write_weights(path: Path, tensors: dict, storage, texts: dict[str, str]) -> str:
    """model.safetensors, tensor by tensor, in name order (as the reference writer orders them);
    returns the save's id, which its metadata carries (``refgpt_save``): 32 hex digits of the
    sha256 of everything the save writes, so saving one model twice gives the same bytes. An
    OSError propagates, for the directory writer to report."""
    order = sorted(tensors)
    layout = {name: (storage, np.shape(tensors[name])) for name in order}
    digest = hashlib.sha256()
    for name in sorted(texts):
        digest.update(b"%d:%s%d:" % (len(name), name.encode(), len(texts[name].encode())) + texts[name].encode())
    try:
        with SafetensorsWriter(path, layout, {"format": "pt", "refgpt_save": "0" * 32}) as out:
            for name in order:
                data = np.ascontiguousarray(tensors[name], dtype=np.dtype(storage).newbyteorder("<"))
                digest.update(f"{name}:{data.dtype.str}:{list(data.shape)}:".encode())
                digest.update(memoryview(data.reshape(-1)).cast("B"))
                out.write(name, data.astype(storage, copy=False))
            save_id = digest.hexdigest()[:32]
            out.metadata = {"format": "pt", "refgpt_save": save_id}
    except RefGPTError as error:
        if isinstance(error.__cause__, OSError):
            raise error.__cause__ from None
        raise
    return save_id


def _write_new(path: Path, data: bytes) -> None:
    """A new file in the (private) staging directory, complete or absent: written as NAME.partial
    and renamed (so that even the staging directory of a killed save never holds a file cut short
    that parses, such as an empty merges.txt)."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "xb") as f:
        f.write(data)
    os.rename(partial, path)


def _owned_by_a_save(directory: Path):
    """Which entries of the old directory a save replaces (the rest is carried over): its own
    files, and an old shard index with its shards, which would contradict the new weights."""
    shards = set()
    try:
        index = json.loads((Path(directory) / "model.safetensors.index.json").read_text(encoding="utf-8"))
        shards = {s for s in index["weight_map"].values() if isinstance(s, str)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass

    def owned(name: str) -> bool:
        return name in SAVED or name == "model.safetensors.index.json" or name in shards or bool(_SHARD.fullmatch(name))

    return owned
