"""Every number in docs/decomposition.md, computed here.

    python docs/make_decomposition_numbers.py          # refgpt's numbers
    python docs/make_decomposition_numbers.py --tl     # and the TransformerLens 3.9 comparison

Prints one row per number, under the name the page uses (N1, N2, …). A row is *exact* (text,
printed to the digits the page quotes; the page must quote exactly that, followed by its name),
a *bound* (a measured float error, which moves with the BLAS: the page states a power of ten and
the measurement must stay below it) or a *line* (a table row the page must hold as a whole line).
It also draws docs/figures/attribution_bars.png and docs/figures/naive_vs_cached_scale.png
(``--no-figures`` skips them; needs matplotlib).
tests/analysis/test_attribution.py checks the N rows against the page; the TransformerLens rows
(T1, T2) need the 'peers' extra and tests/core/test_decomposition_tl.py checks them. Benchmark numbers come from benchmarks/bench_attribution.py instead.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

import refgpt
from refgpt import Config, Model
from refgpt.gpt2 import ln_views
from refgpt.analysis.attribution import attribute, naive_attribution
from refgpt.gpt2.layernorm import layer_norm, scale as ln_scale
from refgpt.gpt2.params import param_shapes
from refgpt.tl.processing import STEPS, process

CFG = Config(d_model=64, n_layers=4, n_heads=4, d_mlp=256, d_vocab=97, n_ctx=32)
TOKENS = np.random.default_rng(1).integers(0, CFG.d_vocab, size=(2, 16))  # [batch, pos]


def realistic_model(seed=0, cfg=CFG) -> Model:
    """Weights N(0, 1/fan_in), embeddings N(0, 1), biases N(0, 0.1²), LayerNorm gains 1 + N(0, 0.1²),
    LayerNorm biases N(0, 0.1²), and an unembedding bias b_U N(0, 0.1²)."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(".w"):
            params[name] = 1.0 + 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1 or name.split(".")[-1].startswith("b"):
            params[name] = 0.1 * rng.standard_normal(shape)
        elif name in ("embed.W_E", "pos_embed.W_pos"):
            params[name] = rng.standard_normal(shape)
        else:
            fan_in = shape[1] if name.endswith(("W_Q", "W_K", "W_V")) else shape[-2]
            params[name] = rng.standard_normal(shape) / math.sqrt(fan_in)
    params["unembed.b_U"] = 0.1 * rng.standard_normal(cfg.d_vocab)
    return Model(cfg, params)


def bound(value: float) -> str:
    """The power of ten just above a measured float error: what the page states."""
    return f"1e{math.floor(math.log10(value)) + 1}" if value > 0 else "0"


def check_page(rows, page: str) -> list[str]:
    """What is wrong with the page's quotes of ``rows`` (empty when every quote is right)."""
    import re

    problems = []
    lines = set(page.splitlines())
    for name, (kind, value) in rows.items():
        if kind == "line":
            if value not in lines:
                problems.append(f"{name}: the page has no line {value!r}")
        elif kind == "exact":
            # every "(name" on the page must follow the value: a second quote of a row is checked too
            tags = list(re.finditer(r"\(" + name + r"\b", page))
            if not tags:
                problems.append(f"{name}: the page does not quote {value!r} ({name})")
            for tag in tags:
                before = page[:tag.start()].rstrip()
                if not before.endswith(value) or before == page[:tag.start()]:
                    line = page.count("\n", 0, tag.start()) + 1
                    problems.append(f"{name}: line {line} tags {before[-len(value) - 10:]!r}, not {value!r} ({name})")
        else:
            stated = re.search(r"(1e-?\d+)\s+\(" + name + r"\b", page)
            if not stated or not value < float(stated.group(1)):
                problems.append(f"{name}: measured {value:.1e}, the page states "
                                f"{stated.group(1) if stated else 'nothing'}")
    return problems


