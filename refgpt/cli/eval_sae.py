"""``refgpt eval-sae DIR [TEXT…]``: what an SAE does on text, and whether it is loaded right.

DIR is an SAELens folder (cfg.json + sae_weights.safetensors), or ``default``: the
SAE trained for the embedded model (weights/default_sae/). The model (``--model``, default the
embedded one) runs on each TEXT and on each ``--text FILE`` cut into windows of its context, and
the activations at the SAE's hook are measured (refgpt.sae.evaluation): L0, explained variance
1 − Σ‖x − x̂‖²/Σ‖x − x̄‖², dead features, MSE. Then the two checks a folder cannot make about itself:
an SAE whose activation function looks wrong (a TopK SAE read as ReLU, SAELens #553) and a model
whose weight processing is not the one the SAE was trained on (#405) are named, with the numbers
that show it. The exit status is 0 either way: the warnings are findings, not failures. (A
subcommand of its own, as train-lens and eval-lens are: no subcommand reads a word as an action.)
"""

from __future__ import annotations

from ..files.default_model import default_sae_path
from ..sae.evaluation import diagnose, token_rows
from ..sae.folder import load_sae
from ..sae.in_model import check_fits
from ..tl.processing import process
from ._chosen_model import add_subcommand, header, load_chosen, print_json
from ._table import table
from .lens import _read_texts

DESCRIPTION = """\
Measure an SAE on text at its hook: L0 (features active per position), explained variance, dead
features; and say when it looks loaded with the wrong activation function or on the wrong weight
processing. DIR: an SAELens folder, or 'default' (the SAE trained for the embedded model).
"""

NAME = "eval-sae"
USES = ("--model", "--dtype", "--json")

EXAMPLES = (
    'refgpt eval-sae default "To be, or not to be, that is the question"',
    'refgpt eval-sae default "My lord, I" "O Romeo, Romeo, wherefore art thou Romeo?" --json',
    'refgpt eval-sae default "To be, or not to be" --process     # processed weights, unlike the SAE\'s: flagged',
)


def add_parser(subparsers):
    p = add_subcommand(subparsers, NAME, run, uses=USES, help="measure a sparse autoencoder on text",
                       description=DESCRIPTION, examples=EXAMPLES)
    p.add_argument("sae", metavar="DIR", help="an SAELens folder, or 'default': the embedded model's SAE")
    p.add_argument("text", metavar="TEXT", nargs="*", help="texts to run (each from <|endoftext|> when the SAE's "
                   "prepend_bos, as SAELens runs them)")
    p.add_argument("--text", dest="files", action="append", default=[], metavar="FILE",
                   help="UTF-8 text cut into windows of the model's context (repeat for several)")
    p.add_argument("--process", action="store_true",
                   help="process the weights as TransformerLens's from_pretrained does first (refgpt.tl.processing)")


def run(args) -> int:
    model = load_chosen(args)
    if args.process:
        model = process(model, True)
    sae = load_sae(default_sae_path() if args.sae == "default" else args.sae, dtype=model.dtype)
    check_fits(model, sae)
    if not args.text and not args.files:
        args.usage_error("give TEXT or --text FILE to measure on")
    result = diagnose(model, sae, token_rows(model, sae, args.text, _read_texts(args.files)))
    m = result.measures
    if args.json:
        return print_json(model, {
            "sae": str(sae.source), "architecture": sae.architecture, "hook": sae.hook_name_out,
            "processed": args.process, **m.as_dict(),
            "alternatives": {name: alt.as_dict() for name, alt in result.alternatives.items()},
            "warnings": result.warnings})
    rows = [["this SAE as loaded", f"{m.l0:.2f}", f"{m.explained_variance:.4f}", f"{m.dead} of {m.d_sae}", f"{m.mse:.4g}"]]
    rows += [[name, f"{a.l0:.2f}", f"{a.explained_variance:.4f}", f"{a.dead} of {a.d_sae}", f"{a.mse:.4g}"]
             for name, a in result.alternatives.items()]
    print("\n".join([
        *header(model, detail=", processed as TransformerLens does" if args.process else ""),
        f"SAE: {sae.source} ({sae.architecture}, d_sae {sae.d_sae}) at {sae.hook_name_out}, "
        f"on {m.n:,} positions",
        "",
        table(["reading", "L0", "explained variance", "dead features", "MSE"], rows, align="<>>>>"),
        "",
        *([f"warning: {w}" for w in result.warnings] or ["no warnings: the activation function and the weight "
                                                        "processing look as the SAE's cfg.json says"]),
    ]))
    return 0
