"""``refgpt steer TEXT --plus P --minus M --layer L --coeff C``: ActAdd steering, and what it did.

The steering vector is C·(resid_pre_L(P) − resid_pre_L(M)), the shorter prompt padded with the
space token; it is added to the first positions of TEXT's stream entering block L
(refgpt.analysis.interventions). The command prints, per position of TEXT, the clean and the steered top
next token and KL(steered ‖ clean); and, per steered position, ‖v‖ and its ratio to the stream
at layer L and at the end — the ratio tends to 1 as C grows (docs/steering.md). ``--plot FILE``
saves the residual-norm figure (needs the ``plot`` extra).
"""

from __future__ import annotations

import argparse

import numpy as np

from ..activations import softmax
from ..analysis.interventions import steering_vector
from ..analysis.measurements import injection_ratio, kl_divergence
from ._chosen_model import add_text_arguments, header, load_chosen, print_json, token_json, token_text, tokens_of
from ._table import table

DESCRIPTION = """\
Steer the model with activation addition (ActAdd): add C·(resid(PLUS) − resid(MINUS)), taken at
the stream entering block L, to the first positions of TEXT's stream at the same layer. Prints
the clean and steered next-token predictions at each position with their KL divergence, and how
large the added vector is against the stream. --bos puts <|endoftext|> before TEXT, PLUS and MINUS.
"""

EXAMPLES = """\
examples:
  refgpt steer "I hate you because" --plus "Love" --minus "Hate" --layer 2 --coeff 5 --bos
  refgpt steer "I went up to my friend" --plus " weddings" --minus " " --layer 6 --coeff 4 --bos --model ~/models/gpt2
  refgpt steer "The king" --plus "a" --minus "b" --layer 1 --coeff 1e6 --plot norms.png
"""


def add_parser(subparsers, common):
    p = subparsers.add_parser("steer", parents=[common], help="ActAdd steering: predictions, KL and norms",
                              description=DESCRIPTION, epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_text_arguments(p)
    p.add_argument("--plus", required=True, metavar="TEXT", help="the prompt to steer towards")
    p.add_argument("--minus", required=True, metavar="TEXT", help="the prompt to steer away from")
    p.add_argument("--layer", type=int, required=True, metavar="L", help="the block whose input stream is steered")
    p.add_argument("--coeff", type=float, default=1.0, metavar="C", help="the coefficient (default 1)")
    p.add_argument("--plot", metavar="FILE", help="save the residual-norm figure (PNG) to FILE")
    p.set_defaults(run=run, usage_error=p.error)


def run(args) -> int:
    model = load_chosen(args)
    tokens = tokens_of(model, args)  # [pos]
    sv = steering_vector(model, args.plus, args.minus, args.layer, args.coeff, prepend_bos=args.bos)
    clean_logits = model(tokens)  # [pos, d_vocab]
    logits, cache = model.run_with_cache(tokens, fwd_hooks=sv)  # [pos, d_vocab]
    kl = kl_divergence(logits, clean_logits)  # [pos]
    m = len(sv.vector)
    ratio = injection_ratio(cache, sv.vector, np.arange(m))  # [stream, m]
    size = np.linalg.norm(sv.vector, axis=-1)  # [m]
    if args.plot:
        from ..analysis.plots import resid_norm_figure, token_labels

        _, clean = model.run_with_cache(tokens)
        resid_norm_figure(cache, position=list(range(m)), labels=token_labels(model, tokens), clean_cache=clean,
                          path=args.plot, title=f"‖resid‖ with ActAdd at layer {sv.layer}, coeff {args.coeff:g}")
    if args.json:
        return print_json(model, {
            "text": args.text, "layer": sv.layer, "coeff": args.coeff,
            "plus": [token_json(model, t) for t in sv.plus_tokens],
            "minus": [token_json(model, t) for t in sv.minus_tokens],
            "positions": [{"position": j, "token": token_json(model, tokens[j]),
                           "clean_top": token_json(model, int(np.argmax(clean_logits[j]))),
                           "steered_top": token_json(model, int(np.argmax(logits[j]))),
                           "kl": float(kl[j])} for j in range(len(tokens))],
            "vector_norm": size.tolist(), "ratio_to_stream": ratio.T.tolist(),
            "plot": args.plot})
    p_clean = softmax(clean_logits)  # [pos, d_vocab]
    p_steer = softmax(logits)  # [pos, d_vocab]
    rows = []
    for j in range(len(tokens)):
        a, b = int(np.argmax(clean_logits[j])), int(np.argmax(logits[j]))
        rows.append([j, token_text(model, tokens[j]), token_text(model, a), f"{p_clean[j, a]:.4f}",
                     token_text(model, b), f"{p_steer[j, b]:.4f}", f"{kl[j]:.3e}"])
    size_rows = [[j, token_text(model, sv.plus_tokens[j]), token_text(model, sv.minus_tokens[j]), f"{size[j]:.4g}",
                  f"{ratio[sv.layer, j]:.6g}", f"{ratio[-1, j]:.6g}"] for j in range(m)]
    print("\n".join([
        *header(model, args, tokens),
        f"steering: {args.coeff:g}·(resid({args.plus!r}) − resid({args.minus!r})) into blocks.{sv.layer}.hook_resid_pre, "
        f"positions 0..{m - 1}",
        "",
        table(["pos", "token", "clean top", "p", "steered top", "p", "KL(steered‖clean)"], rows, align="><<><>>"),
        "",
        table(["pos", "plus", "minus", "‖v‖", f"‖v‖/‖stream {sv.layer}‖", "‖v‖/‖final stream‖"], size_rows,
              align="><<>>>"),
        *([f"\nfigure: {args.plot}"] if args.plot else []),
    ]))
    return 0
