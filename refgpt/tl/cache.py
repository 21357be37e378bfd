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
from ..errors import MissingActivation, RefGPTError, RefGPTTypeError, size_shown, whole_number
from .hook_points import ATTN_HOOKS, LN_HOOKS, MLP_HOOKS

_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q",
            "value": "v", "mlp_pre": "pre", "mlp_post": "post"}
_ATTN = {h.removeprefix("hook_") for h in ATTN_HOOKS} | {"result"}  # q, k, v, attn_scores, pattern, z; result
_MLP = {h.removeprefix("hook_") for h in MLP_HOOKS}  # pre, post
_LN = {h.removeprefix("hook_") for h in LN_HOOKS}  # mean, scale, normalized
_LAYER_TYPES = {"a": "attn", "attention": "attn", "m": "mlp", "b": "", "block": "", "blocks": ""}


def act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """A short activation name → the full hook name, as TransformerLens's ``get_act_name``.

    ``act_name("resid_pre", 3)`` → ``blocks.3.hook_resid_pre``; ``act_name("k6")`` →
    ``blocks.6.attn.hook_k``; ``act_name("scale")`` → ``ln_final.hook_scale``;
    ``act_name("scale", 4, "ln1")`` → ``blocks.4.ln1.hook_scale``; a full name comes back as is.
    A name that is not a string, a layer that is not a whole number (1.5, "3") or a layer type that
    is not a string is a RefGPTTypeError, never a name no cache holds.
    """
    if not isinstance(name, str):
        raise RefGPTTypeError(f"act_name: the name must be a string, found {name!r:.60}")
    if layer is not None:
        layer = whole_number(layer, f"act_name({name!r:.40}): the layer")
    if layer_type is not None and not isinstance(layer_type, str):
        raise RefGPTTypeError(f"act_name({name!r:.40}): the layer type must be a string, found {layer_type!r:.60}")
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


def resolve_key(key, n_layers: int) -> str:
    """A cache key — a name, short or full, or (name, layer[, kind]) with a negative layer counted
    from the end — as the full hook name."""
    if isinstance(key, str):
        return act_name(key)
    if not isinstance(key, tuple) or not 1 <= len(key) <= 3:
        raise RefGPTTypeError(f"cache key must be a name or (name, layer[, kind]), found {key!r:.60}")
    name, layer, *rest = tuple(key) + (None,) * (2 - len(key))
    if layer is not None:
        layer = whole_number(layer, f"cache key {key!r:.60}: the layer")
        if layer < 0:
            layer += n_layers
    return act_name(name, layer, *rest)


def missing_activation(key, name: str, store) -> MissingActivation:
    """The error for a key (resolved to ``name``) that is not in a cache holding ``store``'s names."""
    where = "" if name == key else f" (= {name!r})"
    return MissingActivation(f"{key!r}{where} is not in this cache; it holds {len(store)} "
                             f"activations, e.g. {list(store)[:4]}")


