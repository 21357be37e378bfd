"""``refgpt attribute TEXT --target TOKEN``: one logit, split into labelled parts that sum to it.

Runs the model on TEXT and splits the logit of TOKEN (minus the logit of ``--against TOKEN``) at
one position (``--pos``, default the last: the next-token prediction) into every component of the
residual stream, constants included (refgpt.analysis.attribution). Prints the ``--top`` components largest
in absolute value, each with its contribution and the cumulative share Σ|top i| / Σ|all| of the
attribution mass; then the sum of *all* components next to the model's own logit, and their
difference. TOKEN is text that encodes to exactly one token (" Paris"), or ``#ID`` for a token id
(``--target-id ID`` and ``--against-id ID`` also work, as in ``refgpt lens``).

With ``--sae DIR`` (an SAELens folder, or ``default``: the SAE trained for the embedded model) the
activation at the SAE's hook is split again into the SAE's features ("F17"), its ``b_dec`` and its
error row ("sae_error"), in place of the components it covers (refgpt.sae.attribution); the sum
still equals the logit. The weight processing the SAE was trained on is checked first.

``--naive`` answers docs/decomposition.md §1's question instead: the final stream's pieces
(embeddings, each attn_out and mlp_out, ln_final's bias) each normalised by its own scale σ(c)
beside the same pieces through ln_final's cached σ, both sums, the logit and the σ used
(refgpt.analysis.attribution.naive_attribution); ``--plot FILE`` draws it (needs matplotlib).
"""

from __future__ import annotations

import numpy as np

from ..analysis.attribution import GRANULARITIES, attribute, naive_attribution, naive_hooks, required_hooks
from ..errors import RefGPTError
from ..files.default_model import default_sae_path
from ..sae.attribution import attribute_features, hooks_needed
from ..sae.folder import load_sae
from ..sae.in_model import check_fits, check_processing
from ..tl.processing import process
from ._arguments import add_token_argument, positive_int, token_argument
from ._chosen_model import add_subcommand, header, load_chosen, print_json, token_json, token_text, tokens_of
from ._table import table

DESCRIPTION = """\
Split the logit of --target (minus --against) at one position into the contribution of every
component of the residual stream: embeddings, layers, heads or neurons (--granularity), and every
constant (each b_O, b_out, share of b_V, ln_final's bias, b_U) as a component of its own. The
parts sum to the model's logit exactly; the last lines show that sum next to the logit.
"""

USES = ("--model", "--dtype", "--json", "--bos")

EXAMPLES = (
    'refgpt attribute "My lord, I" --target "#11" --granularity neuron --top 10 --json',
    'refgpt attribute "To be, or not to" --target " be" --naive --plot naive.png',
    'refgpt attribute "To be, or not to" --target " be" --against " the" --sae default   # which SAE features',
    'refgpt attribute "The capital of France is" --target " Paris" --model gpt2',
)


def add_parser(subparsers):
    p = add_subcommand(subparsers, "attribute", run, uses=USES, help="exact logit attribution: parts that sum to a logit",
                       description=DESCRIPTION, examples=EXAMPLES)
    add_token_argument(p, "target", "the token whose logit to split")
    add_token_argument(p, "against", "split the logit difference target − against instead")
    p.add_argument("--granularity", choices=GRANULARITIES, default=None,
                   help="components: per layer (default), per head, or per head and neuron")
    p.add_argument("--top", type=positive_int, default=None, metavar="K", help="show the K largest components (default 20)")
    p.add_argument("--pos", type=int, default=-1, help="the position of TEXT to attribute (default -1, the last)")
    p.add_argument("--process", action="store_true",
                   help="process the weights as TransformerLens's from_pretrained does first (refgpt.tl.processing)")
    p.add_argument("--sae", metavar="DIR", default=None,
                   help="split the activation at this SAE's hook into its features, b_dec and error row "
                   "(an SAELens folder; 'default': the SAE trained for the embedded model)")
    p.add_argument("--naive", action="store_true",
                   help="instead: each piece of the final stream normalised by its own scale beside the cached "
                        "scale's exact share, both sums and the σ used (docs/decomposition.md §1)")
    p.add_argument("--plot", metavar="FILE", help="with --naive: save that as a figure (PNG; needs matplotlib: "
                                                  "pip install matplotlib)")


