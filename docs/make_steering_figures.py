"""Every figure and number of docs/steering.md, from the embedded model.

    python docs/make_steering_figures.py                # the figures, and every number (rows S1, …)
    python docs/make_steering_figures.py --no-figures   # the numbers only

The embedded model is a small GPT-2 trained on Shakespeare (weights/README.md). The *sizes* here —
stream norms, distances to the limit, the 1/k slope — follow from LayerNorm alone and would look
the same on any GPT-2; the tokens and texts are this model's. When the default model changes, run
this script again and copy the rows into the page: tests/analysis/test_steering_page.py reruns
``numbers()`` and fails when the page quotes anything else.

Rows, as in docs/make_decomposition_numbers.py: *exact* (text the page quotes followed by its name,
"0.018–0.042 (S9)"), *bound* (a measured float error: the page states a power of ten above it) or
*line* (a table row the page holds as a whole line). Writes docs/figures/steering_resid_norms.png,
steering_lens.png, steering_convergence.png, actadd_coefficient.png and actadd_tuned_lens.png, and
the seed's two figures by running the page's two ``refgpt steer … --positions 20 --plot`` commands
(SEED_COMMANDS): steering_seed_norms.png and steering_seed_tuned_lens.png.
The tuned lens is the one shipped for the embedded model (weights/default_lens/).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

import refgpt
from refgpt.analysis.interventions import add_vector, injection_limit, last_token_difference, steering_vector
from refgpt.analysis.lens import TunedLens, evaluate_lenses, logit_lens
from refgpt.analysis.measurements import kl_divergence
from refgpt.analysis.plots import printable

HERE = Path(__file__).resolve().parent
OUT = HERE / "figures"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from make_decomposition_numbers import bound, check_page  # noqa: E402  (the same row kinds)
from steering_bounds import op, propagated_bound  # noqa: E402  (§5's bound, as the tests compute it)

PROMPT = "The cat sat on the mat."
LAYER, POSITION = 1, 5  # inject into the stream entering block 1, at the 6th token (' the')
K_FIGURE = 1e3
KS = np.logspace(0, 9, 19)  # the convergence figure's k
TABLE_KS = KS[::4]  # 1, 10², 10⁴, 10⁶, 10⁸

ACTADD_TEXT, ACTADD_PLUS, ACTADD_MINUS, ACTADD_LAYER = "I think that", "Love", "Hate", 1
ACTADD_CS = (1.0, 3.0, 10.0, 1e2, 1e3, 1e6, 1e9, 1e12)  # the text table
ACTADD_CURVE = np.logspace(0, 12, 25)  # the figure
ACTADD_NEW = 15  # greedy tokens per continuation
TUNED_CS = (1.0, 10.0, 1e2, 1e3, 1e6)  # the tuned-lens table (and c = 0, the limit)
TUNED_CURVE = np.logspace(2, 6, 9)  # c for the fitted 1/c² slope of KL to the limit, per stream
HELD_OUT = HERE.parent / "tests" / "data" / "macbeth_act1.txt"  # held out from the model and its lens
HELD_OUT_WINDOWS = 16  # its first 16 windows of 128 tokens, as tests/analysis/test_default_lens.py

SOURCE = "embedded model, trained on Shakespeare"
SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def sci(x: float, digits: int = 2) -> str:
    """1.6·10¹² (or 1.4 for a number between 1 and 10): how the page writes a number."""
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    e = int(exponent)
    return mantissa if e == 0 else f"{mantissa}·10{str(e).translate(SUPERSCRIPT)}"


def minus(text: str) -> str:
    """A printed number with the page's minus sign."""
    return text.replace("-", "−")


def power(k: float) -> str:
    """10⁴ for k = 1e4 (1 for k = 1)."""
    e = int(round(np.log10(k)))
    assert np.isclose(k, 10.0**e), f"{k:g} is not a power of ten"  # 10^8.5 must not print as 10⁸
    return "1" if e == 0 else f"10{str(e).translate(SUPERSCRIPT)}"


