"""``refgpt explore TEXT -o page.html``: one offline page that shows the forward pass.

Attention (every head, click to enlarge), the logit and tuned lenses (``--lens DIR``; by default on
the embedded model the tuned lens shipped for it), LayerNorm's σ and mean and
the stream's norm per layer and position, the exact attribution of a target logit, and — with
``--plus/--minus/--layer`` — a steering vector side by side with the clean run, over coefficients
computed ahead for a slider, and — with ``--sae DIR|default`` — the attribution by an SAE's
features, each feature's top ± logits and activation per position (refgpt.sae.page). One
self-contained HTML file: it makes no network request and opens from ``file://``
(refgpt.analysis.explorer; the data schema in docs/explorer.md).
"""

from __future__ import annotations

from ..files.default_model import default_sae_path
from ..sae.folder import load_sae
from ..sae.page import explore
from ..errors import size_shown
from ._arguments import add_token_argument, finite_float, index_list, token_argument
from ._chosen_model import add_subcommand, load_chosen, print_json, token_json, tokens_of

DESCRIPTION = """\
Write one self-contained web page (-o FILE) that shows what the model does with TEXT: every
attention head, the logit and tuned lenses, each LayerNorm's scale and mean and the residual
stream's norm per position, the exact attribution of a target logit and, with --plus/--minus/--layer,
ActAdd steering over a slider of coefficients and, with --sae, the same attribution by an SAE's
features, with each feature's top +/- logits and its activation per position. The page opens
offline, from file://.
The tuned lens is --lens DIR (a lens directory of the tuned-lens package, config.json + params.pt,
or a translator file); by default on the embedded model the lens trained for it.
"""

USES = ("--model", "--dtype", "--json", "--bos")

EXAMPLES = (
    'refgpt explore "To be, or not to" -o page.html',
    'refgpt explore "To be, or not to" --target " be" --bos --sae default -o page.html   # SAE features too',
    'refgpt explore "I hate you because" --plus "Love" --minus "Hate" --layer 2 --coeff 1 --coeff 5 --coeff 50 --bos -o steer.html',
    'refgpt explore "My lord, I" --layers 0,3 --heads 0-1 --lens lens-dir -o some_heads.html     # a tuned-lens package directory',
)


def add_parser(subparsers):
    p = add_subcommand(subparsers, "explore", run, uses=USES,
                       help="an offline page: attention, lenses, LayerNorm, attribution, steering",
                       description=DESCRIPTION, examples=EXAMPLES)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the page to write (.html)")
    add_token_argument(p, "target", "the token whose logit is attributed and whose rank the lenses show "
                       "(default: the model's top next token after TEXT)")
    p.add_argument("--layers", type=index_list, metavar="LIST", help="attention heads of these layers only, e.g. 0,5-7")
    p.add_argument("--heads", type=index_list, metavar="LIST", help="these heads of each layer only, e.g. 0-3")
    p.add_argument("--lens", "--translators", dest="lens", metavar="PATH",
                   help="the tuned lens of the tuned-lens view: a lens directory (config.json + params.pt, as the "
                        "tuned-lens package and the hub have them) or a .safetensors/.pt translator file; default on "
                        "the embedded model: the lens shipped for it (other models: no tuned-lens view)")
    p.add_argument("--no-tuned", action="store_true", help="no tuned-lens view (the logit lens only)")
    p.add_argument("--ignore-unembed-hash", action="store_true",
                   help="use a lens whose config.json unembed_hash is another model's")
    p.add_argument("--sae", metavar="DIR", default=None,
                   help="an SAE view: the target's logit by this SAE's features, b_dec and error row, each feature's "
                        "top +/- logits and activation per position (an SAELens folder; 'default': the SAE trained "
                        "for the embedded model)")
    p.add_argument("--plus", metavar="TEXT", help="steer towards this prompt (with --minus and --layer)")
    p.add_argument("--minus", metavar="TEXT", help="steer away from this prompt")
    p.add_argument("--layer", type=int, metavar="L", help="the block whose input stream is steered")
    p.add_argument("--coeff", type=finite_float, action="append", metavar="C",
                   help="a steering coefficient for the slider (repeatable; default 1)")
    p.add_argument("--positions", type=index_list, metavar="LIST",
                   help="steer these positions of TEXT with the prompts' last-token difference, as refgpt steer "
                        "--positions does, instead of ActAdd's first positions")


def run(args) -> int:
    steering = None
    given = [args.plus is not None, args.minus is not None, args.layer is not None]
    if any(given) and not all(given):
        args.usage_error("steering needs all of --plus, --minus and --layer")
    if (args.coeff or args.positions) and not all(given):
        args.usage_error("--coeff and --positions go with --plus, --minus and --layer")
    if args.no_tuned and (args.lens is not None or args.ignore_unembed_hash):
        args.usage_error("--no-tuned shows no tuned lens: it goes without --lens and --ignore-unembed-hash")
    model = load_chosen(args)
    tokens = tokens_of(model, args)  # [pos]
    if all(given):
        steering = {"plus": args.plus, "minus": args.minus, "layer": args.layer, "coeffs": args.coeff or [1.0],
                    "prepend_bos": args.bos, "positions": args.positions}
    target = token_argument(model, args, "target")
    lens = False if args.no_tuned else args.lens
    sae = None if args.sae is None else load_sae(default_sae_path() if args.sae == "default" else args.sae,
                                                 dtype=model.dtype)
    page = explore(model, tokens, sae, target=target, layers=args.layers, heads=args.heads, lens=lens,
                   steering=steering, check_unembed_hash=not args.ignore_unembed_hash)
    path = page.save(args.output)
    size = path.stat().st_size
    d = page.data
    if args.json:
        return print_json(model, {"output": str(path), "bytes": size, "tokens": [token_json(model, t) for t in tokens],
                                  "target": token_json(model, d["target"]["id"]), "layers": d["layers"],
                                  "heads": d["heads"], "tuned_lens": d["lens"]["tuned_source"],
                                  "sae": None if d["sae"] is None else d["sae"]["hook"], "schema": d["schema"]})
    tuned = d["lens"]["tuned_source"]
    print(f"wrote {path}: {len(tokens)} tokens, {len(d['layers'])} layers × {len(d['heads'])} heads, "
          f"{model.dtype.name}, tuned lens: {'none' if tuned is None else tuned}"
          f"{'' if d['sae'] is None else ', SAE at ' + d['sae']['hook']}, {size_shown(size)}")
    return 0
