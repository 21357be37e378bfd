"""``refgpt steer TEXT --plus P --minus M --layer L --coeff C``: ActAdd steering, and what it did.

The steering vector is C·(resid_pre_L(P) − resid_pre_L(M)), the shorter prompt padded on the
right with the space token, which the answer says (a ``padding:`` line, ``"padding"`` in --json;
null when P and M have one length); it is added to the first positions of TEXT's stream entering block L
(refgpt.analysis.interventions). The command prints, per position of TEXT, the clean and the steered top
next token and KL(steered ‖ clean); and, per steered position, ‖v‖ and its ratio to the stream
at layer L and at the end — the ratio tends to 1 as C grows (docs/steering.md). ``--positions
LIST`` adds C·(resid(PLUS) − resid(MINUS)) at the two prompts' own last tokens at those positions
of TEXT instead (``last_token_difference`` and ``add_vector``: a large vector at position 20). ``--plot FILE`` saves the residual-norm figure at the steered
positions, or with ``--lens logit|tuned|PATH`` the lens's reading of every stream, unsteered and at
each ``--coeff`` (repeatable: the figures draw every C on one scale, the tables are the last C's);
needs matplotlib: ``pip install matplotlib``. ``--generate N`` continues TEXT by N
greedy tokens with and without the steering vector, side by side: the vector is added to TEXT's
front positions once, in the pass over TEXT, and the generated tokens see it through the KV cache
(refgpt/analysis/interventions.py, "Under generation").
"""

from __future__ import annotations

import numpy as np

from ..gpt2.activations import softmax
from ..analysis.interventions import add_vector, last_token_difference, steering_vector
from ._output import shown
from ..analysis.measurements import injection_ratio, kl_divergence, norm
from ._arguments import count, finite_float, index_list
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
    'refgpt steer "I think that" --plus "Love" --minus "Hate" --layer 1 --positions 2 --coeff 1 --coeff 1e6 --lens tuned --bos --plot lens.png',
)


def add_parser(subparsers):
    p = add_subcommand(subparsers, "steer", run, uses=USES, help="ActAdd steering: predictions, KL and norms",
                       description=DESCRIPTION, examples=EXAMPLES)
    p.add_argument("--plus", required=True, metavar="TEXT", help="the prompt to steer towards")
    p.add_argument("--minus", required=True, metavar="TEXT", help="the prompt to steer away from")
    p.add_argument("--layer", type=int, required=True, metavar="L", help="the block whose input stream is steered")
    p.add_argument("--coeff", type=finite_float, action="append", metavar="C",
                   help="the coefficient (default 1); repeat it to draw the figure at each (the tables are the last's)")
    p.add_argument("--positions", type=index_list, metavar="LIST",
                   help="add C·(resid(PLUS) − resid(MINUS)) at each prompt's own last token at these positions of "
                        "TEXT, e.g. 20 or 3,5-7, instead of ActAdd's rows at the first positions")
    p.add_argument("--plot", metavar="FILE", help="save the residual-norm figure (PNG) to FILE (needs matplotlib: pip install matplotlib)")
    p.add_argument("--lens", metavar="KIND",
                   help="with --plot: draw this lens's reading of every stream instead, unsteered and at each --coeff, "
                        "on one colour scale: logit, tuned (the lens shipped for the embedded model) or PATH (a tuned "
                        "lens directory or translator file, as refgpt lens --lens takes it)")
    p.add_argument("--generate", type=count, default=0, metavar="N",
                   help="also continue TEXT by N greedy tokens, steered and unsteered, side by side")


