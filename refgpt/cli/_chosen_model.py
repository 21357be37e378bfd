"""The model a subcommand runs on, the text it reads, and the options several subcommands share.

The shared options are ``--model DIR`` or a hub name such as ``--model gpt2``
(refgpt.files.hub.resolve; default: the embedded model, ``refgpt.default_model_path()``) — one
meaning in every subcommand: a path that exists is read from the disk, never looked up on the hub,
a GGUF file (``*.gguf``) is a model everywhere, and any other file is an llm.c checkpoint in
``refgpt golden`` and an error elsewhere (``MODEL_HELP``),
``--dtype float64|float32``, ``--json``, and TEXT with ``--bos``. Each subcommand declares the
ones it uses (``USES`` in its module, passed to :func:`add_subcommand`); any other shared option
is refused when given, a usage error (exit status 2), never accepted and ignored:
``refgpt compare g g --dtype banana`` is an error, because compare runs no model.

A model directory carrying an ``UNTRAINED`` marker (a random initialisation, as the embedded
default was before it was trained) gets a warning in everything a command prints:
:func:`untrained_note` for tables, ``"untrained": true`` in JSON. Every answer starts the same
way: :func:`header` for tables, :func:`print_json` for ``--json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .. import strict_json
from ..files.checkpoint import load
from ..dtypes import COMPUTE_DTYPES
from ..files.default_model import default_model_path, is_untrained
from ..files.hf_cache import not_a_model_directory
from ..errors import RefGPTError
from ._output import shown


MODEL_HELP = ("an HF GPT-2 directory (config.json + model.safetensors), a llama.cpp GPT-2 GGUF file (*.gguf, "
              "dequantized as ggml defines it; refgpt golden also reads an llm.c checkpoint file, gpt2_124M.bin), or a hub name found in the HF cache or downloaded (gpt2, "
              "openai-community/gpt2@REVISION; see refgpt download). A path that exists is always read from "
              "the disk, never looked up on the hub; default: the embedded model")


def _add_model(p):
    p.add_argument("--model", metavar="MODEL", default=None, help=MODEL_HELP)


def _add_dtype(p):
    p.add_argument("--dtype", choices=list(COMPUTE_DTYPES), default="float64", metavar="DTYPE",
                   help="float64 (default) or float32")


def _add_json(p):
    p.add_argument("--json", action="store_true", help="print JSON instead of a table, for scripts")


def add_text_arguments(p, optional: bool | str | None = False):
    """TEXT and --bos, as every text-reading subcommand takes them (``optional`` None: --bos alone,
    for a subcommand whose texts come from a file, ``refgpt sweep``; ``"many"``: any number of TEXTs,
    ``refgpt golden``'s padded batch)."""
    if optional == "many":  # refgpt golden: several TEXTs make a padded batch
        p.add_argument("text", metavar="TEXT", nargs="*",
                       help="the text to run; several make a padded batch (put -- before TEXT if it starts with -)")
    elif optional is not None:
        p.add_argument("text", metavar="TEXT", nargs="?" if optional else None,
                       help="the text to run (put -- before TEXT if it starts with -)")
    p.add_argument("--bos", action="store_true", help="put <|endoftext|> before the text, as GPT-2 saw "
                   "documents start in training and as the Python API's model(TEXT) does by default "
                   + ("(needed to run on empty TEXT)" if optional is not None else "(before each text prompt)"))


#: option → (how a subcommand that uses it adds it, whether it takes a value, why one that does
#: not use it refuses it).
SHARED = {
    "--model": (_add_model, True, "it runs no model"),
    "--dtype": (_add_dtype, True, "it runs no model"),
    "--json": (_add_json, False, "it has no JSON output"),
    "--bos": (add_text_arguments, False, "it reads no TEXT"),
}


class _Refused(argparse.Action):
    """A shared option this subcommand does not use: giving it is a usage error, not a no-op."""

    def __init__(self, option_strings, dest, reason, **kwargs):
        self.reason = reason
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(self.reason)


def add_subcommand(subparsers, name, run, *, uses, help, description, examples, optional_text=False):
    """The parser of ``refgpt NAME``: the shared options it ``uses`` (``"--bos"`` brings TEXT, or with
    ``optional_text=None`` no TEXT: the texts come from a file), the others refused, its description,
    and ``examples`` (command lines, each runnable as printed on the embedded model;
    tests/cli/test_help_examples.py runs every one) as the epilog."""
    unknown = set(uses) - set(SHARED)
    if unknown:
        raise ValueError(f"refgpt {name}: no shared option {sorted(unknown)}")
    p = subparsers.add_parser(name, help=help, description=description,
                              epilog="examples:\n" + "".join(f"  {line}\n" for line in examples),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    for option, (add, takes_value, reason) in SHARED.items():
        if option == "--bos" and option in uses:
            add(p, optional_text)
        elif option in uses:
            add(p)
        else:
            p.add_argument(option, action=_Refused, nargs=None if takes_value else 0,
                           reason=f"{name} takes no {option}: {reason}")
    p.set_defaults(run=run, usage_error=p.error)
    return p


def load_chosen(args, *, llmc_checkpoint: bool = False):
    """The model ``--model`` names (default: the embedded one) in ``--dtype`` (checked by argparse),
    with its tokenizer: the same meaning in every subcommand (``MODEL_HELP``). A path that exists is
    read from the disk, never sent to the hub: a directory as an HF checkpoint; a file as an llm.c
    checkpoint where the subcommand reads one (``llmc_checkpoint``: refgpt golden, whose token ids
    need no tokenizer), else refused naming what is read."""
    if args.model is None:
        return load(default_model_path(), dtype=args.dtype)
    if is_llmc_checkpoint(args.model, llmc_checkpoint=llmc_checkpoint):
        from ..oracle import llmc

        model = llmc.read_model(args.model, dtype=args.dtype)
        model.source = Path(args.model)
        return model
    return load(args.model, dtype=args.dtype)


def is_llmc_checkpoint(model: str, *, llmc_checkpoint: bool = False) -> bool:
    """Whether ``--model`` is an llm.c checkpoint file the subcommand reads (``llmc_checkpoint``);
    any other file is a RefGPTError saying what --model is (a file is never taken for a hub name)."""
    path = Path(model)
    try:
        if not path.is_file() or path.suffix.lower() == ".gguf":  # a GGUF file: load reads it
            return False
    except OSError:  # a name the file system refuses (too long, …): load says so, naming it
        return False
    from ..oracle import llmc, llmc_dump

    if llmc_dump.file_magic(path) == llmc.MODEL_MAGIC:
        if llmc_checkpoint:
            return True
        raise RefGPTError(f"{path}: an llm.c checkpoint, which only refgpt golden reads (it holds no tokenizer); "
                          f"here --model is an HF GPT-2 directory (config.json and model.safetensors), a GGUF "
                          f"file (*.gguf) or a hub name such as gpt2")
    raise RefGPTError(not_a_model_directory(path) + (f", or an llm.c checkpoint (magic {llmc.MODEL_MAGIC}, e.g. "
                                                     f"gpt2_124M.bin)" if llmc_checkpoint else ""))


def untrained_note(model) -> str | None:
    """The warning a table starts with when the model is UNTRAINED, else None."""
    if not is_untrained(model.source):
        return None
    return ("UNTRAINED MODEL: a seeded, randomly initialised GPT-2, so its predictions are noise.\n"
            "For GPT-2 itself, pass --model gpt2 (see the README: refgpt download gpt2).")


def tokens_of(model, args) -> np.ndarray:
    """TEXT (after <|endoftext|> with --bos) as token ids [pos], checked against the context length."""
    tokens = model.to_tokens(args.text, prepend_bos=args.bos, truncate=False)[0]  # [pos]: the CLI adds no BOS unless --bos
    if len(tokens) == 0:
        raise RefGPTError("TEXT is empty: there is nothing to run (add --bos to start from <|endoftext|>)")
    if len(tokens) > model.cfg.n_ctx:
        raise RefGPTError(f"TEXT is {len(tokens)} tokens long, but the model's context holds at most "
                          f"{model.cfg.n_ctx} (n_positions in {model.source / 'config.json'})")
    return tokens


def text_line(args, tokens) -> str:
    """The header line that says what was run: TEXT, its token count, and whether <|endoftext|> comes
    first (the CLI's default is no, the Python API's model(TEXT) is yes, as TransformerLens's)."""
    n = len(tokens)
    bos = " (<|endoftext|> first)" if args.bos else " (no <|endoftext|> first: --bos adds it)"
    return f"text:  {shown(args.text)} = {n} token{'s' if n != 1 else ''}{bos}"


def token_text(model, token_id) -> str:
    """One token as the tables show it: repr() of its text, or of its bytes if they are not whole UTF-8."""
    raw = model.tokenizer.decode_bytes([int(token_id)])
    try:
        return shown(raw.decode("utf-8"))
    except UnicodeDecodeError:  # one byte of a multi-byte character, e.g. b'\xe2'
        return repr(raw)


def token_json(model, token_id) -> dict:
    """One token for --json: its id, its text (U+FFFD for a partial character) and its bytes in hex."""
    raw = model.tokenizer.decode_bytes([int(token_id)])
    return {"id": int(token_id), "text": raw.decode("utf-8", errors="replace"), "bytes": raw.hex()}


def model_json(model) -> dict:
    """Which model produced a --json answer, and whether it is UNTRAINED."""
    return {"model": str(model.source), "untrained": is_untrained(model.source), "dtype": model.dtype.name}


def header(model, args=None, tokens=None, detail="") -> list[str]:
    """The lines a table answer starts with: the UNTRAINED warning (if any), the model, TEXT."""
    note = untrained_note(model)
    return [*([note, ""] if note else []), f"model: {model.source} ({model.dtype.name}{detail})",
            *([text_line(args, tokens)] if tokens is not None else [])]


def print_json(model, answer: dict) -> int:
    """Print a --json answer: which model (``model_json``), then ``answer``; exit status 0."""
    print(strict_json.dumps({**model_json(model), **answer}, indent=2))
    return 0
