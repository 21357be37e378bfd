"""``refgpt predict TEXT``: the model's distribution over the token that comes after TEXT.

The logits at the last position, and their softmax p_i = exp(l_i − max l) / Σ_j exp(l_j − max l),
computed in the model's dtype; the K most likely tokens as a table (rank, id, token text shown with
repr() so spaces and newlines are visible, probability, logit), or all of it as JSON with --json.
Ties in the logits are ranked by token id.
"""

from __future__ import annotations

import numpy as np

from ..gpt2.activations import softmax
from ._arguments import positive_int
from ._chosen_model import add_subcommand, header, load_chosen, print_json, token_json, token_text, tokens_of
from ._table import table

DESCRIPTION = """\
Run the model on TEXT and print its distribution over the next token: the K most likely
tokens with their rank, id, text (as a Python repr, so spaces and newlines show; a lone byte
of a multi-byte character shows as b'\\xe2'), probability and logit. --json prints the same
for scripts, with each token's bytes in hex.
"""

USES = ("--model", "--dtype", "--json", "--bos")

EXAMPLES = (
    'refgpt predict "To be, or not to"',
    'refgpt predict "To be, or not to" --bos --top-k 5     # <|endoftext|> first, as model(TEXT) reads it',
    'refgpt predict "O Romeo, Romeo!" --dtype float32 --json',
    'refgpt predict "The capital of France is" --model gpt2     # GPT-2 itself: refgpt download gpt2',
)


def add_parser(subparsers):
    p = add_subcommand(subparsers, "predict", run, uses=USES, help="the next-token distribution after TEXT",
                       description=DESCRIPTION, examples=EXAMPLES)
    p.add_argument("--top-k", type=positive_int, default=10, metavar="K",
                   help="how many of the most likely tokens to show (default 10)")


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
