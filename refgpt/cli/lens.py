"""``refgpt lens TEXT``: what each layer's stream would predict, position by position.

Rows are positions of TEXT, columns the streams entering each block and the final stream; each
cell is the lens's top next token and its probability — or, with ``--target TOKEN`` (or
``--target-id ID``), the
probability of that token. ``--kind`` picks the lens (refgpt.analysis.lens): ``logit`` recomputes
ln_final from each stream (the correct logit lens), ``final-scale`` divides by the final stream's
cached scale, ``tuned`` applies translators from ``--translators FILE`` (tuned-lens safetensors
keys). ``--plot FILE`` saves the heatmap (needs matplotlib: ``pip install matplotlib``).
"""

from __future__ import annotations

from ..analysis.lens import logit_lens, logit_lens_final_scale, tuned_lens
from ._arguments import add_token_argument, token_argument
from ._chosen_model import add_subcommand, header, load_chosen, print_json, token_json, token_text, tokens_of
from ._table import table

KINDS = ("logit", "final-scale", "tuned")

DESCRIPTION = """\
Read a prediction out of every layer's residual stream (the logit lens) and print, for each
position of TEXT, the top next token and its probability at each stream — or the probability
of --target (or --target-id). --kind final-scale uses the final stream's cached LayerNorm scale instead of each
stream's own; --kind tuned applies affine translators from --translators FILE first.
"""

USES = ("--model", "--dtype", "--json", "--bos")

EXAMPLES = (
    'refgpt lens "To be, or not to" --bos',
    'refgpt lens "To be, or not to" --target " be" --kind final-scale --json',
    'refgpt lens "My lord, I" --plot lens.png',
    'refgpt lens "My lord, I" --kind tuned --translators lens.safetensors     # translators trained by tuned-lens',
)


def add_parser(subparsers):
    p = add_subcommand(subparsers, "lens", run, uses=USES, help="the logit lens: each layer's prediction",
                       description=DESCRIPTION, examples=EXAMPLES)
    p.add_argument("--kind", choices=KINDS, default="logit", help="which lens (default: logit)")
    p.add_argument("--translators", metavar="FILE", help="tuned-lens translators (safetensors), for --kind tuned")
    add_token_argument(p, "target", "show the probability of this token")
    p.add_argument("--plot", metavar="FILE", help="save the heatmap (PNG) to FILE (needs matplotlib: pip install matplotlib)")


def run(args) -> int:
    if (args.kind == "tuned") != (args.translators is not None):
        args.usage_error("--translators FILE goes with --kind tuned, and --kind tuned needs it")
    if args.plot:  # before the model runs: a missing matplotlib is said at once
        from ..analysis.plots import require_matplotlib

        require_matplotlib()
    model = load_chosen(args)
    tokens = tokens_of(model, args)  # [pos]
    _, cache = model.run_with_cache(tokens)
    if args.kind == "logit":
        lens = logit_lens(cache)
    elif args.kind == "final-scale":
        lens = logit_lens_final_scale(cache)
    else:
        lens = tuned_lens(cache, args.translators)
    target = token_argument(model, args, "target")
    ids, top_p = (a[:, 0, :, 0] for a in lens.top(1))  # [stream, pos] each
    target_p = None if target is None else lens.prob(target)[:, 0]  # [stream, pos]
    if args.plot:
        from ..analysis.plots import lens_figure, printable, token_labels

        lens_figure(lens, labels=token_labels(model, tokens), target=target, path=args.plot,
                    decode=lambda i: token_labels(model, [i])[0] if model.tokenizer else printable(str(i)),
                    title=f"{lens.kind}: top token per stream and position"
                          + (f" (colour = p of token {target})" if target is not None else ""))
    if args.json:
        cells = [[{"top": token_json(model, ids[M, j]), "probability": float(top_p[M, j]),
                   **({"target_probability": float(target_p[M, j])} if target is not None else {})}
                  for M in range(len(lens.labels))] for j in range(len(tokens))]
        return print_json(model, {
            "text": args.text, "kind": lens.kind, "streams": lens.labels,
            "tokens": [token_json(model, t) for t in tokens], "cells": cells,
            "target": None if target is None else token_json(model, target), "plot": args.plot})
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
        f"{lens.kind}: {what}, per position (rows) and stream (columns)",
        "",
        table(["pos", "token", *lens.labels], rows, align="><" + ">" * len(lens.labels)),
        *([f"\nfigure: {args.plot}"] if args.plot else []),
    ]))
    return 0