class Setting:
    """The injection the page studies: k·d at LAYER, POSITION of PROMPT, d a unit vector (row 1
    of the "Love" − "Hate" ActAdd vector), and the runs every section reads."""

    def __init__(self, dtype="float64"):
        self.model = model = refgpt.load_default(dtype)
        self.tokens = model.to_tokens(PROMPT, prepend_bos=True)[0]  # [pos]
        eot = model.tokenizer.eot_token
        self.decode = lambda i: printable("<eot>" if i == eot else model.to_string([i]), 6)  # noqa: E731
        sv = steering_vector(model, "Love", "Hate", LAYER)
        self.d = sv.vector[1].astype(np.float64) / np.linalg.norm(sv.vector[1])  # [d_model], unit
        self.clean_logits, self.clean = model.run_with_cache(self.tokens)
        self.limit_logits = model.run_with_hooks(self.tokens, fwd_hooks=injection_limit(model, self.d, LAYER, POSITION))

    def inject(self, k, names=None):
        return self.model.run_with_cache(self.tokens, names=names,
                                         fwd_hooks=add_vector(self.model, self.tokens, self.d, LAYER, [POSITION], k))


# ---- the first figure and the lens: k = 1000 ----------------------------------------------------


def stream_numbers(S: Setting, figures: bool) -> dict:
    model, tokens = S.model, S.tokens
    logits, cache = S.inject(K_FIGURE)
    labels = [S.decode(int(t)) for t in tokens]
    if figures:
        from refgpt.analysis.plots import lens_figure, resid_norm_figure

        resid_norm_figure(cache, POSITION, labels=labels, clean_cache=S.clean, path=OUT / "steering_resid_norms.png",
                          title=f"‖resid‖ after adding {K_FIGURE:g}·d at layer {LAYER}, position {POSITION}\n({SOURCE})")
        lens_figure(logit_lens(cache), labels=labels, decode=S.decode, position=POSITION, path=OUT / "steering_lens.png",
                    title=f"Logit lens after the injection: from stream {LAYER}_pre on, position {POSITION} "
                          f"(outlined) predicts its limit\n({SOURCE}; colour = top-token probability)")
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    final = np.linalg.norm(cache[last][0], axis=-1)  # [pos]
    others = np.delete(final, POSITION)
    first = np.linalg.norm(cache["blocks.0.hook_resid_pre"][0], axis=-1)  # [pos]
    added = np.array([np.linalg.norm(cache[f"blocks.{M}.hook_resid_post"][0] - cache[f"blocks.{M}.hook_resid_pre"][0], axis=-1)
                      / np.linalg.norm(cache[f"blocks.{M}.hook_resid_pre"][0], axis=-1)
                      for M in range(model.cfg.n_layers)])  # [block, pos] what each block adds, relative
    at_p, elsewhere = added[LAYER:, POSITION], np.delete(added[LAYER:], POSITION, 1)
    rows = {"S1": ("exact", f"{final[POSITION]:.0f}"), "S2": ("exact", f"{others.min():.0f}–{others.max():.0f}"),
            "S3": ("exact", f"{elsewhere.min():.2f}–{elsewhere.max():.2f}"),
            "S4": ("exact", f"{at_p.min():.3f}–{at_p.max():.3f}"),
            "S5": ("exact", f"{added[0].min():.0f}–{added[0].max():.0f}"),
            "S6": ("exact", f"{first.min():.1f}–{first.max():.1f}"),
            "S27": ("exact", f"{np.linalg.norm(S.clean[f'blocks.{LAYER}.hook_resid_pre'][0, POSITION]):.0f}")}
    lens = logit_lens(cache).top(1)[0][:, 0, :, 0]  # [stream, pos]
    clean_lens = logit_lens(S.clean).top(1)[0][:, 0, :, 0]  # [stream, pos]
    quote = lambda ids: ", ".join(f"`{model.to_string([int(i)])!r}`" for i in ids)  # noqa: E731
    limit_top = int(np.argmax(S.limit_logits[POSITION]))
    assert np.all(lens[LAYER:, POSITION] == limit_top), "the lens at p reads the limit's token from layer L on"
    echoes = [j for j in range(len(tokens)) if j != POSITION and lens[0, j] == tokens[j]]
    rows.update({"S7": ("exact", quote([limit_top])), "S8": ("exact", quote(clean_lens[1:, POSITION])),
                 "S9": ("exact", quote(tokens[echoes])),
                 "S10": ("exact", f"{kl_divergence(logits, S.clean_logits)[POSITION]:.3f}")})
    return rows


# ---- §3, §4: the distance to the limit against k ------------------------------------------------