def counterexample() -> dict[str, tuple[str, str]]:
    """§1's worked example, n = 4, w = 1: c₁ = x + y, c₂ = −y with ‖y‖ ≫ ‖x‖; and a tiny piece."""
    n, eps = 4, 1e-5
    w, b = np.ones(n), np.array([0.5, -0.5, 0.25, -0.25])
    x, y = np.array([1.0, 2.0, 0.0, -3.0]), 1e6 * np.array([3.0, -1.0, -4.0, 2.0])
    fmt = lambda v: "(" + ", ".join(f"{e:+.4f}" for e in v) + ")"  # noqa: E731
    naive = layer_norm(x + y, w, b, eps) + layer_norm(-y, w, b, eps)
    tiny = 0.01 * np.array([1.0, -1.0, 1.0, -1.0])
    stream = 100 * np.array([1.0, 0.0, -1.0, 0.0]) + tiny  # a stream of size ~100 holding the tiny piece
    return {
        "N1": ("exact", fmt(naive)),
        "N2": ("exact", fmt(2 * b)),
        "N3": ("exact", fmt(layer_norm(x, w, b, eps))),
        "N4": ("exact", fmt(layer_norm(tiny, np.ones(n), np.zeros(n), eps))),
        "N5": ("exact", fmt(ln_views.cached_scale(tiny, ln_scale(stream, eps)))),
    }


def model_numbers() -> dict[str, tuple[str, str]]:
    """Exactness, the naive error, processing invariance and the two views, on seeded models."""
    rows = {}
    worst_sum, worst_processed, worst_moved = 0.0, 0.0, 0.0
    for seed in range(4):
        model = realistic_model(seed)
        logits, cache = model.run_with_cache(TOKENS)
        for granularity in ("layer", "head", "neuron"):
            result = attribute(cache, 7, granularity=granularity, logits=logits)
            worst_sum = max(worst_sum, result.check(relative=True))
            processed = process(model, STEPS)
            new_logits, new_cache = processed.run_with_cache(TOKENS)
            worst_processed = max(worst_processed,
                                  attribute(new_cache, 7, granularity=granularity, logits=new_logits).check(relative=True))
        old, new = attribute(cache, 7, 11, granularity="head"), attribute(new_cache, 7, 11, granularity="head")
        for label in old.labels:
            if not label.endswith((".b_V", ".b_O")) and label not in ("ln_final.b", "b_U"):
                worst_moved = max(worst_moved, float(np.max(np.abs(new[label] - old[label]))))
    rows["N6"] = ("bound", worst_sum)
    rows["N7"] = ("bound", worst_processed)
    rows["N8"] = ("bound", worst_moved)

    model = realistic_model(0)
    logits, cache = model.run_with_cache(TOKENS)
    p = model.params
    pieces = cache.decompose_resid()  # [component, batch, pos, d_model]
    own = ln_views.recomputed(pieces, p["ln_final.w"], np.zeros(CFG.d_model), CFG.eps)  # each piece LN'd alone
    naive = (own @ p["unembed.W_U"]).sum(0) + p["ln_final.b"] @ p["unembed.W_U"] + p["unembed.b_U"]
    rows["N9"] = ("exact", f"{np.max(np.abs(naive - logits)) / np.max(np.abs(logits)):.2f}")
    rows["N10"] = ("exact", f"{len(pieces)}")
    ratio = ln_scale(cache["blocks.0.hook_resid_pre"], CFG.eps) / cache["ln_final.hook_scale"]  # [batch, pos, 1]
    rows["N11"] = ("exact", f"{ratio.min():.2f}")
    rows["N12"] = ("exact", f"{ratio.max():.2f}")
    return rows


EMBEDDED_PROMPT = "To be, or not to"  # no <|endoftext|>: the model predicts ' be'


