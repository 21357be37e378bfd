"""``refgpt lens TEXT``: what each layer's stream would predict, position by position, for any TEXT
("train" and "eval" too: training and evaluating a tuned lens are ``refgpt train-lens`` and
``refgpt eval-lens``, refgpt/cli/train_lens.py and eval_lens.py).

Rows are positions of TEXT, columns the streams entering each block and the final stream; each
cell is the lens's top next token and its probability — or, with ``--target TOKEN`` (or
``--target-id ID``), the probability of that token. ``--kind`` picks the lens (refgpt.analysis.lens):
``logit`` recomputes ln_final from each stream (the correct logit lens), ``final-scale`` divides by
the final stream's cached scale, ``tuned`` applies the translators of ``--lens PATH`` (a lens
directory as the tuned-lens package writes it — config.json + params.pt, e.g. one from the hub — or
a .safetensors/.pt translator file; ``--translators`` is the old name), by default on the embedded
model the lens shipped for it. ``--stream resid_mid`` reads the streams between attention and MLP.
``--plot FILE`` saves the heatmap (needs matplotlib: ``pip install matplotlib``).

Before issue 37, ``refgpt lens train …`` and ``refgpt lens eval …`` were actions of this command,
and the text "train" needed ``refgpt lens -- train``. The old spelling with its own options
(``--text``, which ``lens`` does not take) is a usage error naming the new command
(``old_spelling``); ``refgpt lens train`` alone reads the text "train".
"""

from __future__ import annotations

from pathlib import Path

from ..analysis.lens import TunedLens, logit_lens, logit_lens_final_scale
from ..errors import RefGPTError
from ..files.default_model import is_default_model
from ..files.lens_directory import STREAMS
from ..train.tuned_lens import text_windows
from ._arguments import add_token_argument, token_argument
from ._chosen_model import add_subcommand, header, load_chosen, print_json, token_json, token_text, tokens_of
from ._table import table

KINDS = ("logit", "final-scale", "tuned")
#: The words that were actions of this command before issue 37, and the commands they are now.
MOVED = {"train": "train-lens", "eval": "eval-lens"}

DESCRIPTION = """\
Read a prediction out of every layer's residual stream (the logit lens) and print, for each
position of TEXT, the top next token and its probability at each stream — or the probability
of --target (or --target-id). --kind final-scale uses the final stream's cached LayerNorm scale
instead of each stream's own; --kind tuned applies a tuned lens first: --lens DIR (a lens
directory of the tuned-lens package, config.json + params.pt, or a translator file), by default
on the embedded model the lens trained for it.

Also: `refgpt train-lens --text FILE -o DIR` trains a tuned lens, `refgpt eval-lens --text FILE`
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
                       "(also: train-lens, eval-lens)", description=DESCRIPTION, examples=EXAMPLES)
    p.add_argument("--kind", choices=KINDS, default="logit", help="which lens (default: logit)")
    add_lens_arguments(p)
    add_token_argument(p, "target", "show the probability of this token")
    p.add_argument("--plot", metavar="FILE", help="save the heatmap (PNG) to FILE (needs matplotlib: pip install matplotlib)")


def old_spelling(words) -> str | None:
    """The usage error for ``refgpt lens train|eval --text …`` (the spelling before issue 37), else
    None. Only with --text, an option ``lens`` does not take, so no TEXT is ever mistaken for it."""
    if words[:1] == ["lens"] and words[1:2] and words[1] in MOVED and any(
            w == "--text" or w.startswith("--text=") for w in words[2:]):
        return (f"refgpt lens {words[1]} is now refgpt {MOVED[words[1]]} (refgpt lens TEXT reads any text, "
                f"{words[1]!r} too)")
    return None


def add_lens_arguments(p):
    p.add_argument("--lens", "--translators", dest="lens", metavar="PATH",
                   help="tuned lens: a lens directory (config.json + params.pt, as the tuned-lens package and the hub "
                        "have them) or a .safetensors/.pt translator file; default on the embedded model: its own")
    p.add_argument("--stream", choices=STREAMS, default=None,
                   help="the streams read: resid_pre (entering each block, default) or resid_mid (between attention "
                        "and MLP); a tuned lens reads the stream it was trained on")
    p.add_argument("--ignore-unembed-hash", action="store_true",
                   help="use a lens whose config.json unembed_hash is another model's")


def tuned_lens_of(model, args):
    if args.lens is None and not is_default_model(model.source):
        args.usage_error("--kind tuned needs --lens PATH on a model other than the embedded one "
                         "(refgpt train-lens makes a lens)")
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
        tuned = tuned_lens_of(model, args)
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


def text_windows_of(model, args):
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
