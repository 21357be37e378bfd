"""Make the figures of docs/steering.md from the embedded model: ``python docs/make_steering_figures.py``.

The embedded model is a small GPT-2 trained on Shakespeare (weights/README.md). The *sizes* in
these figures — stream norms, distances to the limit, the 1/k slope — follow from LayerNorm alone
and would look the same on any GPT-2; the tokens are this model's. When the default model changes,
run this script again: every figure and the printed numbers are re-made.

Writes docs/figures/steering_resid_norms.png, steering_lens.png, steering_convergence.png and
attribution_bars.png, and prints the numbers quoted in docs/steering.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import refgpt
from refgpt.analysis.attribution import attribute
from refgpt.analysis.interventions import add_vector, injection_limit, steering_vector
from refgpt.analysis.lens import logit_lens
from refgpt.analysis.measurements import injection_ratio, kl_divergence
from refgpt.analysis.plots import attribution_bars, convergence_figure, lens_figure, printable, resid_norm_figure, token_labels

OUT = Path(__file__).parent / "figures"
PROMPT = "The cat sat on the mat."
LAYER, POSITION = 1, 5  # inject into the stream entering block 1, at the 6th token


def main():
    OUT.mkdir(exist_ok=True)
    model = refgpt.load_default()
    tokens = model.to_tokens(PROMPT, prepend_bos=True)  # [pos]
    labels = token_labels(model, tokens)
    eot = model.tokenizer.eot_token
    decode = lambda i: printable("<eot>" if i == eot else model.to_string([i]), 6)  # noqa: E731

    # The direction: an ActAdd vector's row 1 (the first token after <|endoftext|>: "Love" against
    # "H", the first of "Hate"'s two tokens), made unit.
    sv = steering_vector(model, "Love", "Hate", LAYER)
    d = sv.vector[1] / np.linalg.norm(sv.vector[1])  # [d_model]
    clean_logits, clean = model.run_with_cache(tokens)
    k_fig = 1e3
    logits, cache = model.run_with_cache(tokens, fwd_hooks=add_vector(model, tokens, d, LAYER, [POSITION], k_fig))
    source = "embedded model, trained on Shakespeare"
    resid_norm_figure(cache, POSITION, labels=labels, clean_cache=clean, path=OUT / "steering_resid_norms.png",
                      title=f"‖resid‖ after adding {k_fig:g}·d at layer {LAYER}, position {POSITION}\n({source})")
    lens_figure(logit_lens(cache), labels=labels, decode=decode, position=POSITION, path=OUT / "steering_lens.png",
                title=f"Logit lens after the injection: from stream {LAYER}_pre on, position {POSITION} "
                      f"(outlined) predicts its limit\n({source}; colour = top-token probability)")

    norms = np.linalg.norm(cache["blocks.3.hook_resid_post"][0], axis=-1)
    print(f"stream norms at k={k_fig:g}: injected position {norms[POSITION]:.4g}, others "
          f"{np.delete(norms, POSITION).min():.3g}..{np.delete(norms, POSITION).max():.3g}")
    print("injection ratio ‖kd‖/‖stream‖ per stream:", np.round(injection_ratio(cache, k_fig * d, [POSITION])[:, 0], 6))
    print("KL(steered ‖ clean) per position:", np.array2string(kl_divergence(logits, clean_logits), precision=3))
    # The figure's bottom panel: what each block adds, relative to the stream it reads.
    added = np.array([np.linalg.norm(cache[f"blocks.{M}.hook_resid_post"][0] - cache[f"blocks.{M}.hook_resid_pre"][0], axis=-1)
                      / np.linalg.norm(cache[f"blocks.{M}.hook_resid_pre"][0], axis=-1)
                      for M in range(model.cfg.n_layers)])  # [block, pos]
    print(f"‖block output‖/‖stream read‖: block 0 {added[0].min():.2g}..{added[0].max():.2g}; blocks "
          f"{LAYER}…{model.cfg.n_layers - 1} at the injected position {added[LAYER:, POSITION].min():.2g}.."
          f"{added[LAYER:, POSITION].max():.2g}, elsewhere {np.delete(added[LAYER:], POSITION, 1).min():.2g}.."
          f"{np.delete(added[LAYER:], POSITION, 1).max():.2g}")
    lens_ids = logit_lens(cache).top(1)[0][:, 0, :, 0]  # [stream, pos]
    clean_ids = logit_lens(clean).top(1)[0][:, 0, :, 0]  # [stream, pos]
    print(f"lens top token at position {POSITION}, stream by stream: steered",
          [decode(i) for i in lens_ids[:, POSITION]], "clean", [decode(i) for i in clean_ids[:, POSITION]])
    print("lens top tokens elsewhere (steered run), stream by stream:",
          [[decode(i) for i in row] for row in np.delete(lens_ids, POSITION, 1)], "inputs:", labels)

    # Convergence: distance to the k → ∞ limit at the injected position and after it.
    limit_logits = model.run_with_hooks(tokens, fwd_hooks=injection_limit(model, d, LAYER, POSITION))  # [pos, d_vocab]
    print(f"the limit's top token at position {POSITION}: {decode(int(np.argmax(limit_logits[POSITION])))!r}")
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
                       title=f"Distance to the k → ∞ limit, injecting k·d at layer {LAYER}, position {POSITION}\n({source})")
    for k, a, b, l in zip(ks[::4], at_p[::4], bound[::4], later[::4], strict=True):
        print(f"k = {k:9.3g}   at p: {a:.3e}  (bound {b:.3e})   later positions: {l:.3e}")
    ratio = np.array(at_p) / np.array(bound)
    print(f"at p / §3 bound, over the k where the bound applies (k‖Pd‖ > ‖Ps‖): {np.nanmin(ratio):.3f}..{np.nanmax(ratio):.3f}")

    # §5's propagated bound on the positions after p (tests/analysis/test_steering_limit.py), against the
    # measured error, both times k: the bound's rate is right, its size is not.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_steering_limit import propagated_bound

    batch = tokens[None]  # [1, pos]
    _, Y = model.run_with_cache(batch, fwd_hooks=injection_limit(model, d, LAYER, POSITION))
    for k in (1e2, 1e4, 1e6):
        logits_s, S = model.run_with_cache(batch, fwd_hooks=add_vector(model, batch, d, LAYER, [POSITION], k))
        b = propagated_bound(model, batch, LAYER, POSITION, d, k, S, Y, 0)[POSITION + 1:]  # [later pos]
        err = np.linalg.norm(logits_s[0, POSITION + 1:] - limit_logits[POSITION + 1:], axis=-1)  # [later pos]
        print(f"k = {k:7.0e}   positions after p: propagated bound {b.min():.2e}..{b.max():.2e}, "
              f"measured error (max) {err.max():.2e}")

    # Attribution bars of the clean run's top next token at the last position.
    top = int(np.argmax(clean_logits[-1]))
    attribution = attribute(clean, top, granularity="head")
    print(f"clean run's top next token after {PROMPT!r}: {model.to_string([top])!r}, logit "
          f"{attribution.logit[0, -1]:.4f}; largest contributions:",
          [(label, round(float(value), 3)) for label, value in attribution.top(5)])
    attribution_bars(attribution, pos=-1, k=12, path=OUT / "attribution_bars.png",
                     title=f"Contributions to the logit of {decode(top)!r} after {PROMPT!r}\n({source}, "
                           f"sum = logit {attribution.logit[0, -1]:.4f})")


if __name__ == "__main__":
    main()
