"""``refgpt eval-lens --text FILE``: per layer KL(final ‖ lens), the next token's cross-entropy and
the entropy of the logit and tuned lenses, in nats per token and bits per byte (the tuned-lens
package's evaluation). (Until issue 37 it was ``refgpt lens eval``, which made the text "eval"
unreadable by ``refgpt lens``; that spelling now gets a usage error saying the new one.)
"""

from __future__ import annotations

from ..analysis.lens import evaluate_lenses
from ..files.default_model import is_default_model
from ._arguments import positive_int
from ._chosen_model import add_subcommand, header, load_chosen, print_json
from ._table import table
from .lens import add_lens_arguments, text_windows_of, tuned_lens_of

NAME = "eval-lens"
USES = ("--model", "--dtype", "--json")
EXAMPLES = (
    "refgpt eval-lens --text macbeth.txt --max-tokens 1024     # the embedded model's shipped lens",
    "refgpt eval-lens --text macbeth.txt --lens lens-dir --max-tokens 1024 --json     # a lens directory",
)

DESCRIPTION = """\
Measure the logit lens and a tuned lens over a text, as the tuned-lens package's evaluation does:
per layer, KL(final ‖ lens) (every position), the cross-entropy of the next token and the entropy
of the lens's prediction, in nats per token and in bits per byte, beside the model's own.
"""


def add_parser(subparsers):
    p = add_subcommand(subparsers, NAME, run, uses=USES, help="measure the logit and tuned lenses",
                       description=DESCRIPTION, examples=EXAMPLES)
    p.add_argument("--text", action="append", required=True, metavar="FILE",
                   help="UTF-8 text to evaluate on (repeat for several; each is one document)")
    add_lens_arguments(p)
    p.add_argument("--no-tuned", action="store_true", help="the logit lens only")
    p.add_argument("--window", type=positive_int, default=None, help="tokens per window (default: the model's n_ctx)")
    p.add_argument("--max-tokens", type=positive_int, default=None, help="evaluate the first windows up to this many tokens")
    return p


def run(args) -> int:
    if args.no_tuned and (args.lens is not None or args.ignore_unembed_hash):
        args.usage_error("--no-tuned measures the logit lens only: it takes no --lens or --ignore-unembed-hash")
    model = load_chosen(args)
    windows, nats_to_bpb = text_windows_of(model, args)
    if args.max_tokens is not None:
        keep = args.max_tokens // windows.shape[1]
        if keep == 0:
            args.usage_error(f"--max-tokens {args.max_tokens} is less than one window ({windows.shape[1]} tokens)")
        windows = windows[:keep]
    tuned = None
    if not args.no_tuned:
        if args.lens is None and not is_default_model(model.source):
            args.usage_error("give --lens PATH (or --no-tuned) on a model other than the embedded one")
        tuned = tuned_lens_of(model, args)
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
