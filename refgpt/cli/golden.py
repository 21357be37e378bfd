"""``refgpt golden``: write every activation of one forward pass (and with --backward every
gradient) to a golden file; with --generate, of a decoding loop, step by step.

    refgpt golden "The quick brown fox" -o golden.safetensors --model DIR
    refgpt golden --tokens ids.txt -o golden.safetensors --names 'blocks.*.hook_resid_post'
    refgpt golden --model gpt2_124M.bin --tokens gpt2_124M_debug_state.bin --backward -o golden.safetensors
    refgpt golden "The cat" "A dog barked at" --padding-side left -o padded.safetensors
    refgpt golden "The quick brown fox" --generate 32 -o decode.safetensors

``--model`` is an HF directory, a GGUF file or an llm.c checkpoint (``.bin``, refgpt/oracle/llmc.py). This module
parses and prints; reading token files and tokenizers is refgpt/oracle/token_files.py, padding a
batch refgpt/gpt2/padding.py (``pad_rows``). TEXT is
tokenized with the model's tokenizer (``--tokenizer DIR`` with vocab.json and merges.txt gives
one to an llm.c checkpoint; llm.c's ``gpt2_tokenizer.bin`` only decodes, so it names the tokens
in the output but cannot encode TEXT). ``--tokens FILE`` reads ids instead: a ``.npy`` integer
array [pos] or [batch, pos]; text with whitespace-separated ids, one sequence per line; an llm.c
debug state or refgpt llm.c dump (x and its targets y); an llm.c data shard (the first
``--tokens-shape B,T`` batch, as llm.c's dataloader reads it); or raw ids with ``--tokens-dtype``.

Several TEXTs, or a text ids file whose lines differ in length, make a padded batch: padded with
``<|endoftext|>`` on ``--padding-side`` (right, or left; decoding always pads left), written with
its ``attention_mask`` and ``position_ids`` (refgpt/oracle/golden.py, ``padding_metadata``).
``--generate N`` writes a decode golden (refgpt/oracle/decode.py): the prompt pass and N − 1
KV-cached steps, N chosen tokens — greedy after TEXT; with ``--tokens`` the last N tokens of each
row are the continuation, forced (``--greedy`` continues the whole file greedily instead).
Progress goes to stderr when it is a terminal (``--progress``, ``--quiet``).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from ..errors import RefGPTError, size_shown
from ..gpt2.padding import pad_rows
from ..oracle import golden, token_files
from ..oracle.token_files import pad_token_id
from . import _progress
from ._arguments import positive_int
from ._chosen_model import add_subcommand, load_chosen, print_json, tokens_of, untrained_note
from ._output import shown


USES = ("--model", "--dtype", "--json", "--bos")

EXAMPLES = (
    'refgpt golden "To be, or not to" --bos -o golden.safetensors --backward --certify',
    'refgpt golden --model gpt2_124M.bin --tokens gpt2_124M_debug_state.bin --backward -o golden.safetensors     # llm.c\'s',
    'refgpt golden "To be, or not to" "The king" --padding-side left -o padded.safetensors',
    'refgpt golden "To be, or not to" --generate 8 -o decode.safetensors',
)


def add_parser(subparsers):
    p = add_subcommand(subparsers, "golden", run, uses=USES, optional_text="many", examples=EXAMPLES,
                       help="write a golden file (every activation) for a port to check against",
                       description="Run the model once and write the tokens, every cached activation, each "
                       "LayerNorm's output, the logits, log-probabilities and per-position loss to one "
                       "safetensors file, with metadata (version, config, weight hashes, dtype, numpy/BLAS). "
                       "TEXT needs the model's tokenizer (several TEXTs make a padded batch); --tokens FILE gives "
                       "the ids instead. --generate N writes a decode golden: the prompt pass and each KV-cached "
                       "step.")
    p.add_argument("--padding-side", choices=("left", "right"),
                   help="pad a batch of rows of different lengths on this side (default right; --generate: left)")
    p.add_argument("--generate", type=positive_int, metavar="N",
                   help="a decode golden: the prompt pass and each KV-cached step of N generated tokens (greedy; "
                        "with --tokens, the last N tokens of each row, forced)")
    p.add_argument("--greedy", action="store_true",
                   help="with --tokens and --generate: continue the file's tokens greedily instead of forcing its last N")
    p.add_argument("--tokens", metavar="FILE", help="token ids: .npy, or whitespace-separated integers, one sequence per line")
    p.add_argument("-o", "--output", metavar="FILE", required=True, help="the golden file to write (.safetensors)")
    p.add_argument("--names", metavar="PATTERN", action="append",
                   help="keep only tensors matching this glob (repeatable), e.g. 'blocks.*.hook_resid_post'; "
                        "tokens, logits, log_probs and loss are always kept")
    p.add_argument("--tokens-dtype", choices=sorted(token_files.RAW_TOKEN_DTYPES),
                   help="--tokens FILE holds raw little-endian ids of this type (no header)")
    p.add_argument("--tokens-shape", metavar="B,T",
                   help="batch and length for raw ids and llm.c data shards (default: one sequence of all the "
                        "raw ids; for a shard 1,min(n_ctx, 64))")
    p.add_argument("--tokenizer", metavar="PATH", help="llm.c's gpt2_tokenizer.bin (decodes only) or a directory "
                   "with vocab.json and merges.txt")
    p.add_argument("--backward", action="store_true",
                   help="also write the mean loss and ∂loss/∂ every parameter, activation and the logits")
    p.add_argument("--certify", action="store_true",
                   help="recompute everything in extended precision and store each tensor's measured error")
    p.add_argument("--debug-state", metavar="FILE",
                   help="also write llm.c's gpt2_124M_debug_state.bin for the same tokens (x, y, logits, loss, grads)")
    p.add_argument("--format", choices=("safetensors", "polygraphy"), default="safetensors",
                   help="polygraphy: a Polygraphy RunResults JSON keyed by --onnx FILE's tensor names, for "
                        "`polygraphy run … --load-outputs` (forward only, unpadded)")
    p.add_argument("--onnx", metavar="FILE", help="with --format polygraphy: the ONNX GPT-2 whose tensor names to use")
    _progress.add_arguments(p)
    return p


def run(args) -> int:
    if bool(args.text) == (args.tokens is not None):
        args.usage_error("give either TEXT or --tokens FILE")
    if args.tokens is not None and args.bos:
        args.usage_error("--bos goes with TEXT: --tokens FILE gives the ids as they are (put the <|endoftext|> id in FILE)")
    for option, value in (("--tokens-dtype", args.tokens_dtype), ("--tokens-shape", args.tokens_shape)):
        if value is not None and args.tokens is None:
            args.usage_error(f"{option} describes --tokens FILE, and there is none")
    if args.greedy and not (args.generate and args.tokens):
        args.usage_error("--greedy goes with --tokens FILE --generate N")
    if args.generate and (args.backward or args.certify or args.names or args.debug_state):
        args.usage_error("--generate writes a decode golden: without --backward, --certify, --names or --debug-state")
    if args.generate and args.padding_side == "right":
        args.usage_error("--generate pads a batch on the left (a decoding step follows each row's last real token)")
    if (args.format == "polygraphy") != (args.onnx is not None):
        args.usage_error("--format polygraphy and --onnx FILE go together")
    if args.format == "polygraphy" and (args.generate or args.backward or args.certify or args.debug_state
                                        or args.padding_side or args.names):
        args.usage_error("--format polygraphy writes one unpadded forward pass: without --generate, --backward, "
                         "--certify, --debug-state, --padding-side or --names")
    model, llmc_tokenizer = load_model(args)
    targets, source = None, "TEXT"
    if args.tokens:
        tokens, targets, source = token_files.read_tokens(args.tokens, args.tokens_dtype, _shape(args), model.cfg,
                                              ragged=args.padding_side is not None or args.generate is not None)
    else:
        tokens = [tokens_of(model, argparse.Namespace(**{**vars(args), "text": t})) for t in args.text]
        tokens = tokens[0] if len(tokens) == 1 else tokens
    if args.padding_side is not None and (len(tokens) if isinstance(tokens, list) else np.atleast_2d(tokens).shape[0]) == 1:
        args.usage_error("--padding-side pads a batch of several rows of different lengths; one row has nothing to pad")
    progress = _progress.Progress.of(args, "golden")
    try:
        if args.generate:
            return _decode(args, model, tokens, source, progress)
        return _forward(args, model, llmc_tokenizer, tokens, targets, source, progress)
    finally:
        progress.close()


def _polygraphy(args, model, tokens, source) -> int:
    """The golden keyed by the ONNX graph's tensor names, as Polygraphy's RunResults JSON."""
    from ..runtimes import onnx_model, polygraphy_json

    if isinstance(tokens, list) and len({len(np.atleast_1d(row)) for row in tokens}) > 1:
        raise RefGPTError("--format polygraphy writes one unpadded batch: give rows of one length")
    tokens = np.asarray(tokens)
    if tokens.dtype == object or tokens.ndim not in (1, 2):
        raise RefGPTError("--format polygraphy writes one unpadded batch: give rows of one length")
    tokens = np.atleast_2d(tokens)
    graph = onnx_model.load(args.onnx).graph
    names, _ = onnx_model.tensor_names(graph, model.cfg.n_layers)
    g = golden.make(model, tokens, command=["refgpt", *sys.argv[1:]])
    arrays = onnx_model.in_graph_names(g.tensors, names, graph)
    path = polygraphy_json.write(args.output, arrays)
    if args.json:
        return print_json(model, {"path": str(path), "tensors": len(arrays), "tokens_shape": list(tokens.shape),
                                  "dtype": g.metadata["dtype"], "tokens_source": source, "format": "polygraphy"})
    print(f"wrote {path}: {len(arrays)} tensors under {args.onnx}'s names (Polygraphy RunResults), tokens "
          f"{list(tokens.shape)}, {g.metadata['dtype']}\ntokens: {source}")
    return 0


def _forward(args, model, llmc_tokenizer, tokens, targets, source, progress) -> int:
    if args.format == "polygraphy":
        return _polygraphy(args, model, tokens, source)
    tokens, mask = pad_rows(tokens, args.padding_side or "right", pad_token_id(model))
    if mask is not None and (args.backward or args.certify or targets is not None):
        raise RefGPTError("a padded batch's golden is forward only: no --backward or --certify, no llm.c targets; "
                          "give rows of one length for those")
    names = golden.select(model, args.names) if args.names else None
    command = ["refgpt", *sys.argv[1:]]
    if args.backward or args.certify or mask is not None:  # gradients, certificates and padding: made whole, then written
        g = golden.make(model, tokens, names, command=command, targets=targets, backward=args.backward,
                        attention_mask=mask, padding_side=args.padding_side or "right", pad_token_id=pad_token_id(model),
                        progress=progress)
        if args.certify:
            from ..oracle import certify

            progress.stage("golden --certify")
            certify.add_certificate(g, model, tokens, targets, progress)
        path = golden.write(args.output, g)
    else:  # streamed: each tensor goes to the file as the forward pass makes it (GPT-2 XL's golden
        # at full context is larger than the machine's memory); read back mapped, for the summary
        path = golden.write_streamed(args.output, model, tokens, names, command=command, targets=targets,
                                     progress=progress)
        g = golden.read(path)
    progress.close()
    size = path.stat().st_size
    shape = list(np.asarray(g.tensors["tokens"]).shape)
    lines = [f"wrote {path}: {len(g.tensors)} tensors, {size_shown(size)}, tokens {shape}, {g.metadata['dtype']}",
             f"tokens: {source}"]
    if mask is not None:
        lines.append(f"padded on the {args.padding_side or 'right'} with id {pad_token_id(model)}: real tokens per row "
                     f"{[int(n) for n in mask.sum(1)]}; attention_mask and position_ids written (pads at position 0)")
    if args.backward:
        lines.append(f"backward: mean loss {float(g.tensors['loss_mean']):.9g} over "
                     f"{np.asarray(g.tensors['loss']).size} targets; "
                     f"{sum(k.startswith('grad.') for k in g.tensors)} gradients")
    if args.certify:
        lines.append(certify.summary(g))
    if tokenizer_note := _decoded(llmc_tokenizer, tokens):
        lines.append(tokenizer_note)
    debug = None
    if args.debug_state:
        from ..oracle import llmc

        x, y, convention = llmc.debug_state_tokens(g.tensors["tokens"], targets)
        debug = str(llmc.write_debug_state(args.debug_state, model, x, targets=y))
        lines.append(f"wrote {debug}: llm.c debug state, {convention}")
    if args.json:
        return print_json(model, {"path": str(path), "tensors": len(g.tensors), "bytes": size, "tokens_shape": shape,
                                  "dtype": g.metadata["dtype"], "tokens_source": source, "backward": args.backward,
                                  "certified": args.certify, "debug_state": debug})
    if note := untrained_note(model):
        print(note)
    print("\n".join(lines))
    return 0


def _decode(args, model, tokens, source, progress) -> int:
    from ..oracle import decode

    N = args.generate
    continuation = None
    if args.tokens and not args.greedy:  # each row: its prompt, then the N tokens to force
        rows = [np.asarray(r) for r in (tokens if isinstance(tokens, list) else np.atleast_2d(tokens))]
        if min(len(r) for r in rows) <= N:
            raise RefGPTError(f"--generate {N} with --tokens: each row holds its prompt and then the {N} tokens to "
                              f"force, so it needs more than {N} tokens (the shortest has {min(len(r) for r in rows)}); "
                              f"--greedy continues the whole file instead")
        continuation = np.stack([r[-N:] for r in rows])  # [batch, N]
        tokens = [r[:-N] for r in rows] if len(rows) > 1 else rows[0][:-N]
    prompt, mask = pad_rows(tokens, "left", pad_token_id(model))
    prompt = np.atleast_2d(prompt)
    g = decode.make(model, prompt, N, continuation, mask, command=["refgpt", *sys.argv[1:]], progress=progress)
    path = golden.write(args.output, g)
    progress.close()
    chosen = np.asarray(g.tensors["tokens"])[:, prompt.shape[1]:]  # [batch, N]
    kind = "greedy" if continuation is None else "forced"
    if args.json:
        return print_json(model, {"path": str(path), "tensors": len(g.tensors), "bytes": path.stat().st_size,
                                  "prompt_shape": list(prompt.shape), "steps": N, "continuation": kind,
                                  "chosen": chosen.tolist(), "tokens_source": source})
    lines = [f"wrote {path}: decode golden, {len(g.tensors)} tensors, {size_shown(path.stat().st_size)}, prompt "
             f"{list(prompt.shape)}, {N} steps ({kind}), {g.metadata['dtype']}", f"tokens: {source}"]
    if mask is not None:
        lines.append(f"prompts padded on the left with id {pad_token_id(model)}: real tokens per row "
                     f"{[int(n) for n in mask.sum(1)]}")
    for b, row in enumerate(chosen):
        text = f" {shown(model.to_string(row))}" if model.tokenizer is not None else ""
        lines.append(f"row {b} chose {row.tolist()}{text}")
    if note := untrained_note(model):
        print(note)
    print("\n".join(lines))
    return 0


def load_model(args):
    """(model, llm.c tokenizer or None): ``--model`` (a GGUF or an llm.c checkpoint file too, load_chosen) with
    ``--tokenizer``: a directory's tokenizer, or llm.c's (decodes only)."""
    model = load_chosen(args, llmc_checkpoint=True)
    llmc_tokenizer = token_files.with_tokenizer(model, args.tokenizer) if args.tokenizer else None
    if args.text and model.tokenizer is None:
        what = "an llm.c tokenizer holds each token's bytes, not the BPE merges: it decodes, it cannot encode TEXT"
        raise RefGPTError(f"{args.model if args.model else 'the model'} has no tokenizer to encode TEXT"
                          f"{': ' + what if args.tokenizer else ''}; give --tokens FILE (e.g. llm.c's debug state), "
                          f"or --tokenizer DIR with vocab.json and merges.txt")
    return model, llmc_tokenizer


def _decoded(tok, tokens):
    if tok is None:
        return None
    first = np.asarray(tokens).reshape(-1, np.asarray(tokens).shape[-1])[0]
    text = tok.decode_bytes(first[:40]).decode("utf-8", errors="replace")
    return f"text of the first row (llm.c tokenizer): {shown(text)}{' …' if len(first) > 40 else ''}"


def _shape(args):
    if args.tokens_shape is None:
        return None
    try:
        B, T = (int(v) for v in args.tokens_shape.split(","))
    except ValueError:
        args.usage_error(f"argument --tokens-shape: expected B,T (two integers), found {args.tokens_shape!r}")
    if B < 1 or T < 1:
        args.usage_error(f"argument --tokens-shape: B and T must be ≥ 1, found {args.tokens_shape!r}")
    return B, T
