"""Make ``weights/default/``: refgpt's embedded default model, a seeded, randomly initialised GPT-2.

THE MODEL IS UNTRAINED. Its weights are GPT-2's *initialisation*, drawn from a fixed seed: what
training would start from, not what it ends with. It exists so that every ``refgpt`` command and
every example works on a fresh machine with no download, and its predictions are noise. A trained
model will replace it; real GPT-2 weights work with ``--model DIR``.

    python weights/make_default.py             # rewrite weights/default/
    python weights/make_default.py OUT_DIR     # write the same files elsewhere

The files, all in Hugging Face's GPT-2 layout so ``GPT2LMHeadModel.from_pretrained`` reads them too:

    config.json         the GPT2Config (n_embd 64, 4 layers, 4 heads, n_positions 512, vocab 257)
    model.safetensors   the weights in float32 under ``transformer.`` keys (tied lm_head not stored)
    vocab.json          byte-level vocabulary: the 256 byte tokens, ids 0-255, then <|endoftext|> = 256
    merges.txt          no merges: every byte of UTF-8 text is one token
    UNTRAINED           a marker: ``refgpt`` prints a warning whenever it uses a model carrying it

The initialisation is HF's ``GPT2PreTrainedModel._init_weights``: every weight matrix and both
embeddings N(0, 0.02²), the two residual-output projections (``attn.c_proj`` and ``mlp.c_proj``)
N(0, 0.02²/(2·n_layer)) so the stream's variance does not grow with depth, every bias 0, every
LayerNorm gain 1 and bias 0. Tensors are drawn in HF key order from ``numpy.random.default_rng(0)``
in float64 and rounded once to float32. ``tests/test_default_model.py`` checks that this script
reproduces the shipped files byte for byte, and ``weights/README.md`` records their sha256.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from refgpt.config import Config
from refgpt.tokenizer import ENDOFTEXT, bytes_to_unicode

SEED = 0
INITIALIZER_RANGE = 0.02  # GPT2Config.initializer_range
CONFIG = Config(d_model=64, n_layers=4, n_heads=4, d_mlp=256, d_vocab=257, n_ctx=512)
UNTRAINED_NOTE = ("UNTRAINED: a seeded, randomly initialised GPT-2 (weights/make_default.py). "
                  "Its predictions are noise.\n")


def init_tensors(cfg: Config, seed: int) -> dict[str, np.ndarray]:
    """GPT-2's initialisation under HF keys, drawn in key order, as float32."""
    rng = np.random.default_rng(seed)
    d, m = cfg.d_model, cfg.d_mlp
    std, residual_std = INITIALIZER_RANGE, INITIALIZER_RANGE / math.sqrt(2 * cfg.n_layers)

    def normal(shape, sd):
        return (sd * rng.standard_normal(shape)).astype(np.float32)

    ones, zeros = (lambda n: np.ones(n, np.float32)), (lambda n: np.zeros(n, np.float32))
    t = {"wte.weight": normal((cfg.d_vocab, d), std),  # [d_vocab, d_model], tied to the unembedding
         "wpe.weight": normal((cfg.n_ctx, d), std)}  # [n_ctx, d_model]
    for L in range(cfg.n_layers):
        h = f"h.{L}."
        t[h + "ln_1.weight"], t[h + "ln_1.bias"] = ones(d), zeros(d)  # [d_model]
        t[h + "attn.c_attn.weight"] = normal((d, 3 * d), std)  # [d_model, 3·d_model] = Q | K | V
        t[h + "attn.c_attn.bias"] = zeros(3 * d)  # [3·d_model]
        t[h + "attn.c_proj.weight"] = normal((d, d), residual_std)  # [d_model, d_model]
        t[h + "attn.c_proj.bias"] = zeros(d)  # [d_model]
        t[h + "ln_2.weight"], t[h + "ln_2.bias"] = ones(d), zeros(d)  # [d_model]
        t[h + "mlp.c_fc.weight"] = normal((d, m), std)  # [d_model, d_mlp]
        t[h + "mlp.c_fc.bias"] = zeros(m)  # [d_mlp]
        t[h + "mlp.c_proj.weight"] = normal((m, d), residual_std)  # [d_mlp, d_model]
        t[h + "mlp.c_proj.bias"] = zeros(d)  # [d_model]
    t["ln_f.weight"], t["ln_f.bias"] = ones(d), zeros(d)  # [d_model]
    return {"transformer." + key: value for key, value in t.items()}


def hf_config(cfg: Config) -> dict:
    """config.json: refgpt's Config in HF's words, plus the fields HF needs for a 257-token vocab."""
    eot = cfg.d_vocab - 1
    return {**cfg.to_hf(), "initializer_range": INITIALIZER_RANGE,
            "bos_token_id": eot, "eos_token_id": eot}


def byte_vocab() -> dict[str, int]:
    """vocab.json: each byte's printable character (as GPT-2 writes it) → the byte, then <|endoftext|>."""
    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    vocab[ENDOFTEXT] = len(vocab)
    return vocab


def write(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_file(init_tensors(CONFIG, SEED), str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(hf_config(CONFIG), indent=2) + "\n", encoding="utf-8")
    (directory / "vocab.json").write_text(json.dumps(byte_vocab(), ensure_ascii=False) + "\n", encoding="utf-8")
    (directory / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    (directory / "UNTRAINED").write_text(UNTRAINED_NOTE, encoding="utf-8")


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "default")