def convergence_numbers(S: Setting, figures: bool) -> dict:
    model, p = S.model, S.model.params
    W_U, w_f, n, eps = op(p["unembed.W_U"]), np.max(np.abs(p["ln_final.w"])), model.cfg.d_model, model.cfg.eps
    D = np.linalg.norm(S.d - S.d.mean())
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    at_p, later, bound3 = [], [], []
    for k in KS:
        logits, cache = S.inject(k, names=[last])
        at_p.append(np.linalg.norm(logits[POSITION] - S.limit_logits[POSITION]))
        later.append(np.linalg.norm(logits[POSITION + 1:] - S.limit_logits[POSITION + 1:], axis=-1).max())
        s = cache[last][0, POSITION] - k * S.d
        Ps = np.linalg.norm(s - s.mean())
        bound3.append(W_U * w_f * np.sqrt(n) * (2 * Ps / (k * D) + n * eps / (2 * (k * D - Ps) ** 2)) if k * D > Ps else np.nan)
    at_p, later, bound3 = map(np.array, (at_p, later, bound3))
    if figures:
        from refgpt.analysis.plots import convergence_figure

        convergence_figure(KS, {f"logits at the injected position {POSITION}": at_p,
                                "§3 bound at that position (‖W_U‖·LayerNorm bound, measured ‖Ps‖)": bound3,
                                f"logits at positions {POSITION + 1}…{len(S.tokens) - 1} vs the limit model (max)": later},
                           path=OUT / "steering_convergence.png", ylabel="‖logits(k) − limit‖₂",
                           title=f"Distance to the k → ∞ limit, injecting k·d at layer {LAYER}, position {POSITION}\n({SOURCE})")
    applies = np.isfinite(bound3)
    ratio = at_p[applies] / bound3[applies]
    fit = KS >= 1e4
    slope = lambda err: np.polyfit(np.log(KS[fit]), np.log(err[fit]), 1)[0]  # noqa: E731
    rows = {"S11": ("exact", f"{ratio.min():.3f}–{ratio.max():.3f}"),
            "S12": ("exact", f"{power(KS[applies][0])} to {power(KS[applies][-1])}"),
            "S13": ("exact", minus(f"{slope(at_p):.4f}")), "S14": ("exact", minus(f"{slope(later):.4f}"))}
    for k in TABLE_KS:
        i = int(np.argmin(np.abs(KS - k)))
        shown = f"{bound3[i]:.3e}" if applies[i] else "— (k‖Pd‖ < ‖Ps‖)"
        rows[f"table k={k:g}"] = ("line", f"| {power(k)} | {at_p[i]:.3e} | {shown} | {later[i]:.3e} |")
    return rows


def propagated_numbers(S: Setting) -> dict:
    """§5: the propagated bound against the measured error after p, at k = 10², 10⁴, 10⁶."""
    batch = S.tokens[None]  # [1, pos]
    _, Y = S.model.run_with_cache(batch, fwd_hooks=injection_limit(S.model, S.d, LAYER, POSITION))
    bounds, errors = [], []
    for k in (1e2, 1e4, 1e6):
        logits, cache = S.model.run_with_cache(batch, fwd_hooks=add_vector(S.model, batch, S.d, LAYER, [POSITION], k))
        bounds.append(propagated_bound(S.model, batch, LAYER, POSITION, S.d, k, cache, Y, 0)[POSITION + 1:].max())
        errors.append(np.linalg.norm(logits[0, POSITION + 1:] - S.limit_logits[POSITION + 1:], axis=-1).max())
    listed = lambda xs: f"{sci(xs[0])}, {sci(xs[1])} and {sci(xs[2])}"  # noqa: E731
    return {"S15": ("exact", listed(bounds)), "S16": ("exact", listed(errors))}


# ---- ActAdd in its own terms: c from 1 to 10¹² ----------------------------------------------------


