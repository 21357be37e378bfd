"""Make the figures of docs/steering.md from the embedded model: ``python docs/make_steering_figures.py``.

The embedded model is UNTRAINED (a seeded random initialisation, see weights/make_default.py), so the
tokens in these figures mean nothing; the *sizes* — stream norms, distances to the limit, the 1/k
slope — are what the figures show, and they follow from LayerNorm alone. When a trained default
model replaces it, run this script again: every figure and the printed numbers are re-made.

Writes docs/figures/steering_resid_norms.png, steering_lens.png, steering_convergence.png and
attribution_bars.png, and prints the numbers quoted in docs/steering.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import refgpt
from refgpt.attribution import attribute
from refgpt.interventions import add_vector, injection_limit, steering_vector
from refgpt.lens import logit_lens
from refgpt.measurements import injection_ratio, kl_divergence
from refgpt.plots import attribution_bars, convergence_figure, lens_figure, printable, resid_norm_figure, token_labels

OUT = Path(__file__).parent / "figures"
PROMPT = "The cat sat on the mat."
LAYER, POSITION = 1, 5  # inject into the stream entering block 1, at the 6th token


def main():
    OUT.mkdir(exist_ok=True)
    model = refgpt.load_default()
    tokens = model.to_tokens(PROMPT, prepend_bos=True)  # [pos]
    labels = token_labels(model, tokens)
    decode = lambda i: printable("<eot>" if i == 256 else model.to_string([i]), 5)  # noqa: E731

    # The direction: an ActAdd vector's row ("Love" − "Hate" at the position of L/H), made unit.
    sv = steering_vector(model, "Love", "Hate", LAYER)
    d = sv.vector[1] / np.linalg.norm(sv.vector[1])  # [d_model]
    clean_logits, clean = model.run_with_cache(tokens)
    k_fig = 1e3
    logits, cache = model.run_with_cache(tokens, fwd_hooks=add_vector(model, tokens, d, LAYER, [POSITION], k_fig))
    untrained = "UNTRAINED embedded model"
    resid_norm_figure(cache, POSITION, labels=labels, clean_cache=clean, path=OUT / "steering_resid_norms.png",
                      title=f"‖resid‖ after adding {k_fig:g}·d at layer {LAYER}, position {POSITION} ({untrained})")
    lens_figure(logit_lens(cache), labels=labels, decode=decode, position=POSITION, path=OUT / "steering_lens.png",
                title=f"Logit lens after the injection: from stream {LAYER}_pre on, position {POSITION} "
                      f"(outlined) predicts its limit\n({untrained}; colour = top-token probability)")

    norms = np.linalg.norm(cache["blocks.3.hook_resid_post"][0], axis=-1)
    print(f"stream norms at k={k_fig:g}: injected position {norms[POSITION]:.4g}, others "
          f"{np.delete(norms, POSITION).min():.3g}..{np.delete(norms, POSITION).max():.3g}")
    print("injection ratio ‖kd‖/‖stream‖ per stream:", np.round(injection_ratio(cache, k_fig * d, [POSITION])[:, 0], 6))
    print("KL(steered ‖ clean) per position:", np.array2string(kl_divergence(logits, clean_logits), precision=3))

    # Convergence: distance to the k → ∞ limit at the injected position and after it.
    limit_logits = model.run_with_hooks(tokens, fwd_hooks=injection_limit(model, d, LAYER, POSITION))  # [pos, d_vocab]
    ks = np.logspace(0, 9, 19)
    at_p, later, bound = [], [], []
    p = model.params
    W_U, w_f, n, eps = np.linalg.norm(p["unembed.W_U"], 2), np.max(np.abs(p["ln_final.w"])), model.cfg.d_model, model.cfg.eps
    D = np.linalg.norm(d - d.mean())
    for k in ks:
        lg, c = model.run_with_cache(tokens, names=["blocks.3.hook_resid_post"],
                                     fwd_hooks=add_vector(model, tokens, d, LAYER, [POSITION], k))
        at_p.append(np.linalg.norm(lg[POSITION] - limit_logits[POSITION]))
        later.append(np.linalg.norm(lg[POSITION + 1:] - limit_logits[POSITION + 1:], axis=-1).max())
        s = c["blocks.3.hook_resid_post"][0, POSITION] - k * d
        Ps = np.linalg.norm(s - s.mean())
        bound.append(W_U * w_f * np.sqrt(n) * (2 * Ps / (k * D) + n * eps / (2 * (k * D - Ps) ** 2)) if k * D > Ps else np.nan)
    convergence_figure(ks, {f"logits at the injected position {POSITION}": at_p,
                            "§3 bound at that position (‖W_U‖·LayerNorm bound, measured ‖Ps‖)": bound,
                            f"logits at positions {POSITION + 1}…{len(tokens) - 1} vs the limit model (max)": later},
                       path=OUT / "steering_convergence.png", ylabel="‖logits(k) − limit‖₂",
                       title=f"Distance to the k → ∞ limit, injecting k·d at layer {LAYER}, position {POSITION}\n({untrained})")
    for k, a, b, l in zip(ks[::4], at_p[::4], bound[::4], later[::4], strict=True):
        print(f"k = {k:9.3g}   at p: {a:.3e}  (bound {b:.3e})   later positions: {l:.3e}")

    # Attribution bars of the clean run's top next token at the last position.
    top = int(np.argmax(clean_logits[-1]))
    attribution = attribute(clean, top, granularity="head")
    attribution_bars(attribution, pos=-1, k=12, path=OUT / "attribution_bars.png",
                     title=f"Contributions to the logit of {decode(top)!r} after {PROMPT!r}\n({untrained}, "
                           f"sum = logit {attribution.logit[0, -1]:.4f})")


if __name__ == "__main__":
    main()