def run(args) -> int:
    model = load_chosen(args)
    if args.process:
        model = process(model, True)
    target, against = token_argument(model, args, "target"), token_argument(model, args, "against")
    if target is None:
        args.usage_error("the following arguments are required: --target (or --target-id)")
    tokens = tokens_of(model, args)  # [pos]
    if not -len(tokens) <= args.pos < len(tokens):
        raise RefGPTError(f"--pos {args.pos} is outside TEXT's {len(tokens)} positions")
    pos = args.pos % len(tokens)
    if args.plot and not args.naive:
        args.usage_error("--plot draws --naive's figure: it goes with --naive")
    if args.naive:
        if args.sae is not None:
            args.usage_error("--naive splits the final stream into its pieces, --sae an activation into features: "
                             "one at a time")
        if args.granularity is not None or args.top is not None:  # refused, not ignored
            args.usage_error("--naive shows every piece of the final stream: --granularity and --top do not apply")
        return _naive(model, args, tokens, target, against, pos)
    args.granularity = args.granularity or "layer"
    args.top = args.top or 20
    sae = None
    if args.sae is not None:
        sae = load_sae(default_sae_path() if args.sae == "default" else args.sae, dtype=model.dtype)
        check_fits(model, sae)
        check_processing(model, sae)
    names = required_hooks(model.cfg, logits=False) if sae is None else hooks_needed(model, sae)
    logits, cache = model.run_with_cache(tokens[None], names=names)
    if sae is None:
        result = attribute(cache, target, against, granularity=args.granularity, logits=logits)
    else:
        result = attribute_features(cache, sae, target, against, granularity=args.granularity, logits=logits)
    values = result.values[:, 0, pos]  # [component]
    order = np.argsort(-np.abs(values), kind="stable")  # [component]
    shares = np.cumsum(np.abs(values[order])) / max(float(np.abs(values).sum()), np.finfo(values.dtype).tiny)
    shown = order[:args.top]
    total, logit = float(result.total[0, pos]), float(result.logit[0, pos])
    error = abs(total - logit)
    relative = error / max(1.0, abs(logit))

    if args.json:
        return print_json(model, {
            "text": args.text, "tokens": [token_json(model, t) for t in tokens],
            "position": pos, "target": token_json(model, target),
            "against": None if against is None else token_json(model, against),
            "granularity": args.granularity, "processed": args.process, "n_components": len(values),
            "top": [{"component": result.labels[i], "contribution": float(values[i]),
                     "cumulative_share": float(shares[k])} for k, i in enumerate(shown)],
            **({} if sae is None else {"sae": _sae_json(sae, result, pos)}),
            "sum": total, "logit": logit, "abs_error": error, "rel_error": relative})
    what = f"logit of {token_text(model, target)} (id {target})"
    if against is not None:
        what = f"logit of {token_text(model, target)} (id {target}) − logit of {token_text(model, against)} (id {against})"
    rows = [[result.labels[i], f"{values[i]:+.6f}", f"{100 * shares[k]:.1f}%"] for k, i in enumerate(shown)]
    sae_line = [] if sae is None else [
        f"SAE {sae.architecture} at {sae.hook_name_out}: {int((result.features[0, pos] > 0).sum())} of {sae.d_sae} "
        f"features active here; its features, b_dec and sae_error replace the components its hook covers"]
    print("\n".join([
        *header(model, args, tokens, ", processed as TransformerLens does" if args.process else ""),
        *sae_line,
        f"{what} at position {pos} ({token_text(model, tokens[pos])}), by {args.granularity}: "
        f"the {len(shown)} largest of {len(values)} components",
        "",
        table(["component", "contribution", "cumulative share"], rows, align="<>>"),
        "",
        table(["check", "value"], [[f"sum of all {len(values)} components", f"{total:+.15g}"],
                                   [f"the model's logit{' difference' if against is not None else ''}", f"{logit:+.15g}"],
                                   ["|sum − logit|", f"{error:.2e} (relative {relative:.2e})"]], align="<<"),
    ]))
    return 0


