"""Analysis: what researchers build on the forward pass and its cache.

- ``attribution`` — a target logit split into parts that sum to it exactly, every constant labelled.
- ``interventions`` — ActAdd steering vectors and activation patching, as hooks.
- ``measurements`` — KL divergences, norms and injection ratios of steered runs.
- ``lens`` — the logit lens (recomputed and cached-scale) and the tuned lens (``TunedLens``, in the
  tuned-lens package's files), and their per-layer evaluation.
- ``plots`` — figures of the above (needs the optional ``plot`` extra, matplotlib).
- ``explorer`` — one offline web page of a forward pass (``explore``); plain canvas and SVG, no extra.

Everything here imports the core (``refgpt.model``, ``refgpt.tl.cache``, ``refgpt.tl.decomposition``, …)
and nothing above it; the core never imports this package.
"""

from .explorer import Explorer, explore

__all__ = ["Explorer", "explore"]