class ActivationCache(Mapping):
    """A read-only mapping hook name → activation, from one forward pass of ``model``."""

    def __init__(self, activations: dict[str, np.ndarray], model, has_batch_dim: bool = True):
        self._store = {}
        for name, array in activations.items():
            view = np.asarray(array).view()
            view.flags.writeable = False
            self._store[name] = view
        self.model = model
        self.has_batch_dim = has_batch_dim

    @property
    def cache_dict(self) -> dict[str, np.ndarray]:
        """The activations by full hook name (TransformerLens's attribute; the arrays are read-only)."""
        return self._store

    # ---- TransformerLens's reshaping of a whole cache ------------------------------------------

    def remove_batch_dim(self) -> "ActivationCache":
        """Drop the batch axis of every activation (batch 1 only); in place, as TransformerLens; a
        second call does nothing."""
        if not self.has_batch_dim:
            return self  # already removed: nothing to do (TransformerLens logs a warning)
        sizes = {a.shape[0] for a in self._store.values() if a.ndim}
        if sizes - {1}:
            raise RefGPTError(f"remove_batch_dim: the batch has {max(sizes)} sequences; only a batch of 1 can lose its axis")
        self._store = {name: a[0] if a.ndim else a for name, a in self._store.items()}
        self.has_batch_dim = False
        return self

    def apply_slice_to_batch_dim(self, batch_slice) -> "ActivationCache":
        """A new cache with ``batch_slice`` (TransformerLens's Slice rules) of every batch axis."""
        from .decomposition import _Slice

        if not self.has_batch_dim:
            raise RefGPTError("apply_slice_to_batch_dim: this cache has no batch axis")
        s = _Slice(batch_slice)
        return ActivationCache({name: s.apply(a, 0) for name, a in self._store.items()}, self.model,
                               has_batch_dim=not isinstance(s.index, int))

    def apply_slice_to_pos_dim(self, pos_slice) -> "ActivationCache":
        """A new cache with ``pos_slice`` of every position axis, as run_with_cache(pos_slice=) takes
        it in TransformerLens: axis −3 for q, k, v, z and result, −2 for the rest (for the attention
        scores and pattern, the query axis); an int keeps the axis (length 1)."""
        from .decomposition import _Slice

        if isinstance(pos_slice, (int, np.integer)) and not isinstance(pos_slice, bool):
            pos_slice = [int(pos_slice)]  # as TransformerLens's Slice.unwrap: an int keeps the axis here
        s = _Slice(pos_slice)
        out = {}
        for name, a in self._store.items():
            axis = -3 if name.endswith(("hook_q", "hook_k", "hook_v", "hook_z", "hook_result")) else -2
            axis = -1 if name == "hook_tokens" else axis  # [batch, pos]
            out[name] = s.apply(a, a.ndim + axis) if a.ndim >= -axis else a
        return ActivationCache(out, self.model, self.has_batch_dim)

    def stack_activation(self, activation_name: str, layer: int = -1, sublayer_type=None) -> np.ndarray:
        """``activation_name`` of every block before ``layer`` (−1/None: all), stacked [layer, …]."""
        if layer is None or layer == -1:
            layer = self.model.cfg.n_layers
        return np.stack([self[(activation_name, L, sublayer_type)] for L in range(layer)])

    def get_neuron_results(self, layer: int, neuron_slice=None, pos_slice=None, project_output_onto=None) -> np.ndarray:
        """Each neuron's post·W_out in block ``layer`` [batch, pos, neuron, d_model] (or projected onto
        ``project_output_onto`` [d_model] / [d_model, n]); TransformerLens's ``get_neuron_results``."""
        from .decomposition import _Slice

        acts = self[("post", layer, "mlp")]  # [batch, pos, d_mlp]
        W_out = self.model.params[f"blocks.{layer}.mlp.W_out"]  # [d_mlp, d_model]
        acts = _Slice(pos_slice).apply(acts, acts.ndim - 2)
        n = _Slice(neuron_slice)
        acts, W_out = n.apply(acts, acts.ndim - 1), n.apply(W_out, 0)
        if project_output_onto is None:
            return acts[..., None] * W_out  # [batch, pos, neuron, d_model]
        projected = W_out @ np.asarray(project_output_onto)  # [neuron] or [neuron, n]
        return acts * projected if projected.ndim == 1 else acts[..., None] * projected

    def compute_head_results(self) -> None:
        """Add ``blocks.L.attn.hook_result`` [batch, pos, head, d_model] = z[h]·W_O[h] for every
        layer, as TransformerLens does for a cache made without use_attn_result."""
        for L in range(self.model.cfg.n_layers):
            name = f"blocks.{L}.attn.hook_result"
            if name in self._store:
                continue
            z = self[("z", L, "attn")]  # [batch, pos, head, d_head]
            W_O = self.model.params[f"blocks.{L}.attn.W_O"]  # [head, d_head, d_model]
            result = (z[..., None] * W_O).sum(axis=-2)  # [batch, pos, head, d_model]
            result.flags.writeable = False
            self._store[name] = result

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, str) and key in self._store:
            return self._store[key]
        name = self._resolve(key)
        try:
            return self._store[name]
        except KeyError:
            raise missing_activation(key, name, self._store) from None

    def _resolve(self, key) -> str:
        return resolve_key(key, self.model.cfg.n_layers)

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
        return f"ActivationCache({len(self)} activations, {size_shown(self.nbytes)})"

    # ---- TransformerLens's decomposition API: refgpt/tl/decomposition.py does the work ------------

    def accumulated_resid(self, *args, **kwargs):
        """The stream at each layer ("0_pre", …, "final_post"); see refgpt.tl.decomposition."""
        return decomposition.accumulated_resid(self, *args, **kwargs)

    def decompose_resid(self, *args, **kwargs):
        """embed, pos_embed, each attn_out and mlp_out; see refgpt.tl.decomposition."""
        return decomposition.decompose_resid(self, *args, **kwargs)

    def stack_head_results(self, *args, **kwargs):
        """Every head's z·W_O ("L0H3"); see refgpt.tl.decomposition."""
        return decomposition.stack_head_results(self, *args, **kwargs)

    def stack_neuron_results(self, *args, **kwargs):
        """Every neuron's post·W_out ("L2N17"); see refgpt.tl.decomposition."""
        return decomposition.stack_neuron_results(self, *args, **kwargs)

    def get_full_resid_decomposition(self, *args, **kwargs):
        """Heads, neurons, embeddings and "bias", summing to the stream; see refgpt.tl.decomposition."""
        return decomposition.get_full_resid_decomposition(self, *args, **kwargs)

    def apply_ln_to_stack(self, *args, **kwargs):
        """A stack through a LayerNorm's cached scale (or recomputed); see refgpt.tl.decomposition."""
        return decomposition.apply_ln_to_stack(self, *args, **kwargs)

    def logit_attrs(self, *args, **kwargs):
        """A stack through ln_final's cached scale, dotted with W_U[:, tokens]; see refgpt.tl.decomposition."""
        return decomposition.logit_attrs(self, *args, **kwargs)
