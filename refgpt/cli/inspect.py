"""``refgpt inspect TEXT``: every LayerNorm's statistics, and the cached-scale decomposition checked live.

First, per layer and position, the norm ‖x‖ of the residual stream each LayerNorm reads and the
two numbers it computes from it, its mean μ and scale σ = √(‖x − μ‖²/n + ε): ln1 reads resid_pre,
ln2 reads resid_mid, ln_final reads the final stream.

Then refgpt's first fact (docs/layernorm.md §2), on this very forward pass. The final stream is a
sum of components c_i (embed, pos_embed, every attn_out and mlp_out); with ln_final's scale σ held
at its cached value, each contributes (w ⊙ (c_i − mean c_i)/σ)·W_U to the logits, and these plus
b·W_U (+ b_U) sum to the logits up to rounding. Normalising each c_i with its own scale, the naive
per-piece LayerNorm, misses by far more (§3). Both errors are max |Σ pieces − logits| over every
position and token.
"""

from __future__ import annotations

import numpy as np

from ..gpt2 import ln_views
from ..tl.decomposition import decompose_resid
from ._chosen_model import add_subcommand, header, load_chosen, print_json, token_json, token_text, tokens_of
from ._table import table

DESCRIPTION = """\
Run the model on TEXT and print, per layer and position, the 2-norm of the residual stream
each LayerNorm reads and the mean and scale that ln1, ln2 and ln_final compute from it. Then
check docs/layernorm.md's first fact live: the logits as a sum over the components of the final
residual stream (embeddings, every attn_out and mlp_out), each pushed through ln_final with its
cached scale, match the logits up to rounding (to 1e-12 of max(1, max |logit|) in float64);
normalising each component with its own scale instead misses by far more.
"""

USES = ("--model", "--dtype", "--json", "--bos")

EXAMPLES = (
    'refgpt inspect "To be, or not to"',
    'refgpt inspect "Now is the winter of" --dtype float32',
    'refgpt inspect "To be, or not to" --bos --json',
)


def add_parser(subparsers):
    p = add_subcommand(subparsers, "inspect", run, uses=USES, description=DESCRIPTION, examples=EXAMPLES,
                       help="LayerNorm statistics per layer and position, and the cached-scale decomposition checked live")
    p.add_argument("--layers", metavar="LIST", help="show only these layers, e.g. 0,2-3 (default: all)")
    p.add_argument("--positions", metavar="LIST", help="show only these positions, e.g. 0-4,-1 (negative: from "
                   "the end; default: all)")
    return p


def decomposition_errors(model, logits, cache) -> dict:
    """max |Σ pieces − logits| through ln_final's two views (refgpt/gpt2/ln_views.py): the cached-scale
    view (exact), and the recomputed view, each piece with its own scale (the naive mistake)."""
    p, eps = model.params, model.cfg.eps
    w, W_U = p["ln_final.w"], p["unembed.W_U"]  # [d_model], [d_model, d_vocab]
    no_b = np.zeros_like(p["ln_final.b"])  # [d_model]: b is counted once, in bias
    sigma = cache["ln_final.hook_scale"]  # [batch, pos, 1]
    bias = p["ln_final.b"] @ W_U + model.b_U  # [d_vocab]: counted once
    exact = naive = bias  # [d_vocab], broadcast up to [batch, pos, d_vocab] by the first piece
    pieces = decompose_resid(cache)  # [piece, batch, pos, d_model]: embed, pos_embed, each attn_out, mlp_out
    for piece in pieces:  # [batch, pos, d_model]
        exact = exact + (w * ln_views.cached_scale(piece, sigma)) @ W_U  # [batch, pos, d_vocab]
        naive = naive + ln_views.recomputed(piece, w, no_b, eps) @ W_U  # [batch, pos, d_vocab]
    return {"pieces": len(pieces), "max_abs_logit": float(np.max(np.abs(logits))),
            "cached_scale_error": float(np.max(np.abs(exact - logits))),
            "naive_error": float(np.max(np.abs(naive - logits)))}


# Table column → (what, hook name in block L): the residual stream's 2-norm, or a LayerNorm statistic.
BLOCK_COLUMNS = {"resid_pre_norm": ("norm", "blocks.{L}.hook_resid_pre"),
                 "ln1_mean": ("stat", "blocks.{L}.ln1.hook_mean"),
                 "ln1_scale": ("stat", "blocks.{L}.ln1.hook_scale"),
                 "resid_mid_norm": ("norm", "blocks.{L}.hook_resid_mid"),
                 "ln2_mean": ("stat", "blocks.{L}.ln2.hook_mean"),
                 "ln2_scale": ("stat", "blocks.{L}.ln2.hook_scale")}
