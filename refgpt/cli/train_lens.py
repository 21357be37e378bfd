"""``refgpt train-lens --text FILE … -o DIR``: train a tuned lens as the tuned-lens package does
(refgpt.train.tuned_lens) and write DIR/config.json, DIR/params.pt and DIR/training_log.json, with
one line per step on stderr. (Until issue 37 it was ``refgpt lens train``, which made the text
"train" unreadable by ``refgpt lens``; that spelling now gets a usage error saying the new one.)
"""

from __future__ import annotations

import sys

from ..files.lens_directory import STREAMS
from ..train.tuned_lens import LensSettings, train_tuned_lens
from ._arguments import non_negative_float, positive_int
from ._chosen_model import add_subcommand, header, load_chosen, print_json
from .lens import text_windows_of

NAME = "train-lens"
USES = ("--model", "--dtype", "--json")
EXAMPLES = (
    "refgpt train-lens --text macbeth.txt -o my-lens --steps 2 --tokens-per-step 256",
    "refgpt train-lens --text macbeth.txt -o my-mid-lens --stream resid_mid --steps 2 --tokens-per-step 256 --json",
)

DESCRIPTION = """\
Train a tuned lens for the model as the tuned-lens package does: one translator per block,
h ↦ h + h·Wᵀ + b from zero, each minimising KL(final ‖ lens) at every position of windows of
the text; SGD with Nesterov momentum 0.9, lr 0.1 decayed linearly to 0, weight decay 1e-3, all
gradients clipped together to norm 1 (refgpt.train.tuned_lens). Float64 unless --dtype float32.
Writes DIR/config.json and DIR/params.pt (the package loads them as they are) and
DIR/training_log.json; one line per step on stderr. Deterministic: the same inputs give the same files.
"""


def add_parser(subparsers):
    p = add_subcommand(subparsers, NAME, run, uses=USES, help="train a tuned lens",
                       description=DESCRIPTION, examples=EXAMPLES)
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
    return p


def run(args) -> int:
    model = load_chosen(args)
    windows, nats_to_bpb = text_windows_of(model, args)
    settings = LensSettings(steps=args.steps, tokens_per_step=args.tokens_per_step, lr_scale=args.lr_scale,
                            momentum=args.momentum, weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm,
                            seed=args.seed, stream=args.stream, dtype=args.dtype)
    if not args.quiet:
        print(f"refgpt train-lens: {len(windows):,} windows of {windows.shape[1]} tokens from {', '.join(args.text)}; "
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