def embedded_components():
    """§1 on the embedded model: the final stream's ten pieces at the last position of
    EMBEDDED_PROMPT, each through ln_final with its own scale and with the final one
    (refgpt.analysis.attribution.naive_attribution, which ``refgpt attribute --naive`` prints).

    Returns (the model's top token, its logit, labels, own scales σ(c) [component], the final
    scale σ, naive [component] = (w ⊙ Pc/σ(c))·W_U[:,t], exact [component] = (w ⊙ Pc/σ)·W_U[:,t],
    the bias term ln_final.b·W_U[:,t])."""
    model = refgpt.load_default()
    tokens = model.to_tokens(EMBEDDED_PROMPT, prepend_bos=False)[0]  # [pos]
    logits, cache = model.run_with_cache(tokens)  # [pos, d_vocab]
    target = int(np.argmax(logits[-1]))
    result = naive_attribution(cache, target, logits=logits)
    assert result.labels[-1] == "ln_final.b"  # the embedded model has no b_U
    return (model.to_string([target]), result.logit, result.labels[:-1], result.own_scale[:-1], result.scale,
            result.naive[:-1], result.exact[:-1], float(result.exact[-1]))


def embedded_numbers() -> dict[str, tuple[str, str]]:
    """§1's component table on the embedded model, and the numbers the text quotes from it."""
    token, logit, labels, own, final, naive, exact, bias = embedded_components()
    rows = {"N13": ("exact", repr(token)), "N14": ("exact", f"{logit:.4f}"), "N15": ("exact", f"{final:.3f}"),
            "N16": ("exact", f"{own[0]:.3f}"), "N17": ("exact", f"{final / own[0]:.0f}"),
            "N18": ("exact", f"{naive.sum() + bias:.2f}"),
            "N19": ("bound", abs(exact.sum() + bias - logit) / abs(logit))}
    share = lambda values, i: f"{100 * sum(values[j] for j in i) / (values.sum() + bias):.0f}%"  # noqa: E731
    rows.update({"N26": ("exact", share(exact, [3])), "N27": ("exact", share(naive, [3])),
                 "N28": ("exact", share(naive, [0, 1])), "N29": ("exact", share(exact, [0, 1]))})
    for label, s, a, b in zip(labels, own, naive, exact, strict=True):
        rows[f"table {label}"] = ("line", f"| {label} | {s:.3f} | {final / s:.1f} | {a:+.3f} | {b:+.3f} |")
    rows["table ln_final.b"] = ("line", f"| ln_final.b | — | — | {bias:+.3f} | {bias:+.3f} |")
    rows["table sum"] = ("line", f"| **sum** | | | **{naive.sum() + bias:+.3f}** | **{exact.sum() + bias:+.3f}** |")
    return rows


def naive_figure(path):
    """docs/figures/naive_vs_cached_scale.png: §1's table as a picture, drawn by the same function
    as ``refgpt attribute "To be, or not to" --target " be" --naive --plot FILE``."""
    from refgpt.analysis.plots import naive_figure as draw

    model = refgpt.load_default()
    tokens = model.to_tokens(EMBEDDED_PROMPT, prepend_bos=False)[0]  # [pos]
    logits, cache = model.run_with_cache(tokens)  # [pos, d_vocab]
    target = int(np.argmax(logits[-1]))
    return draw(naive_attribution(cache, target, logits=logits), path=path, token=model.to_string([target]))


def figures():
    """docs/figures/attribution_bars.png: §6's attribution of the embedded model's top next token
    after "The cat sat on the mat." (after <|endoftext|>), by head, the twelve largest and the rest;
    docs/figures/naive_vs_cached_scale.png: §1's naive and exact pieces."""
    from refgpt.analysis.plots import attribution_bars, printable

    naive_figure(Path(__file__).parent / "figures" / "naive_vs_cached_scale.png")

    model = refgpt.load_default()
    tokens = model.to_tokens(BARS_PROMPT, prepend_bos=True)[0]  # [pos]
    logits, cache = model.run_with_cache(tokens)
    top = int(np.argmax(logits[-1]))
    result = attribute(cache, top, granularity="head", logits=logits)
    attribution_bars(result, pos=-1, k=12, path=Path(__file__).parent / "figures" / "attribution_bars.png",
                     title=f"Contributions to the logit of {printable(model.to_string([top]))!r} after {BARS_PROMPT!r}\n"
                           f"(embedded model, by head; logit {result.logit[0, -1]:.4f})")