FINAL_COLUMNS = {"resid_final_norm": ("norm", "blocks.{L}.hook_resid_post"),  # L = the last block
                 "ln_final_mean": ("stat", "ln_final.hook_mean"),
                 "ln_final_scale": ("stat", "ln_final.hook_scale")}


def layer_norm_rows(model, cache, tokens):
    """(block rows, ln_final rows): per (layer, position) and per position, as dicts of plain numbers."""
    def rows(columns, L, **where):
        values = {}
        for key, (what, name) in columns.items():
            activation = cache[name.format(L=L)][0]  # [pos, d_model] or [pos, 1]
            values[key] = np.linalg.norm(activation, axis=-1) if what == "norm" else activation[:, 0]  # [pos]
        return [{**where, "pos": pos, "token": int(t), **{k: float(v[pos]) for k, v in values.items()}}
                for pos, t in enumerate(tokens)]

    n_layers = model.cfg.n_layers
    blocks = [row for L in range(n_layers) for row in rows(BLOCK_COLUMNS, L, layer=L)]
    return blocks, rows(FINAL_COLUMNS, n_layers - 1)


def chosen(text, n, what, args):
    """The indices 0 … n − 1 a LIST names ("0,2-3", "-1": from the end), in order, or a usage error."""
    if text is None:
        return list(range(n))
    picked = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                a, b = part[0] + part[1:].split("-", 1)[0], part[1:].split("-", 1)[1]
                lo, hi = int(a), int(b)
                lo, hi = lo + n if lo < 0 else lo, hi + n if hi < 0 else hi
                values = range(lo, hi + 1)
            else:
                v = int(part)
                values = [v + n if v < 0 else v]
        except ValueError:
            args.usage_error(f"argument --{what}: expected whole numbers and ranges like 0,2-3, found {text!r}")
        for v in values:
            if not 0 <= v < n:
                args.usage_error(f"argument --{what}: {v} is outside 0 … {n - 1}")
            if v not in picked:
                picked.append(v)
    if not picked:
        args.usage_error(f"argument --{what}: names no {what[:-1]}")
    return sorted(picked)


def run(args) -> int:
    model = load_chosen(args)
    tokens = tokens_of(model, args)  # [pos]
    layers = chosen(args.layers, model.cfg.n_layers, "layers", args)
    positions = chosen(args.positions, len(tokens), "positions", args)
    logits, cache = model.run_with_cache(tokens[None])  # [1, pos, d_vocab]
    blocks, final = layer_norm_rows(model, cache, tokens)
    blocks = [r for r in blocks if r["layer"] in layers and r["pos"] in positions]
    final = [r for r in final if r["pos"] in positions]
    errors = decomposition_errors(model, logits, cache)
    if args.json:
        return print_json(model, {"text": args.text, "tokens": [token_json(model, t) for t in tokens],
                                  "blocks": blocks, "ln_final": final, "decomposition": errors})
    shown = {pos: token_text(model, t) for pos, t in enumerate(tokens)}
    number = "{:.6g}".format
    block_table = table(
        ["layer", "pos", "token", "|resid_pre|", "ln1 mean", "ln1 scale", "|resid_mid|", "ln2 mean", "ln2 scale"],
        [[r["layer"], r["pos"], shown[r["pos"]], *(number(r[k]) for k in BLOCK_COLUMNS)] for r in blocks],
        align=">><>>>>>>")
    final_table = table(
        ["pos", "token", "|resid_final|", "ln_final mean", "ln_final scale"],
        [[r["pos"], shown[r["pos"]], *(number(r[k]) for k in FINAL_COLUMNS)] for r in final],
        align="><>>>")
    print("\n".join([
        *header(model, args, tokens),
        "",
        "The residual stream each LayerNorm reads (its 2-norm), and the LayerNorm's mean and scale:",
        "",
        block_table,
        "",
        final_table,
        "",
        f"The logits as a sum over the {errors['pieces']} components of the final residual stream "
        "(docs/layernorm.md §2-3),",
        f"max |Σ pieces − logits| over every position and token (max |logit| = {errors['max_abs_logit']:.6g}):",
        f"  ln_final's scale from the cache (exact):  {errors['cached_scale_error']:.3e}",
        f"  each piece normalised on its own (naive): {errors['naive_error']:.3e}",
    ]))
    return 0
