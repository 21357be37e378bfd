"""``refgpt golden``: write every activation of one forward pass to a golden file.

    refgpt golden "The quick brown fox" -o golden.safetensors --model DIR
    refgpt golden --tokens ids.txt -o golden.safetensors --names 'blocks.*.hook_resid_post'

TEXT is tokenized with the model's tokenizer; ``--tokens FILE`` reads ids instead: a ``.npy``
integer array [pos] or [batch, pos], or text with whitespace-separated ids, one sequence per line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ..errors import RefGPTError
from ..oracle import golden
from ._chosen_model import load_chosen, print_json, tokens_of, untrained_note


def add_parser(subparsers, common):
    p = subparsers.add_parser("golden", parents=[common], help="write a golden file (every activation) for a port to check against",
                              description="Run the model once and write the tokens, every cached activation, each "
                              "LayerNorm's output, the logits, log-probabilities and per-position loss to one "
                              "safetensors file, with metadata (version, config, weight hashes, dtype, numpy/BLAS).")
    p.add_argument("text", nargs="?", metavar="TEXT", help="the input text (needs the model's tokenizer)")
    p.add_argument("--bos", action="store_true", help="put <|endoftext|> before TEXT")
    p.add_argument("--tokens", metavar="FILE", help="token ids: .npy, or whitespace-separated integers, one sequence per line")
    p.add_argument("-o", "--output", metavar="FILE", required=True, help="the golden file to write (.safetensors)")
    p.add_argument("--names", metavar="PATTERN", action="append",
                   help="keep only tensors matching this glob (repeatable), e.g. 'blocks.*.hook_resid_post'; "
                        "tokens, logits, log_probs and loss are always kept")
    p.set_defaults(run=run, usage_error=p.error)
    return p


def run(args) -> int:
    if (args.text is None) == (args.tokens is None):
        args.usage_error("give either TEXT or --tokens FILE")
    model = load_chosen(args)
    tokens = read_tokens(args.tokens) if args.tokens else tokens_of(model, args)
    names = golden.select(model, args.names) if args.names else None
    tokens, _ = model.check_tokens(tokens)  # [batch, pos]
    # Streamed: each tensor goes to the file as the forward pass makes it (GPT-2 XL's golden at
    # full context is larger than the machine's memory).
    path = golden.write_streamed(args.output, model, tokens, names, command=["refgpt", *sys.argv[1:]])
    size = path.stat().st_size
    count, shape, dtype = len(golden.layout(model, tokens.shape, names)), list(tokens.shape), model.dtype.name
    if args.json:
        return print_json(model, {"path": str(path), "tensors": count, "bytes": size, "tokens_shape": shape,
                                  "dtype": dtype})
    if note := untrained_note(model):
        print(note)
    print(f"wrote {path}: {count} tensors, {size / 2**20:.1f} MiB, tokens {shape}, {dtype}")
    return 0


def read_tokens(path) -> np.ndarray:
    """Token ids from a .npy file or from text (whitespace-separated, one sequence per line)."""
    path = Path(path)
    if not path.is_file():
        raise RefGPTError(f"{path}: token file not found")
    if path.suffix == ".npy":
        try:
            tokens = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as error:
            raise RefGPTError(f"{path}: not a readable .npy file ({error})") from None
        if tokens.dtype.kind not in "iu":
            raise RefGPTError(f"{path}: token ids must be integers, found {tokens.dtype}")
        return tokens
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append([int(word) for word in line.split()])
        except ValueError:
            bad = next(w for w in line.split() if not w.lstrip("-").isdigit())
            raise RefGPTError(f"{path}, line {n}: {bad!r} is not an integer token id") from None
    if not rows:
        raise RefGPTError(f"{path}: no token ids")
    if len({len(r) for r in rows}) != 1:
        raise RefGPTError(f"{path}: sequences have different lengths {sorted({len(r) for r in rows})}; "
                          "a batch needs one length")
    return np.array(rows if len(rows) > 1 else rows[0], dtype=np.int64)
