"""The explorer page's SAE view: the target's logit split by feature, and what each feature does.

``refgpt explore TEXT --sae DIR|default`` (``refgpt.sae.explore(model, text, sae)``) adds
to the page's document the key ``"sae"`` built here (its schema in docs/explorer.md):

- the attribution of the target's logit at every position by ``attribute_features`` (head
  granularity, so the page's by-layer / by-head switch works as for the plain waterfall): the rows
  that are not features (every component the SAE's hook does not cover, b_dec, sae_error, and
  sae_mean / W_skip where the SAE has them) in full, and per position only the active features —
  the FEATURES_SHOWN of largest |contribution|, the others' contributions summed in one number
  ("rest") so the page's sum stays the logit exactly (an inactive feature contributes exactly 0);
- for every feature the page names: its activation at every position where it is active (sparse;
  the one home of the activations, the list at a position reads them there), and its top ± logits (``feature_logits``, LOGITS_SHOWN each way).

It sits in the sae room (above analysis, CONTRIBUTING's layers): ``explore`` hands it to the
explorer (refgpt.analysis.explorer) as the builder of the view, so the explorer never imports it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..analysis import explorer
from ..analysis.explorer import _floats, _token_strings
from ..errors import RefGPTError
from ..files.default_model import default_sae_path
from .attribution import attribute_features, feature_logits
from .in_model import check_fits, check_processing

FEATURES_SHOWN = 24  # active features per position shown as bars; the rest summed in one number
LOGITS_SHOWN = 8  # tokens a feature promotes (and suppresses) the most


def explore(model, text, sae=None, **options):
    """``refgpt.analysis.explore(model, text, **options)`` with, for an SAE (``load_sae(DIR)``), the
    page's SAE view; without one the plain page."""
    if sae is None:
        return explorer.explore(model, text, **options)
    return explorer.explore(model, text, sae=lambda model, cache, target_id, logits:
                            sae_view(model, sae, cache, target_id, logits), **options)


def sae_view(model, sae, cache, target_id: int, logits) -> dict:
    """The page's ``"sae"`` entry for ``sae`` on the pass in ``cache`` (logits [pos, d_vocab])."""
    check_fits(model, sae)
    check_processing(model, sae)
    a = attribute_features(cache, sae, target_id, granularity="head", logits=logits[None])
    first = a.labels.index("F0")  # the features' rows are F0 … F{d_sae−1}, in order
    contributions = a.values[first:first + sae.d_sae, 0]  # [d_sae, pos]
    rows = [i for i in range(len(a.labels)) if not first <= i < first + sae.d_sae]
    f = a.features[0]  # [pos, d_sae]
    positions, named = [], set()
    for j in range(f.shape[0]):
        active = np.flatnonzero(f[j])  # [l0]
        order = active[np.argsort(-np.abs(contributions[active, j]), kind="stable")]  # largest |contribution| first
        shown, rest = order[:FEATURES_SHOWN], order[FEATURES_SHOWN:]
        named.update(shown.tolist())
        positions.append({"features": shown.tolist(), "contribution": _floats(contributions[shown, j]),
                          "rest": float(contributions[rest, j].sum()), "n_rest": len(rest)})
    named = sorted(named)
    direct = feature_logits(model, sae, named)  # [feature, d_vocab]
    features = {}
    for i, row in zip(named, direct, strict=True):
        order = np.argsort(-row, kind="stable")  # [d_vocab] the largest first
        top, bottom = order[:LOGITS_SHOWN], order[::-1][:LOGITS_SHOWN]  # [LOGITS_SHOWN] each
        features[str(i)] = {"activation": [[int(p), float(f[p, i])] for p in np.flatnonzero(f[:, i])],  # [active pos]
                            "top": {"ids": top.tolist(), "values": _floats(row[top])},
                            "bottom": {"ids": bottom.tolist(), "values": _floats(row[bottom])}}
    return {"source": _sae_source(sae), "architecture": sae.architecture, "hook": sae.hook_name_out,
            "d_sae": sae.d_sae, "features_shown": FEATURES_SHOWN, "logits_shown": LOGITS_SHOWN,
            "token_strings": {str(t): _token_strings(model, [t])[0] for t in sorted(_logit_ids(features))},
            "labels": [a.labels[i] for i in rows], "values": [_floats(a.values[i, 0]) for i in rows],  # [row][pos]
            "l0": [int(n) for n in (f != 0).sum(-1)], "positions": positions, "features": features}


def _logit_ids(features):
    return {t for feature in features.values() for side in ("top", "bottom") for t in feature[side]["ids"]}


def _sae_source(sae):
    """"shipped" for the embedded model's SAE, else the folder's own name (no machine path), or None."""
    if sae.source is None:
        return None
    try:
        if Path(sae.source).resolve() == Path(default_sae_path()).resolve():
            return "shipped"
    except RefGPTError:  # no shipped SAE installed
        pass
    return Path(sae.source).name