BARS_PROMPT = "The cat sat on the mat."


def bars_numbers() -> dict[str, tuple[str, str]]:
    """The numbers §6's attribution-bars caption quotes."""
    model = refgpt.load_default()
    tokens = model.to_tokens(BARS_PROMPT, prepend_bos=True)[0]  # [pos]
    logits, cache = model.run_with_cache(tokens)
    result = attribute(cache, int(np.argmax(logits[-1])), granularity="head", logits=logits)
    column = result.values[:, 0, -1]  # [component]
    order = np.argsort(-np.abs(column), kind="stable")
    top = result.top(2)
    return {"N20": ("exact", f"{result.logit[0, -1]:.4f}"), "N21": ("exact", f"{top[0][0]} ({top[0][1]:.3f})"),
            "N22": ("exact", f"{top[1][0]} ({top[1][1]:.3f})"), "N23": ("exact", f"{column[order[:12]].sum():.3f}"),
            "N24": ("exact", f"{column[order[12:]].sum():+.3f}"), "N25": ("exact", f"{len(order) - 12}")}


def tl_numbers() -> dict[str, tuple[str, str]]:
    """refgpt's TL-named API against TransformerLens 3.9 on the peer test's models (needs peers)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import torch
    import peers as P
    from test_decomposition_tl import tl_processed_like_from_pretrained

    worst, worst_bias = 0.0, 0.0
    for seed in (11, 12):
        cfg = P.random_hf_config(seed, act_fns=tuple(P.TL_ACT_FNS), n_layer=2 + seed % 2, n_positions=8)
        hf = P.random_hf_model(cfg, seed)
        for processed in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                P.save_hf_layout(hf, tmp, dtype="F64")
                model = refgpt.load(tmp, process=True if processed else None)
            tl = tl_processed_like_from_pretrained(hf)[0] if processed else P.tl_model_from_hf(hf, "float64")
            tokens = P.random_tokens(seed, cfg.vocab_size, cfg.n_positions, batch=2, pos=6)
            with torch.no_grad():
                _, tl_cache = tl.run_with_cache(torch.as_tensor(tokens))
            _, cache = model.run_with_cache(tokens)
            for apply_ln in (False, True):
                ours, labels = cache.get_full_resid_decomposition(apply_ln=apply_ln, return_labels=True)
                with torch.no_grad():
                    theirs = P._np(tl_cache.get_full_resid_decomposition(apply_ln=apply_ln))
                worst = max(worst, P.rel_err(ours[:-1], theirs[:-1]))
                worst_bias = max(worst_bias, P.rel_err(ours[-1], theirs[-1]))
    return {"T1": ("bound", worst), "T2": ("exact", f"{worst_bias:.0e}")}


def numbers(tl: bool = False) -> dict[str, tuple[str, str]]:
    rows = {**counterexample(), **model_numbers(), **embedded_numbers(), **bars_numbers()}
    if tl:
        rows.update(tl_numbers())
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tl", action="store_true", help="also compare with TransformerLens 3.9 (needs peers)")
    parser.add_argument("--no-figures", action="store_true", help="print the numbers only")
    args = parser.parse_args(argv)
    rows = numbers(tl=args.tl)
    width = max(map(len, rows))
    for name, (kind, value) in rows.items():
        shown = f"< {bound(value)}  (measured {value:.1e})" if kind == "bound" else value
        print(f"{name:<{width}} {kind:<6} {shown}")
    if not args.no_figures:
        figures()


if __name__ == "__main__":
    main()
