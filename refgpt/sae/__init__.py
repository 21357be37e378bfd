"""Sparse autoencoders and transcoders, SAELens's, without torch (docs/sae.md).

- ``refgpt.sae.sae``: the SAE and its encode/decode, every architecture SAELens 6.x saves
  (standard, topk, jumprelu, gated, and the transcoders);
- ``refgpt.sae.folder``: SAELens's folders, read (``load_sae``) and written (``save_sae``);
- ``refgpt.sae.in_model``: an SAE at its hook in a model, spliced in or with the exact error term;
  the model's weight processing checked against the one the SAE was trained on;
- ``refgpt.sae.attribution``: exact feature attribution of a logit;
- ``refgpt.sae.evaluation``: L0, explained variance and dead features measured on text;
- ``refgpt.sae.page``: the explorer page with an SAE view (``explore(model, text, sae)``).

The room sits above ``refgpt.analysis`` (its attribution is analysis's, with the SAE's features as
components), beside ``refgpt.sweep``.
"""

from .folder import load_sae, save_sae
from .page import explore
from .sae import SAE

__all__ = ["SAE", "explore", "load_sae", "save_sae"]