def _naive(model, args, tokens, target, against, pos) -> int:
    """--naive: question (1) of docs/decomposition.md §1, piece by piece."""
    if args.plot:  # before the model runs: a missing matplotlib is said at once
        from ..analysis.plots import require_matplotlib

        require_matplotlib()
    logits, cache = model.run_with_cache(tokens[None], names=naive_hooks(model.cfg))  # [1, pos, d_vocab]
    result = naive_attribution(cache, target, against, pos=pos, logits=logits)
    if args.plot:
        from ..analysis.plots import naive_figure

        naive_figure(result, path=args.plot, token=model.to_string([target]))
    error = abs(result.exact_sum - result.logit)
    if args.json:
        return print_json(model, {
            "text": args.text, "tokens": [token_json(model, t) for t in tokens], "position": pos,
            "target": token_json(model, target), "against": None if against is None else token_json(model, against),
            "processed": args.process, "ln_final_scale": result.scale,
            "pieces": [{"piece": label, "own_scale": None if np.isnan(s) else float(s), "naive": float(a),
                        "exact": float(b)} for label, s, a, b in zip(result.labels, result.own_scale, result.naive,
                                                                     result.exact, strict=True)],
            "naive_sum": result.naive_sum, "exact_sum": result.exact_sum, "logit": result.logit,
            "abs_error": error, "plot": args.plot})
    what = f"logit of {token_text(model, target)} (id {target})"
    if against is not None:
        what += f" − logit of {token_text(model, against)} (id {against})"
    rows = [[label, "—" if np.isnan(s) else f"{s:.4g}", "—" if np.isnan(s) else f"{result.scale / s:.3g}",
             f"{a:+.6f}", f"{b:+.6f}"]
            for label, s, a, b in zip(result.labels, result.own_scale, result.naive, result.exact, strict=True)]
    rows.append(["sum", "", "", f"{result.naive_sum:+.6f}", f"{result.exact_sum:+.6f}"])
    print("\n".join([
        *header(model, args, tokens, ", processed as TransformerLens does" if args.process else ""),
        f"{what} at position {pos} ({token_text(model, tokens[pos])}), by piece of the final stream",
        f"ln_final σ at position {pos} = {result.scale:.6g} (the cached scale: every exact piece is divided by it)",
        "",
        table(["piece c", "own σ(c)", "σ/σ(c)", "naive, own σ(c)", "exact, cached σ"], rows, align="<>>>>"),
        "",
        table(["check", "value"], [["naive sum (each piece by its own σ(c))", f"{result.naive_sum:+.15g}"],
                                   ["exact sum (every piece by the cached σ)", f"{result.exact_sum:+.15g}"],
                                   [f"the model's logit{' difference' if against is not None else ''}",
                                    f"{result.logit:+.15g}"],
                                   ["|exact sum − logit|", f"{error:.2e}"]], align="<<"),
        *([f"\nfigure: {args.plot}"] if args.plot else []),
    ]))
    return 0


def _sae_json(sae, result, pos) -> dict:
    """The SAE and every active feature at ``pos`` (activation, contribution), largest |contribution|
    first, and the error row."""
    f = result.features[0, pos]  # [d_sae]
    active = np.flatnonzero(f > 0)
    rows = [{"feature": int(i), "activation": float(f[i]), "contribution": float(result[f"F{i}"][0, pos])}
            for i in active]
    rows.sort(key=lambda row: -abs(row["contribution"]))
    return {"path": str(sae.source), "architecture": sae.architecture, "hook": sae.hook_name_out, "d_sae": sae.d_sae,
            "l0": len(active), "b_dec": float(result["b_dec"][0, pos]), "error": float(result["sae_error"][0, pos]),
            "features": rows}
