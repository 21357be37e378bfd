"""Every number in docs/sae.md (and the shipped SAE's numbers in weights/README.md), computed here.

    python docs/make_sae_numbers.py

Prints one row per number, ``S1 <text>``; the pages quote each as ``<text> (S1)``.
tests/sae/test_default_sae.py reruns this and checks both pages. The numbers are on the embedded
model (weights/default/) and its SAE (weights/default_sae/), in float64.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import refgpt
from refgpt.files.default_model import default_sae_path
from refgpt.sae.attribution import attribute_features, feature_logits, hooks_needed
from refgpt.sae.evaluation import diagnose, token_rows

REPO = Path(__file__).resolve().parents[1]
MACBETH = REPO / "tests" / "data" / "macbeth_act1.txt"
TEXT, TARGET = "To be, or not to", " be"


def numbers() -> dict[str, str]:
    model = refgpt.load_default()
    sae = refgpt.load_sae(default_sae_path())
    rows = {}
    held = diagnose(model, sae, token_rows(model, sae, documents=[MACBETH.read_text("utf-8")])).measures
    rows["S1"] = f"{held.n:,}"
    rows["S2"] = f"{held.l0:.2f}"
    rows["S3"] = f"{held.explained_variance:.4f}"
    rows["S4"] = f"{held.dead}"

    tokens = model.to_tokens(TEXT, prepend_bos=False)  # [1, pos]: as `refgpt attribute` runs it
    logits, cache = model.run_with_cache(tokens, names=hooks_needed(model, sae))
    result = attribute_features(cache, sae, TARGET, logits=logits)
    column = result.values[:, 0, -1]  # [component]
    features = [(label, float(v)) for label, v in zip(result.labels, column) if label.startswith("F") and v != 0]
    features.sort(key=lambda lv: -abs(lv[1]))
    rows["S5"] = f"{len(features)}"
    rows["S6"] = f"{sae.d_sae}"
    label, value = features[0]
    rows["S7"] = label
    rows["S8"] = f"{value:+.4f}"
    rows["S9"] = f"{float(result['sae_error'][0, -1]):+.4f}"
    rows["S10"] = f"{float(result['b_dec'][0, -1]):+.4f}"
    rows["S11"] = f"{float(result.logit[0, -1]):+.6f}"
    rows["S12"] = f"{result.check(relative=True):.0e}"  # a bound: the page states a power of ten above it
    rows["S13"] = f"{sum(v for _, v in features):+.4f}"

    effects = feature_logits(model, sae, int(label[1:]))  # [d_vocab]
    order = np.argsort(-effects, kind="stable")
    show = lambda ids: ", ".join(repr(model.tokenizer.decode([int(i)])) for i in ids)  # noqa: E731
    rows["S14"] = show(order[:5])
    rows["S15"] = show(order[::-1][:5])
    acts = result.features[0, :, int(label[1:])]  # [pos]
    rows["S16"] = ", ".join(f"{a:.2f}" for a in acts)
    return rows


def main() -> int:
    for name, text in numbers().items():
        print(name, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
