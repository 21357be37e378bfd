"""``refgpt lens TEXT``: what each layer's stream would predict, position by position; ``refgpt lens
train`` trains a tuned lens; ``refgpt lens eval`` measures the logit and tuned lenses over a text.

Rows are positions of TEXT, columns the streams entering each block and the final stream; each
cell is the lens's top next token and its probability — or, with ``--target TOKEN`` (or
``--target-id ID``), the probability of that token. ``--kind`` picks the lens (refgpt.analysis.lens):
``logit`` recomputes ln_final from each stream (the correct logit lens), ``final-scale`` divides by
the final stream's cached scale, ``tuned`` applies the translators of ``--lens PATH`` (a lens
directory as the tuned-lens package writes it — config.json + params.pt, e.g. one from the hub — or
a .safetensors/.pt translator file; ``--translators`` is the old name), by default on the embedded
model the lens shipped for it. ``--stream resid_mid`` reads the streams between attention and MLP.
``--plot FILE`` saves the heatmap (needs matplotlib: ``pip install matplotlib``).

``refgpt lens train --text FILE … -o DIR`` trains a tuned lens as the package does
(refgpt.train.tuned_lens) and writes DIR/config.json, DIR/params.pt and DIR/training_log.json,
with one line per step on stderr. ``refgpt lens eval --text FILE`` prints per layer KL(final ‖
lens), the next token's cross-entropy and the entropy of the logit and tuned lenses, in nats per
token and bits per byte (the package's evaluation). ``refgpt lens -- train`` looks at the text "train".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..analysis.lens import TunedLens, evaluate_lenses, logit_lens, logit_lens_final_scale
from ..errors import RefGPTError
from ..files.default_model import is_default_model
from ..files.lens_directory import STREAMS
from ..train.tuned_lens import LensSettings, text_windows, train_tuned_lens
from ._arguments import add_token_argument, non_negative_float, positive_int, token_argument
from ._chosen_model import add_subcommand, header, load_chosen, print_json, token_json, token_text, tokens_of
from ._table import table

KINDS = ("logit", "final-scale", "tuned")
ACTIONS = ("train", "eval")

DESCRIPTION = """\
Read a prediction out of every layer's residual stream (the logit lens) and print, for each
position of TEXT, the top next token and its probability at each stream — or the probability
of --target (or --target-id). --kind final-scale uses the final stream's cached LayerNorm scale
instead of each stream's own; --kind tuned applies a tuned lens first: --lens DIR (a lens
directory of the tuned-lens package, config.json + params.pt, or a translator file), by default
on the embedded model the lens trained for it.

