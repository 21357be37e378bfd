"""``refgpt predict TEXT``: the model's distribution over the token that comes after TEXT.

The logits at the last position, and their softmax p_i = exp(l_i − max l) / Σ_j exp(l_j − max l),
computed in the model's dtype; the K most likely tokens as a table (rank, id, token text shown with
repr() so spaces and newlines are visible, probability, logit), or all of it as JSON with --json.
Ties in the logits are ranked by token id.
"""

from __future__ import annotations

import argparse

import numpy as np

from ..gpt2.activations import softmax
from ._arguments import positive_int
from ._chosen_model import add_text_arguments, header, load_chosen, print_json, token_json, token_text, tokens_of
from ._table import table

DESCRIPTION = """\
Run the model on TEXT and print its distribution over the next token: the K most likely
tokens with their rank, id, text (as a Python repr, so spaces and newlines show), probability
and logit. --json prints the same for scripts, with each token's bytes in hex.
"""

EXAMPLES = """\
examples:
  refgpt predict "To be, or not to"
  refgpt predict "O Romeo, Romeo!" --top-k 5 --dtype float32
  refgpt predict "The capital of France is" --model ~/models/gpt2 --json
"""


def add_parser(subparsers, common):
    p = subparsers.add_parser(
        "predict", parents=[common], help="the next-token distribution after TEXT",
        description=DESCRIPTION,
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_text_arguments(p)
    p.add_argument("--top-k", type=positive_int, default=10, metavar="K",
                   help="how many of the most likely tokens to show (default 10)")
    p.set_defaults(run=run, usage_error=p.error)


def next_token_distribution(model, tokens):
    """(logits, probabilities) for the token after ``tokens`` [pos], each [d_vocab], in the model's dtype."""
    logits = model(tokens, last_only=True)[-1]  # [d_vocab]: only the last position is unembedded
    return logits, softmax(logits)  # [d_vocab], [d_vocab]


def run(args) -> int:
    model = load_chosen(args)
    tokens = tokens_of(model, args)  # [pos]
    logits, probs = next_token_distribution(model, tokens)  # [d_vocab], [d_vocab]
    top = np.argsort(-logits, kind="stable")[:args.top_k]  # [k] token ids, most likely first
    if args.json:
        return print_json(model, {
            "text": args.text, "tokens": [token_json(model, t) for t in tokens],
            "top_k": [{"rank": rank, **token_json(model, i), "probability": float(probs[i]),
                       "logit": float(logits[i])} for rank, i in enumerate(top, start=1)]})
    rows = [[rank, int(i), token_text(model, i), f"{probs[i]:.8f}", f"{logits[i]:.6f}"]
            for rank, i in enumerate(top, start=1)]
    print("\n".join([
        *header(model, args, tokens),
        f"next token: top {len(top)} of {model.cfg.d_vocab}",
        "",
        table(["rank", "id", "token", "probability", "logit"], rows, align=">><>>"),
    ]))
    return 0