def actadd_numbers(figures: bool) -> dict:
    model = refgpt.load_default()
    tokens = model.to_tokens(ACTADD_TEXT, prepend_bos=True)[0]  # [pos]
    unit = steering_vector(model, ACTADD_PLUS, ACTADD_MINUS, ACTADD_LAYER, 1.0)  # Δ = act(P) − act(M), c = 1
    delta = np.linalg.norm(unit.vector, axis=-1)  # [m] ‖Δⱼ‖, row 0 (<|endoftext|> in both) is 0
    steered_rows = np.flatnonzero(delta)  # [j] the rows that move anything
    name = f"blocks.{ACTADD_LAYER}.hook_resid_pre"
    clean_logits, clean = model.run_with_cache(tokens, names=[name])
    stream = np.linalg.norm(clean[name][0, :len(delta)], axis=-1)  # [m] ‖resid_L(j)‖ of TEXT, unsteered
    limit = None
    for j in steered_rows:  # c → ∞: each steered row's LayerNorms read its direction only (§5)
        one = injection_limit(model, unit.vector[j], ACTADD_LAYER, int(j))
        limit = one if limit is None else limit + one
    limit_logits = model.run_with_hooks(tokens, fwd_hooks=limit)
    with limit:
        limit_text = model.generate(tokens, ACTADD_NEW, temperature=0, stop_at_eos=False)[len(tokens):]

    def kls(sv):
        """KL(steered ‖ unsteered) and KL(steered ‖ limit) of the next token after TEXT."""
        logits = model.run_with_hooks(tokens, fwd_hooks=sv)[-1]  # [d_vocab]
        return kl_divergence(logits, clean_logits[-1]), kl_divergence(logits, limit_logits[-1])

    def ratios(c):
        return ", ".join(f"{x:.2g}" if x < 100 else sci(x) for x in c * delta[steered_rows] / stream[steered_rows])

    unsteered = model.generate(tokens, ACTADD_NEW, temperature=0, stop_at_eos=False)[len(tokens):]
    shown = lambda ids: f"`{model.to_string(ids)!r}`"  # noqa: E731
    rows = {"S17": ("exact", ", ".join(f"{delta[j]:.1f}" for j in steered_rows)),
            "S18": ("exact", ", ".join(f"{stream[j]:.1f}" for j in steered_rows)),
            "S19": ("exact", ", ".join(f"{stream[j] / delta[j]:.2f}" for j in steered_rows)),
            "S28": ("exact", f"c/{stream[steered_rows[0]] / delta[steered_rows[0]]:.2f}"),  # the figure's axis note
            "table unsteered": ("line", f"| 0 (unsteered) | 0 | 0 | {kl_divergence(clean_logits[-1], limit_logits[-1]):.2e} | "
                                        f"{shown(unsteered)} |")}
    settled = None
    for c in ACTADD_CS:
        sv = steering_vector(model, ACTADD_PLUS, ACTADD_MINUS, ACTADD_LAYER, c)
        to_clean, to_limit = kls(sv)
        with sv:
            text = model.generate(tokens, ACTADD_NEW, temperature=0, stop_at_eos=False)[len(tokens):]
        near = f"{to_limit:.2e}" if to_limit >= 1e-15 else "< 10⁻¹⁵"  # below that: rounding of the probabilities
        rows[f"table c={c:g}"] = ("line", f"| {power(c) if c >= 100 else f'{c:g}'} | {ratios(c)} | {to_clean:.4f} | "
                                          f"{near} | {shown(text)} |")
        same = np.array_equal(text, limit_text)
        settled = c if same and settled is None else (settled if same else None)
    rows["table limit"] = ("line", f"| ∞ (limit model) | ∞ | {kl_divergence(limit_logits[-1], clean_logits[-1]):.4f} | 0 | "
                                   f"{shown(limit_text)} |")
    rows["S20"] = ("exact", power(settled))
    curves = np.array([kls(steering_vector(model, ACTADD_PLUS, ACTADD_MINUS, ACTADD_LAYER, c)) for c in ACTADD_CURVE])
    curve_clean, curve_limit = curves[:, 0], curves[:, 1]  # [c] each
    # KL to the limit falls like 1/c² until it reaches float64 rounding of the probabilities
    # (≈ 10⁻¹⁶); fitted over 10³ ≤ c ≤ 10⁶, where it stands far above that.
    fit = (ACTADD_CURVE >= 1e3) & (ACTADD_CURVE <= 1e6)
    rows["S21"] = ("exact", minus(f"{np.polyfit(np.log(ACTADD_CURVE[fit]), np.log(curve_limit[fit]), 1)[0]:.3f}"))
    rows["S26"] = ("exact", sci(ACTADD_CURVE[np.flatnonzero(curve_limit <= 1e-15)[0]], 1))  # the curve's c: 10^(j/2)
    curve_limit = np.where(curve_limit > 1e-15, curve_limit, np.nan)  # below: rounding, left out
    if figures:
        from refgpt.analysis.plots import convergence_figure

        fig = convergence_figure(ACTADD_CURVE, {"KL(steered ‖ unsteered), next token after the prompt": curve_clean,
                                                "KL(steered ‖ the c → ∞ limit), same position (until rounding, 10⁻¹⁵)":
                                                    curve_limit},
                                 path=None, ylabel="KL divergence (nats)",
                                 xlabel=f"ActAdd coefficient c (c·‖Δ‖ / ‖stream‖ = c / {stream[steered_rows[0]] / delta[steered_rows[0]]:.2f} "
                                        f"at position {steered_rows[0]})",
                                 guide_power=2, symbol="c",
                                 title=f"c·(act({ACTADD_PLUS!r}) − act({ACTADD_MINUS!r})) at layer {ACTADD_LAYER}, "
                                       f"text {ACTADD_TEXT!r}\n({SOURCE})")
        ax = fig.axes[0]
        ax.axvline(settled, color="tab:red", ls="--", lw=1.2,
                   label=f"from c = {settled:g} on (of the c in the table), the greedy text is the limit's")
        ax.legend(fontsize=8, loc="lower left")
        fig.savefig(str(OUT / "actadd_coefficient.png"))
    return rows