Also: `refgpt lens train --text FILE -o DIR` trains a tuned lens, `refgpt lens eval --text FILE`
measures the logit and tuned lenses over a text (see their --help).
"""

USES = ("--model", "--dtype", "--json", "--bos")

EXAMPLES = (
    'refgpt lens "To be, or not to" --bos --kind tuned',
    'refgpt lens "To be, or not to" --target " be" --kind final-scale --json',
    'refgpt lens "My lord, I" --stream resid_mid --plot lens.png',
    'refgpt lens "My lord, I" --kind tuned --lens lens.safetensors     # translators trained by tuned-lens',
)


def add_parser(subparsers):
    p = add_subcommand(subparsers, "lens", run, uses=USES, help="the logit and tuned lenses: each layer's prediction "
                       "(also: lens train, lens eval)", description=DESCRIPTION, examples=EXAMPLES)
    p.add_argument("--kind", choices=KINDS, default="logit", help="which lens (default: logit)")
    add_lens_arguments(p)
    add_token_argument(p, "target", "show the probability of this token")
    p.add_argument("--plot", metavar="FILE", help="save the heatmap (PNG) to FILE (needs matplotlib: pip install matplotlib)")


def add_lens_arguments(p):
    p.add_argument("--lens", "--translators", dest="lens", metavar="PATH",
                   help="tuned lens: a lens directory (config.json + params.pt, as the tuned-lens package and the hub "
                        "have them) or a .safetensors/.pt translator file; default on the embedded model: its own")
    p.add_argument("--stream", choices=STREAMS, default=None,
                   help="the streams read: resid_pre (entering each block, default) or resid_mid (between attention "
                        "and MLP); a tuned lens reads the stream it was trained on")
    p.add_argument("--ignore-unembed-hash", action="store_true",
                   help="use a lens whose config.json unembed_hash is another model's")


TRAIN_USES = ("--model", "--dtype", "--json")
TRAIN_EXAMPLES = (
    "refgpt lens train --text macbeth.txt -o my-lens --steps 2 --tokens-per-step 256",
    "refgpt lens train --text macbeth.txt -o my-mid-lens --stream resid_mid --steps 2 --tokens-per-step 256 --json",
)
EVAL_USES = ("--model", "--dtype", "--json")
EVAL_EXAMPLES = (
    "refgpt lens eval --text macbeth.txt --max-tokens 1024     # the embedded model's shipped lens",
    "refgpt lens eval --text macbeth.txt --lens my-lens --max-tokens 1024 --json",
)


def build_action_parser(action: str, parser_class) -> argparse.ArgumentParser:
    """A parser whose only subcommand is ``action`` ("train" or "eval"): ``parse_args([action, …])``
    reads ``refgpt lens train …`` / ``refgpt lens eval …`` (prog "refgpt lens")."""
    holder = parser_class(prog="refgpt lens", add_help=False)
    sub = holder.add_subparsers(dest="action", parser_class=parser_class)
    if action == "train":
        p = add_subcommand(sub, "train", run_train, uses=TRAIN_USES, help="train a tuned lens",
                           description=TRAIN_DESCRIPTION, examples=TRAIN_EXAMPLES)
        p.add_argument("--text", action="append", required=True, metavar="FILE",
                       help="UTF-8 text to train on (repeat for several; each is one document)")
        p.add_argument("-o", "--output", required=True, metavar="DIR", help="the lens directory to write")
        defaults = LensSettings()
        p.add_argument("--steps", type=positive_int, default=defaults.steps, help=f"optimizer steps (default {defaults.steps})")
        p.add_argument("--tokens-per-step", type=positive_int, default=defaults.tokens_per_step,
                       help=f"tokens per step, a whole number of windows (default {defaults.tokens_per_step}; "
                            "the package's 2^18 is for a GPU)")
        p.add_argument("--window", type=positive_int, default=None, help="tokens per window (default: the model's n_ctx)")
        p.add_argument("--stream", choices=STREAMS, default="resid_pre", help="the streams the translators read")
        p.add_argument("--lr-scale", type=non_negative_float, default=defaults.lr_scale,
                       help="lr = LR_SCALE·(1 − momentum), as the package (default 1.0: lr 0.1)")
        p.add_argument("--momentum", type=non_negative_float, default=defaults.momentum, help="Nesterov momentum (0.9)")
        p.add_argument("--weight-decay", type=non_negative_float, default=defaults.weight_decay, help="(default 1e-3)")
        p.add_argument("--max-grad-norm", type=non_negative_float, default=defaults.max_grad_norm,
                       help="clip the gradients of all translators together to this norm (default 1.0)")
        p.add_argument("--seed", type=int, default=defaults.seed, help="shuffles the windows (default 42)")
        p.add_argument("--base-model", metavar="NAME", help="config.json's base_model_name_or_path (default: --model)")
        p.add_argument("--quiet", action="store_true", help="no line per step on stderr")
    else:
        p = add_subcommand(sub, "eval", run_eval, uses=EVAL_USES, help="measure the logit and tuned lenses",
                           description=EVAL_DESCRIPTION, examples=EVAL_EXAMPLES)
        p.add_argument("--text", action="append", required=True, metavar="FILE",
                       help="UTF-8 text to evaluate on (repeat for several; each is one document)")
        add_lens_arguments(p)
        p.add_argument("--no-tuned", action="store_true", help="the logit lens only")
        p.add_argument("--window", type=positive_int, default=None, help="tokens per window (default: the model's n_ctx)")
        p.add_argument("--max-tokens", type=positive_int, default=None, help="evaluate the first windows up to this many tokens")
    p.prog = f"refgpt lens {action}"
    return holder


TRAIN_DESCRIPTION = """\
Train a tuned lens for the model as the tuned-lens package does: one translator per block,
h ↦ h + h·Wᵀ + b from zero, each minimising KL(final ‖ lens) at every position of windows of
the text; SGD with Nesterov momentum 0.9, lr 0.1 decayed linearly to 0, weight decay 1e-3, all
gradients clipped together to norm 1 (refgpt.train.tuned_lens). Float64 unless --dtype float32.
Writes DIR/config.json and DIR/params.pt (the package loads them as they are) and
DIR/training_log.json; one line per step on stderr. Deterministic: the same inputs give the same files.
"""
EVAL_DESCRIPTION = """\
Measure the logit lens and a tuned lens over a text, as the tuned-lens package's evaluation does:
per layer, KL(final ‖ lens) (every position), the cross-entropy of the next token and the entropy
of the lens's prediction, in nats per token and in bits per byte, beside the model's own.
"""


def _tuned(model, args):
    if args.lens is None and not is_default_model(model.source):
        args.usage_error("--kind tuned needs --lens PATH on a model other than the embedded one "
                         "(refgpt lens train makes a lens)")
    lens = TunedLens.load(model, args.lens, check_unembed_hash=not args.ignore_unembed_hash)
    if args.stream is not None and args.stream != lens.stream:
        raise RefGPTError(f"the lens {lens.source} reads {lens.stream}, not {args.stream}")
    return lens


def run(args) -> int:
    if args.kind != "tuned" and (args.lens is not None or args.ignore_unembed_hash):
        args.usage_error("--lens PATH and --ignore-unembed-hash go with --kind tuned")
    if args.kind == "final-scale" and args.stream not in (None, "resid_pre"):
        args.usage_error("--kind final-scale reads resid_pre only")
    if args.plot:  # before the model runs: a missing matplotlib is said at once
        from ..analysis.plots import require_matplotlib

        require_matplotlib()
    model = load_chosen(args)
    tokens = tokens_of(model, args)  # [pos]
    if args.kind == "tuned":
        tuned = _tuned(model, args)
        lens = tuned.run(tokens)
    else:
        _, cache = model.run_with_cache(tokens)
        lens = logit_lens(cache, args.stream or "resid_pre") if args.kind == "logit" else logit_lens_final_scale(cache)
    target = token_argument(model, args, "target")
    ids, top_p = (a[:, 0, :, 0] for a in lens.top(1))  # [stream, pos] each
    target_p = None if target is None else lens.prob(target)[:, 0]  # [stream, pos]
    if args.plot:
        from ..analysis.plots import lens_figure, printable, token_labels

        lens_figure(lens, labels=token_labels(model, tokens), target=target, path=args.plot,
                    decode=lambda i: token_labels(model, [i])[0] if model.tokenizer else printable(str(i)),
                    title=f"{lens.kind}: top token per stream and position"
                          + (f" (colour = p of token {target})" if target is not None else ""))
    lens_note = [f"lens: {tuned.source} ({tuned.stream})", *tuned.notes] if args.kind == "tuned" else []
    if args.json:
        cells = [[{"top": token_json(model, ids[M, j]), "probability": float(top_p[M, j]),
                   **({"target_probability": float(target_p[M, j])} if target is not None else {})}
                  for M in range(len(lens.labels))] for j in range(len(tokens))]
        return print_json(model, {
            "text": args.text, "kind": lens.kind, "streams": lens.labels,
            "tokens": [token_json(model, t) for t in tokens], "cells": cells,
            "target": None if target is None else token_json(model, target), "plot": args.plot,
            **({"lens": str(tuned.source), "lens_notes": tuned.notes} if args.kind == "tuned" else {})})
    rows = []
    for j in range(len(tokens)):
        if target is None:
            cells = [f"{token_text(model, ids[M, j])} {top_p[M, j]:.3f}" for M in range(len(lens.labels))]
        else:
            cells = [f"{target_p[M, j]:.4f}" for M in range(len(lens.labels))]
        rows.append([j, token_text(model, tokens[j]), *cells])
    what = "top next token and its probability" if target is None else f"p({token_text(model, target)})"
    print("\n".join([
        *header(model, args, tokens),
        *lens_note,
        f"{lens.kind}: {what}, per position (rows) and stream (columns)",
        "",
        table(["pos", "token", *lens.labels], rows, align="><" + ">" * len(lens.labels)),
        *([f"\nfigure: {args.plot}"] if args.plot else []),
    ]))
    return 0


def _read_texts(paths) -> list[str]:
    texts = []
    for name in paths:
        path = Path(name)
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RefGPTError(f"--text {name}: not found") from None
        except UnicodeDecodeError as error:
            raise RefGPTError(f"--text {name}: not UTF-8 text (byte {error.start})") from None
        except OSError as error:
            raise RefGPTError(f"--text {name}: cannot read ({error.strerror or error})") from None
    return texts


def _windows(model, args):
    if model.tokenizer is None:
        raise RefGPTError(f"{model.source}: the model has no tokenizer (vocab.json + merges.txt) to read --text with")
    window = args.window or model.cfg.n_ctx
    if window > model.cfg.n_ctx:
        args.usage_error(f"--window {window} is longer than the model's context ({model.cfg.n_ctx})")
    windows, nats_to_bpb = text_windows(model.tokenizer, _read_texts(args.text), window)
    if len(windows) == 0:
        raise RefGPTError(f"--text {', '.join(args.text)}: fewer tokens than one window of {window}: give more text "
                          "(or a shorter --window)")
    return windows, nats_to_bpb


def run_train(args) -> int:
    model = load_chosen(args)
    windows, nats_to_bpb = _windows(model, args)
    settings = LensSettings(steps=args.steps, tokens_per_step=args.tokens_per_step, lr_scale=args.lr_scale,
                            momentum=args.momentum, weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm,
                            seed=args.seed, stream=args.stream, dtype=args.dtype)
    if not args.quiet:
        print(f"refgpt lens train: {len(windows):,} windows of {windows.shape[1]} tokens from {', '.join(args.text)}; "
              f"{settings.steps} steps × {settings.tokens_per_step:,} tokens, {settings.dtype}, {settings.stream}",
              file=sys.stderr, flush=True)
    trained = train_tuned_lens(model, windows, settings, progress=None if args.quiet else sys.stderr)
    trained.record["texts"] = list(args.text)
    trained.record["nats_to_bpb"] = nats_to_bpb
    base = args.base_model or (args.model if args.model is not None else "refgpt.weights/default")
    path = trained.save(args.output, base_model=base)
    last = trained.record["kl"][-1]
    if args.json:
        return print_json(model, {"lens": str(path), "steps": settings.steps, "tokens_per_step": settings.tokens_per_step,
                                  "stream": settings.stream, "final_kl": last, "files": ["config.json", "params.pt",
                                                                                       "training_log.json"]})
    print("\n".join([*header(model, args), f"lens: {path} (config.json, params.pt, training_log.json)",
                     f"last step's KL per translator (nats): {' '.join(f'{x:.4f}' for x in last)}"]))
    return 0


def run_eval(args) -> int:
    if args.no_tuned and (args.lens is not None or args.ignore_unembed_hash):
        args.usage_error("--no-tuned measures the logit lens only: it takes no --lens or --ignore-unembed-hash")
    model = load_chosen(args)
    windows, nats_to_bpb = _windows(model, args)
    if args.max_tokens is not None:
        keep = args.max_tokens // windows.shape[1]
        if keep == 0:
            args.usage_error(f"--max-tokens {args.max_tokens} is less than one window ({windows.shape[1]} tokens)")
        windows = windows[:keep]
    tuned = None
    if not args.no_tuned:
        if args.lens is None and not is_default_model(model.source):
            args.usage_error("give --lens PATH (or --no-tuned) on a model other than the embedded one")
        tuned = _tuned(model, args)
    result = evaluate_lenses(model, windows, tuned, stream=args.stream or "resid_pre", nats_to_bpb=nats_to_bpb)
    if args.json:
        return print_json(model, {"texts": args.text, "windows": int(len(windows)), "window": int(windows.shape[1]),
                                  "lens": None if tuned is None else str(tuned.source), **result.as_dict()})
    kinds = list(result.metrics)
    lines = [*header(model, args),
             f"text:  {', '.join(args.text)}: {result.tokens:,} tokens in {len(windows)} windows of {windows.shape[1]} "
             f"(nats per token × {nats_to_bpb:.4f} = bits per byte)",
             *([f"lens:  {tuned.source} ({tuned.stream})", *tuned.notes] if tuned is not None else [])]
    for unit, scale in (("nats per token", 1.0), ("bits per byte", nats_to_bpb)):
        head = ["layer"] + [f"{m} {k}" for m in ("KL", "CE", "entropy") for k in kinds]
        rows = [[label] + [f"{result.metrics[k][m][M] * scale:.4f}" for m in ("kl", "ce", "entropy") for k in kinds]
                for M, label in enumerate(result.labels)]
        rows.append(["model"] + ["—"] * len(kinds) + [f"{result.final['ce'] * scale:.4f}"] + [""] * (len(kinds) - 1)
                    + [f"{result.final['entropy'] * scale:.4f}"] + [""] * (len(kinds) - 1))
        lines += ["", f"{unit}: KL(final ‖ lens), next-token cross-entropy, entropy (logit = logit lens)",
                  table(head, rows, align="<" + ">" * (len(head) - 1))]
    print("\n".join(lines))
    return 0
