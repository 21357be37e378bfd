"""``refgpt steer TEXT --plus P --minus M --layer L --coeff C``: ActAdd steering, and what it did.

The steering vector is C·(resid_pre_L(P) − resid_pre_L(M)), the shorter prompt padded on the
right with the space token, which the answer says (a ``padding:`` line, ``"padding"`` in --json;
null when P and M have one length); it is added to the first positions of TEXT's stream entering block L
(refgpt.analysis.interventions). The command prints, per position of TEXT, the clean and the steered top
next token and KL(steered ‖ clean); and, per steered position, ‖v‖ and its ratio to the stream
at layer L and at the end — the ratio tends to 1 as C grows (docs/steering.md). ``--plot FILE``
saves the residual-norm figure (needs matplotlib: ``pip install matplotlib``). ``--generate N`` continues TEXT by N
greedy tokens with and without the steering vector, side by side: the vector is added to TEXT's
front positions once, in the pass over TEXT, and the generated tokens see it through the KV cache
(refgpt/analysis/interventions.py, "Under generation").
"""

from __future__ import annotations

import numpy as np

from ..gpt2.activations import softmax
from ..analysis.interventions import steering_vector
from ._output import shown
from ..analysis.measurements import injection_ratio, kl_divergence, norm
from ._arguments import count, finite_float
from ._chosen_model import add_subcommand, header, load_chosen, print_json, token_json, token_text, tokens_of
from ._table import table

DESCRIPTION = """\
Steer the model with activation addition (ActAdd): add C·(resid(PLUS) − resid(MINUS)), taken at
the stream entering block L, to the first positions of TEXT's stream at the same layer. Prints
the clean and steered next-token predictions at each position with their KL divergence, and how
large the added vector is against the stream. --bos puts <|endoftext|> before TEXT, PLUS and MINUS.
If PLUS and MINUS differ in length, the shorter is padded on the right with the space token, and
the answer says so.
"""

USES = ("--model", "--dtype", "--json", "--bos")

EXAMPLES = (
    'refgpt steer "I hate you because" --plus "Love" --minus "Hate" --layer 2 --coeff 5 --bos',
    'refgpt steer "I think that" --plus "Love" --minus "Hate" --layer 1 --coeff 10 --bos --generate 20',
    'refgpt steer "The king" --plus "a" --minus "b" --layer 1 --coeff 1e6 --plot norms.png',
)


def add_parser(subparsers):
    p = add_subcommand(subparsers, "steer", run, uses=USES, help="ActAdd steering: predictions, KL and norms",
                       description=DESCRIPTION, examples=EXAMPLES)
    p.add_argument("--plus", required=True, metavar="TEXT", help="the prompt to steer towards")
    p.add_argument("--minus", required=True, metavar="TEXT", help="the prompt to steer away from")
    p.add_argument("--layer", type=int, required=True, metavar="L", help="the block whose input stream is steered")
    p.add_argument("--coeff", type=finite_float, default=1.0, metavar="C", help="the coefficient (default 1)")
    p.add_argument("--plot", metavar="FILE", help="save the residual-norm figure (PNG) to FILE (needs matplotlib: pip install matplotlib)")
    p.add_argument("--generate", type=count, default=0, metavar="N",
                   help="also continue TEXT by N greedy tokens, steered and unsteered, side by side")