def run(args) -> int:
    if args.lens is not None and not args.plot:
        args.usage_error("--lens chooses what --plot draws: it goes with --plot")
    coeffs = args.coeff or [1.0]
    args.coeff = coeffs[-1]  # the tables' coefficient
    if args.plot:  # before the model runs: a missing matplotlib is said at once
        from ..analysis.plots import require_matplotlib

        require_matplotlib()
    model = load_chosen(args)
    tokens = tokens_of(model, args)  # [pos]
    tuned = _tuned_lens(model, args) if args.lens not in (None, "logit") else None
    steer, rows, where, plus_ids, minus_ids, padding = _steering(model, tokens, args, args.coeff)
    clean_logits = model(tokens)  # [pos, d_vocab]
    logits, cache = model.run_with_cache(tokens, fwd_hooks=steer)  # [pos, d_vocab]
    kl = kl_divergence(logits, clean_logits)  # [pos]
    m = len(where)
    ratio = injection_ratio(cache, rows, where)  # [stream, m]
    size = norm(rows)  # [m], in float64
    layer = args.layer % model.cfg.n_layers
    if args.generate:
        unsteered = model.generate(tokens, args.generate, temperature=0, stop_at_eos=False)[len(tokens):]  # [n]
        with steer:
            steered = model.generate(tokens, args.generate, temperature=0, stop_at_eos=False)[len(tokens):]  # [n]
    if args.plot:
        _figure(model, tokens, args, coeffs, rows, where, layer, tuned)
    if args.json:
        answer = {
            "text": args.text, "tokens": [token_json(model, t) for t in tokens], "layer": layer, "coeff": args.coeff,
            "padding": _padding_json(model, padding),
            "plus": [token_json(model, t) for t in plus_ids],
            "minus": [token_json(model, t) for t in minus_ids],
            "positions": [{"position": j, "token": token_json(model, tokens[j]),
                           "clean_top": token_json(model, int(np.argmax(clean_logits[j]))),
                           "steered_top": token_json(model, int(np.argmax(logits[j]))),
                           "kl": float(kl[j])} for j in range(len(tokens))],
            "steered_positions": where.tolist(), "coeffs": coeffs,
            "vector_norm": size.tolist(), "ratio_to_stream": ratio.T.tolist(),
            "plot": args.plot, "lens": args.lens}
        if args.generate:
            answer["generate"] = {"n": args.generate, "greedy": True, **{
                kind: {"continuation": model.to_string(ids), "new_tokens": [token_json(model, t) for t in ids]}
                for kind, ids in (("unsteered", unsteered), ("steered", steered))}}
        return print_json(model, answer)
    p_clean = softmax(clean_logits)  # [pos, d_vocab]
    p_steer = softmax(logits)  # [pos, d_vocab]
    table_rows = []
    for j in range(len(tokens)):
        a, b = int(np.argmax(clean_logits[j])), int(np.argmax(logits[j]))
        table_rows.append([j, token_text(model, tokens[j]), token_text(model, a), f"{p_clean[j, a]:.4f}",
                     token_text(model, b), f"{p_steer[j, b]:.4f}", f"{kl[j]:.3e}"])
    size_rows = [[j, token_text(model, plus_ids[i]), token_text(model, minus_ids[i]), f"{size[i]:.4g}",
                  f"{ratio[layer, i]:.6g}", f"{ratio[-1, i]:.6g}"] for i, j in enumerate(where)]
    at = (f"positions 0..{m - 1}" if args.positions is None else
          f"positions {','.join(map(str, where.tolist()))} (the streams of each prompt's last token)")
    print("\n".join([
        *header(model, args, tokens),
        f"steering: {args.coeff:g}·(resid({shown(args.plus)}) − resid({shown(args.minus)})) into blocks.{layer}.hook_resid_pre, "
        f"{at}",
        *([_padding_line(model, padding)] if padding else []),
        "",
        table(["pos", "token", "clean top", "p", "steered top", "p", "KL(steered‖clean)"], table_rows, align="><<><>>"),
        "",
        table(["pos", "plus", "minus", "‖v‖", f"‖v‖/‖stream {layer}‖", "‖v‖/‖final stream‖"], size_rows,
              align="><<>>>"),
        *(_generations_side_by_side(model, unsteered, steered) if args.generate else []),
        *([f"\nfigure: {args.plot}"] if args.plot else []),
    ]))
    return 0