# ---- Lenses: the ActAdd vector under the tuned lens -----------------------------------------------


def tuned_lens_numbers(figures: bool) -> dict:
    """The next token after ACTADD_TEXT read by the shipped tuned lens at every stream, for c from
    0 to 10⁶ and in the c → ∞ limit model, with KL(lens at c ‖ lens in the limit) per stream."""
    from refgpt.train.tuned_lens import text_windows

    model = refgpt.load_default()
    lens = TunedLens.load(model)
    tokens = model.to_tokens(ACTADD_TEXT, prepend_bos=True)[0]  # [pos]
    unit = steering_vector(model, ACTADD_PLUS, ACTADD_MINUS, ACTADD_LAYER, 1.0)
    steered_rows = np.flatnonzero(np.linalg.norm(unit.vector, axis=-1))
    limit = None
    for j in steered_rows:
        one = injection_limit(model, unit.vector[j], ACTADD_LAYER, int(j))
        limit = one if limit is None else limit + one

    def read(hooks=None):
        """The tuned lens's logits at the last position, per stream: [stream, d_vocab]."""
        if hooks is None:
            return lens.run(tokens).logits[:, 0, -1]
        with hooks:
            return lens.run(tokens).logits[:, 0, -1]

    at_limit = read(limit)  # [stream, d_vocab]
    quote = lambda i: f"`{model.to_string([int(i)])!r}`"  # noqa: E731

    def row(name, logits):
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        kl = kl_divergence(logits, at_limit)  # [stream]
        cells = [f"{quote(np.argmax(p))} {p.max():.3f}" + (f" ({sci(k)})" if k >= 1e-15 else " (< 10⁻¹⁵)" if k > 0 else "")
                 for p, k in zip(probs, kl)]
        return ("line", f"| {name} | " + " | ".join(cells) + " |")

    rows = {"table tuned c=0": row("0 (unsteered)", read())}
    settled = None
    for c in TUNED_CS:
        logits = read(steering_vector(model, ACTADD_PLUS, ACTADD_MINUS, ACTADD_LAYER, c))
        rows[f"table tuned c={c:g}"] = row(power(c) if c >= 100 else f"{c:g}", logits)
        same = np.array_equal(logits.argmax(-1), at_limit.argmax(-1))
        settled = c if same and settled is None else (settled if same else None)
    rows["table tuned limit"] = row("∞ (limit model)", at_limit)
    first_moved = ACTADD_LAYER + 1  # the last position sees the steered rows through attention from block L on
    curves = np.array([kl_divergence(read(steering_vector(model, ACTADD_PLUS, ACTADD_MINUS, ACTADD_LAYER, c)), at_limit)
                       for c in TUNED_CURVE])  # [c, stream]
    slopes = [np.polyfit(np.log(TUNED_CURVE), np.log(curves[:, M]), 1)[0] for M in range(first_moved, curves.shape[1])]
    windows, _ = text_windows(model.tokenizer, HELD_OUT.read_text(encoding="utf-8"), model.cfg.n_ctx)
    windows = windows[:HELD_OUT_WINDOWS]
    held = evaluate_lenses(model, windows, lens)
    logit_kl, tuned_kl = held.metrics["logit"]["kl"], held.metrics["tuned"]["kl"]
    rows.update({
        "S29": ("exact", power(settled)),
        "S30": ("exact", minus(f"{min(slopes):.3f} to {max(slopes):.3f}")),
        "S31": ("exact", ", ".join(f"{a:.2f} → {b:.2f}" for a, b in zip(logit_kl, tuned_kl))),
        "S32": ("exact", f"{len(windows) * model.cfg.n_ctx:,}"),
    })
    if figures:
        from refgpt.analysis.plots import lens_figure

        eot = model.tokenizer.eot_token
        decode = lambda i: printable("<eot>" if i == eot else model.to_string([i]), 6)  # noqa: E731
        with steering_vector(model, ACTADD_PLUS, ACTADD_MINUS, ACTADD_LAYER, 1e2):
            result = lens.run(tokens)
        lens_figure(result, labels=[decode(int(t)) for t in tokens], decode=decode, path=OUT / "actadd_tuned_lens.png",
                    title=f"Tuned lens, c = 100, {ACTADD_PLUS!r} − {ACTADD_MINUS!r} at layer {ACTADD_LAYER}\n"
                          "(embedded model and its shipped lens)")
    return rows


