"""The activation cache: what one forward pass computed, by hook name.

``cache[name]`` is a NumPy array under TransformerLens's hook name and shape, always with a batch
axis. It holds only what was asked for, never changes after the forward pass (its arrays are
read-only views), and knows the model it came from (``cache.model``), so the decomposition and
lens code can find the weights that go with it.

Short keys work as in TransformerLens: ``cache["resid_pre", 3]`` is ``blocks.3.hook_resid_pre``,
``cache["pattern", -1]`` is the last block's attention pattern, ``cache["scale"]`` is
``ln_final.hook_scale`` and ``cache["scale", 3, "ln1"]`` is ``blocks.3.ln1.hook_scale``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from . import decomposition
from .errors import MissingActivation
from .hook_points import ATTN_HOOKS, LN_HOOKS, MLP_HOOKS

_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q",
            "value": "v", "mlp_pre": "pre", "mlp_post": "post"}
_ATTN = {h.removeprefix("hook_") for h in ATTN_HOOKS}  # q, k, v, attn_scores, pattern, z
_MLP = {h.removeprefix("hook_") for h in MLP_HOOKS}  # pre, post
_LN = {h.removeprefix("hook_") for h in LN_HOOKS}  # mean, scale, normalized
_LAYER_TYPES = {"a": "attn", "attention": "attn", "m": "mlp", "b": "", "block": "", "blocks": ""}


def act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """A short activation name → the full hook name, as TransformerLens's ``get_act_name``.

    ``act_name("resid_pre", 3)`` → ``blocks.3.hook_resid_pre``; ``act_name("k6")`` →
    ``blocks.6.attn.hook_k``; ``act_name("scale")`` → ``ln_final.hook_scale``;
    ``act_name("scale", 4, "ln1")`` → ``blocks.4.ln1.hook_scale``; a full name comes back as is.
    """
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    packed = re.fullmatch(r"([a-z_]+?)(\d+)([a-z].*)?", name)
    if packed and layer is None:
        name, layer, layer_type = packed.group(1), int(packed.group(2)), packed.group(3)
    name = _ALIASES.get(name, name)
    if name in _ATTN:
        layer_type = "attn"
    elif name in _MLP:
        layer_type = "mlp"
    else:
        layer_type = _LAYER_TYPES.get(layer_type, layer_type)
    if name in _LN and layer is None:
        return f"ln_final.hook_{name}"
    parts = ([f"blocks.{layer}"] if layer is not None else []) + ([layer_type] if layer_type else [])
    return ".".join(parts + [f"hook_{name}"])


class ActivationCache(Mapping):
    """A read-only mapping hook name → activation, from one forward pass of ``model``."""

    def __init__(self, activations: dict[str, np.ndarray], model):
        self._store = {}
        for name, array in activations.items():
            view = array.view()
            view.flags.writeable = False
            self._store[name] = view
        self.model = model

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, str) and key in self._store:
            return self._store[key]
        name = self._resolve(key)
        try:
            return self._store[name]
        except KeyError:
            where = "" if name == key else f" (= {name!r})"
            raise MissingActivation(f"{key!r}{where} is not in this cache; it holds {len(self._store)} "
                                    f"activations, e.g. {list(self._store)[:4]}") from None

    def _resolve(self, key) -> str:
        if isinstance(key, str):
            return act_name(key)
        name, layer, *rest = tuple(key) + (None,) * (2 - len(key))
        if layer is not None and layer < 0:
            layer += self.model.cfg.n_layers
        return act_name(name, layer, *rest)

    def __contains__(self, key) -> bool:
        try:
            return self._resolve(key) in self._store
        except (TypeError, ValueError):
            return False

    def __iter__(self):
        return iter(self._store)

    def __len__(self) -> int:
        return len(self._store)

    @property
    def nbytes(self) -> int:
        """Memory held by the cached arrays, in bytes."""
        return sum(a.nbytes for a in self._store.values())

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} activations, {self.nbytes / 2**20:.1f} MiB)"

    # ---- TransformerLens's decomposition API: refgpt/decomposition.py does the work ------------

    def accumulated_resid(self, *args, **kwargs):
        """The stream at each layer ("0_pre", …, "final_post"); see refgpt.decomposition."""
        return decomposition.accumulated_resid(self, *args, **kwargs)

    def decompose_resid(self, *args, **kwargs):
        """embed, pos_embed, each attn_out and mlp_out; see refgpt.decomposition."""
        return decomposition.decompose_resid(self, *args, **kwargs)

    def stack_head_results(self, *args, **kwargs):
        """Every head's z·W_O ("L0H3"); see refgpt.decomposition."""
        return decomposition.stack_head_results(self, *args, **kwargs)

    def stack_neuron_results(self, *args, **kwargs):
        """Every neuron's post·W_out ("L2N17"); see refgpt.decomposition."""
        return decomposition.stack_neuron_results(self, *args, **kwargs)

    def get_full_resid_decomposition(self, *args, **kwargs):
        """Heads, neurons, embeddings and "bias", summing to the stream; see refgpt.decomposition."""
        return decomposition.get_full_resid_decomposition(self, *args, **kwargs)

    def apply_ln_to_stack(self, *args, **kwargs):
        """A stack through a LayerNorm's cached scale (or recomputed); see refgpt.decomposition."""
        return decomposition.apply_ln_to_stack(self, *args, **kwargs)

    def logit_attrs(self, *args, **kwargs):
        """A stack through ln_final's cached scale, dotted with W_U[:, tokens]; see refgpt.decomposition."""
        return decomposition.logit_attrs(self, *args, **kwargs)