def _steering(model, tokens, args, coeff):
    """At ``coeff``: (the intervention, the rows it adds [m, d_model], the positions they go to [m],
    the PLUS and MINUS token at each [m], and how the shorter prompt was padded or None): ActAdd's rows
    at the first positions, or with --positions the prompts' last-token difference (never padded)
    at each listed position."""
    if args.positions is None:
        sv = steering_vector(model, args.plus, args.minus, args.layer, coeff, prepend_bos=args.bos)
        return sv, sv.vector, np.arange(len(sv.vector)), sv.plus_tokens, sv.minus_tokens, sv.padding
    difference, plus_ids, minus_ids = last_token_difference(model, args.plus, args.minus, args.layer,
                                                            prepend_bos=args.bos)  # [d_model]
    steer = add_vector(model, tokens, difference, args.layer, positions=args.positions, coeff=coeff)
    where = np.asarray(args.positions) % len(tokens)  # [m] (add_vector has checked them)
    row = (np.float64(coeff) * difference.astype(np.float64)).astype(model.dtype)  # [d_model], as add_vector adds it
    rows = np.broadcast_to(row, (len(where), len(difference)))  # [m, d_model]
    return steer, rows, where, [plus_ids[-1]] * len(where), [minus_ids[-1]] * len(where), None


def _tuned_lens(model, args):
    """--lens tuned (the embedded model's shipped lens) or --lens PATH."""
    from ..analysis.lens import TunedLens
    from ..files.default_model import is_default_model

    if args.lens == "tuned":
        if not is_default_model(model.source):
            args.usage_error("--lens tuned is the lens shipped for the embedded model: give --lens PATH for this model")
        return TunedLens.load(model)
    return TunedLens.load(model, args.lens)


def _figure(model, tokens, args, coeffs, rows, where, layer, tuned):
    """--plot: the residual-norm figure, or with --lens the lens figure, unsteered and at each C."""
    from ..analysis.lens import logit_lens
    from ..analysis.plots import lens_figure, resid_norm_figure, token_labels

    marked = where[norm(rows) > 0]  # an ActAdd row of <|endoftext|> in both prompts is exactly zero: not steered
    at = (f"at position{'s' if len(marked) > 1 else ''} " + ",".join(map(str, marked.tolist())) if len(marked)
          else "(every row zero)")
    what = f"{shown(args.plus)} − {shown(args.minus)} at layer {layer}, {at}"
    labels = token_labels(model, tokens)
    runs = {}
    for c in ([0.0] if args.lens else []) + coeffs:
        steer = None if c == 0 else _steering(model, tokens, args, c)[0]
        _, cache = model.run_with_cache(tokens, fwd_hooks=steer or [])
        runs["unsteered" if c == 0 else f"c = {c:g}"] = cache
    if args.lens is None:
        _, clean = model.run_with_cache(tokens)
        resid_norm_figure(runs if len(runs) > 1 else next(iter(runs.values())), position=marked, labels=labels,
                          clean_cache=clean, path=args.plot,
                          title=f"‖resid‖ with {what}" + ("" if len(runs) > 1 else f", c = {coeffs[0]:g}"))
        return
    read = logit_lens if tuned is None else tuned
    name = "logit lens" if tuned is None else "tuned lens" + ("" if args.lens == "tuned" else f" {args.lens}")
    eot = None if model.tokenizer is None else model.tokenizer.eot_token
    decode = lambda i: token_labels(model, [i])[0][:6] if i != eot else "<eot>"  # noqa: E731
    lens_figure({k: read(cache) for k, cache in runs.items()}, labels=labels, decode=decode, position=marked,
                path=args.plot, title=f"The {name} under steering:\n{what}")


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