def run(args) -> int:
    if args.plot:  # before the model runs: a missing matplotlib is said at once
        from ..analysis.plots import require_matplotlib

        require_matplotlib()
    model = load_chosen(args)
    tokens = tokens_of(model, args)  # [pos]
    sv = steering_vector(model, args.plus, args.minus, args.layer, args.coeff, prepend_bos=args.bos)
    clean_logits = model(tokens)  # [pos, d_vocab]
    logits, cache = model.run_with_cache(tokens, fwd_hooks=sv)  # [pos, d_vocab]
    kl = kl_divergence(logits, clean_logits)  # [pos]
    m = len(sv.vector)
    ratio = injection_ratio(cache, sv.vector, np.arange(m))  # [stream, m]
    size = norm(sv.vector)  # [m], in float64
    if args.generate:
        unsteered = model.generate(tokens, args.generate, temperature=0, stop_at_eos=False)[len(tokens):]  # [n]
        with sv:
            steered = model.generate(tokens, args.generate, temperature=0, stop_at_eos=False)[len(tokens):]  # [n]
    if args.plot:
        from ..analysis.plots import resid_norm_figure, token_labels

        _, clean = model.run_with_cache(tokens)
        resid_norm_figure(cache, position=list(range(m)), labels=token_labels(model, tokens), clean_cache=clean,
                          path=args.plot, title=f"‖resid‖ with ActAdd at layer {sv.layer}, coeff {args.coeff:g}")
    if args.json:
        answer = {
            "text": args.text, "tokens": [token_json(model, t) for t in tokens], "layer": sv.layer, "coeff": args.coeff,
            "padding": _padding_json(model, sv.padding),
            "plus": [token_json(model, t) for t in sv.plus_tokens],
            "minus": [token_json(model, t) for t in sv.minus_tokens],
            "positions": [{"position": j, "token": token_json(model, tokens[j]),
                           "clean_top": token_json(model, int(np.argmax(clean_logits[j]))),
                           "steered_top": token_json(model, int(np.argmax(logits[j]))),
                           "kl": float(kl[j])} for j in range(len(tokens))],
            "vector_norm": size.tolist(), "ratio_to_stream": ratio.T.tolist(),
            "plot": args.plot}
        if args.generate:
            answer["generate"] = {"n": args.generate, "greedy": True, **{
                kind: {"continuation": model.to_string(ids), "new_tokens": [token_json(model, t) for t in ids]}
                for kind, ids in (("unsteered", unsteered), ("steered", steered))}}
        return print_json(model, answer)
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
        f"steering: {args.coeff:g}·(resid({shown(args.plus)}) − resid({shown(args.minus)})) into blocks.{sv.layer}.hook_resid_pre, "
        f"positions 0..{m - 1}",
        *([_padding_line(model, sv.padding)] if sv.padding else []),
        "",
        table(["pos", "token", "clean top", "p", "steered top", "p", "KL(steered‖clean)"], rows, align="><<><>>"),
        "",
        table(["pos", "plus", "minus", "‖v‖", f"‖v‖/‖stream {sv.layer}‖", "‖v‖/‖final stream‖"], size_rows,
              align="><<>>>"),
        *(_generations_side_by_side(model, unsteered, steered) if args.generate else []),
        *([f"\nfigure: {args.plot}"] if args.plot else []),
    ]))
    return 0


def _padding_line(model, padding) -> str:
    """The line that says the shorter prompt was padded, and with what."""
    n = padding.count
    return (f"padding: {padding.prompt.upper()} is {n} token{'s' if n != 1 else ''} shorter; padded on the right "
            f"with {n} × {token_text(model, padding.token)} (id {padding.token})")


def _padding_json(model, padding) -> dict | None:
    if padding is None:
        return None
    return {"prompt": padding.prompt, "count": padding.count, "token": token_json(model, padding.token)}


def _generations_side_by_side(model, unsteered, steered) -> list[str]:
    """The two greedy continuations, token by token (* where they differ), then as text."""
    rows = [[i + 1, token_text(model, a), token_text(model, b), "" if a == b else "*"]
            for i, (a, b) in enumerate(zip(unsteered, steered, strict=True))]
    return ["", f"greedy continuation, {len(steered)} tokens:",
            table(["step", "unsteered", "steered", ""], rows, align="><<<"), "",
            f"unsteered: {shown(model.to_string(unsteered))}", f"steered:   {shown(model.to_string(steered))}"]