# ---- §7: how large k can be -------------------------------------------------------------------------


def finite_and_limit(S: Setting, k) -> bool:
    """Does the whole model, with k·d injected, give finite logits and, at p and after it, the
    limit model's top tokens? (A forward pass that overflows raises a RefGPTError naming where.)"""
    with warnings.catch_warnings(), np.errstate(over="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        steer = add_vector(S.model, S.tokens, S.d, LAYER, [POSITION], k)  # refuses a k·d the dtype cannot hold
        try:
            logits = S.model.run_with_hooks(S.tokens, fwd_hooks=steer)
        except refgpt.RefGPTError:  # the forward pass overflowed
            return False
    return bool(np.all(np.isfinite(logits))) and np.array_equal(
        logits[POSITION:].argmax(-1), S.limit_logits[POSITION:].argmax(-1))


def l1_edge(S: Setting) -> float:
    """The k at which ‖k·d‖₁ = 0.99·(largest finite number): layernorm.md §6's sufficient condition."""
    return 0.99 * float(np.finfo(S.model.dtype).max) / float(np.abs(S.d).sum())


def threshold_numbers(S64: Setting, S32: Setting) -> dict:
    edge64, edge32 = l1_edge(S64), l1_edge(S32)
    largest = float(np.finfo(np.float64).max)
    ok = lambda S, k, text: text if finite_and_limit(S, k) else f"FAILS at {k:.3g}"  # noqa: E731
    # Where float32 actually fails: a bisection on log k between the sufficient edge and 10⁴⁰,
    # to 0.2% (the page quotes one digit). Machine-dependent: it is where NumPy's summation of
    # the mean first overflows, and the order NumPy sums in may differ with the build.
    lo, hi = np.log(edge32), np.log(1e40)
    for _ in range(12):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if finite_and_limit(S32, float(np.exp(mid))) else (lo, mid)
    return {"S22": ("exact", f"{np.abs(S64.d).sum():.2f}"),
            "S23": ("exact", ok(S64, largest, sci(largest))),
            "S24": ("exact", ok(S32, edge32, sci(edge32))),
            "S25": ("approx", float(np.exp(lo)))}


def check(rows, page: str) -> list[str]:
    """check_page, plus the *approx* rows: a machine-dependent number the page quotes, marked
    "measured", which must be within a factor 2 of this machine's measurement."""
    import re

    problems = check_page({name: row for name, row in rows.items() if row[0] != "approx"}, page)
    for name, (kind, value) in rows.items():
        if kind == "approx":
            quoted = re.search(r"(\d(?:\.\d+)?)·10([⁰¹²³⁴⁵⁶⁷⁸⁹]+)\s+\(" + name + r", measured", page)
            if not quoted:
                problems.append(f"{name}: the page does not quote it as 'x·10ⁿ ({name}, measured …'")
                continue
            exponent = int(quoted.group(2).translate(str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")))
            stated = float(quoted.group(1)) * 10.0**exponent
            if not 0.5 <= stated / value <= 2:
                problems.append(f"{name}: the page states {stated:.2g}, this machine measures {value:.2g}")
    return problems


# ---- The seed's two figures: one command each ----------------------------------------------------------

SEED_TEXT = "My lord, I have a letter from the king, and he doth bid me tell you that he will come to you anon"
SEED_COMMANDS = {  # the page prints these lines; each writes its figure with --plot
    "steering_seed_norms.png": f'refgpt steer "{SEED_TEXT}" --plus Love --minus Hate --layer 1 --positions 20 '
                               '--coeff 1 --coeff 1e6 --bos --plot norms.png',
    "steering_seed_tuned_lens.png": f'refgpt steer "{SEED_TEXT}" --plus Love --minus Hate --layer 1 --positions 20 '
                                    '--coeff 1 --coeff 100 --coeff 1e6 --lens tuned --bos --plot lens.png',
}


def seed_arguments(command: str, plot) -> list[str]:
    """The command's arguments after ``refgpt``, with --plot's file replaced by ``plot``."""
    import shlex

    args = shlex.split(command)[1:]
    args[args.index("--plot") + 1] = str(plot)
    return args


def seed_figures(out=OUT) -> dict:
    """Run SEED_COMMANDS as the command line runs them (refgpt.cli.main), each figure into ``out``;
    returns each command's --json answer."""
    import contextlib
    import io
    import json

    from refgpt.cli import main as refgpt_main

    answers = {}
    for name, command in SEED_COMMANDS.items():
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            status = refgpt_main(seed_arguments(command, Path(out) / name) + ["--json"])
        assert status == 0, f"{command}: exit status {status}"
        answers[name] = json.loads(printed.getvalue())
    return answers


def seed_numbers() -> dict:
    """What the page says of the seed's figures, from the Python API (the commands draw them):
    ‖Δ‖, the stream at position 20 at c = 10⁶, what each block from 1 on adds there relative to
    it, and how far every other position's stream norms move from the clean run's at c = 10², 10⁶."""
    from refgpt.analysis.measurements import norm, streams

    model = refgpt.load_default()
    tokens = model.to_tokens(SEED_TEXT, prepend_bos=True)[0]  # [pos]
    difference, _, _ = last_token_difference(model, "Love", "Hate", 1)  # [d_model]
    _, clean = model.run_with_cache(tokens)
    clean_norms = norm(streams(clean)[:, 0])  # [stream, pos]
    others = np.delete(np.arange(len(tokens)), 20)
    moved = {}
    for c in (1e2, 1e6):
        _, cache = model.run_with_cache(tokens, fwd_hooks=add_vector(model, tokens, difference, 1, [20], coeff=c))
        x = streams(cache)[:, 0]  # [stream, pos, d_model]
        norms = norm(x)  # [stream, pos]
        moved[c] = np.abs(norms[:, others] / clean_norms[:, others] - 1).max()
        if c == 1e6:
            change = norm(x[2:, 20].astype(np.float64) - x[1:-1, 20]) / norms[1:-1, 20]  # [block 1…] at position 20
            at_20 = norms[-1, 20]
    return {"S33": ("exact", f"{len(tokens)}"), "S34": ("exact", f"{np.linalg.norm(difference):.1f}"),
            "S35": ("exact", sci(at_20)), "S36": ("exact", sci(change.max())),
            "S37": ("exact", f"{100 * moved[1e2]:.0f}% and {100 * moved[1e6]:.0f}%")}


def numbers(figures: bool = False) -> dict:
    if figures:
        OUT.mkdir(exist_ok=True)
        seed_figures()
    S = Setting()
    rows = {**stream_numbers(S, figures), **convergence_numbers(S, figures), **propagated_numbers(S),
            **actadd_numbers(figures), **tuned_lens_numbers(figures), **threshold_numbers(S, Setting("float32")),
            **seed_numbers()}
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-figures", action="store_true", help="print the numbers only")
    args = parser.parse_args(argv)
    rows = numbers(figures=not args.no_figures)
    width = max(map(len, rows))
    for name, (kind, value) in rows.items():
        shown = {"bound": lambda v: f"< {bound(v)}  (measured {v:.1e})",
                 "approx": lambda v: f"{sci(v, 1)}  (measured on this machine)"}.get(kind, str)(value)
        print(f"{name:<{width}} {kind:<6} {shown}")


if __name__ == "__main__":
    main()
