"""TransformerLens's ActivationCache for the torch-facing model: a dict of torch tensors by hook
name (``cache_dict``, writable, as TransformerLens's), with TransformerLens's methods.

The tensors are views of the NumPy pass's arrays (refgpt/tl_torch/tensors.py). Every method that
computes — the decomposition API (``accumulated_resid``, ``decompose_resid``, ``stack_head_results``,
``get_full_resid_decomposition``, ``apply_ln_to_stack``, ``logit_attrs``, …), ``stack_activation``,
``get_neuron_results``, ``compute_head_results`` — runs refgpt's NumPy code
(refgpt/tl/decomposition.py) on the tensors as they are now in ``cache_dict`` (a user's edit
included), and returns tensors; arguments may be tensors or arrays.
"""

from __future__ import annotations

import torch

from ..errors import RefGPTError
from ..tl.cache import ActivationCache as NumpyCache, missing_activation, resolve_key
from .tensors import array, arrays, tensor, tensors
from .tl_errors import tl_semantics


def _plain_key(key):
    """A (name, layer[, kind]) key with a 0-d integer tensor as the layer (TransformerLens code
    indexes caches with ``tensor(0)``, e.g. a loop over ``torch.arange``) as the same key with an int."""
    if isinstance(key, tuple):
        return tuple(int(k) if isinstance(k, torch.Tensor) and k.ndim == 0 and not k.dtype.is_floating_point
                     and not k.dtype.is_complex and k.dtype != torch.bool else k for k in key)
    return key


@tl_semantics
class ActivationCache:
    """TransformerLens's ActivationCache: ``ActivationCache(cache_dict, model, has_batch_dim=True)``."""

    def __init__(self, cache_dict: dict, model, has_batch_dim: bool = True):
        self.cache_dict = cache_dict
        self.model = model
        self.has_batch_dim = has_batch_dim
        self.has_embed = "hook_embed" in cache_dict
        self.has_pos_embed = "hook_pos_embed" in cache_dict

    def _numpy(self) -> NumpyCache:
        """The cache as it is now, as refgpt's NumPy cache (views, no copies)."""
        return NumpyCache({k: array(v) for k, v in self.cache_dict.items()}, self.model._numpy, self.has_batch_dim)

    # ---- a mapping of hook name → tensor --------------------------------------------------------

    def __getitem__(self, key) -> torch.Tensor:
        if isinstance(key, str) and key in self.cache_dict:
            return self.cache_dict[key]
        name = resolve_key(_plain_key(key), self.model.cfg.n_layers)
        try:
            return self.cache_dict[name]
        except KeyError:
            raise missing_activation(key, name, self.cache_dict) from None

    def __iter__(self):
        return iter(self.cache_dict)

    def __len__(self) -> int:
        return len(self.cache_dict)

    def keys(self):
        return self.cache_dict.keys()

    def values(self):
        return self.cache_dict.values()

    def items(self):
        return self.cache_dict.items()

    def __repr__(self) -> str:
        return f"ActivationCache with keys {list(self.cache_dict.keys())}"

    def to(self, device, move_model=None) -> "ActivationCache":
        """The CPU is the only device refgpt computes on: ``to("cpu")`` is this cache."""
        if torch.device(device).type != "cpu":
            raise RefGPTError(f"ActivationCache.to: refgpt computes on the CPU, not {device}")
        return self

    def toggle_autodiff(self, mode: bool = False):
        """TransformerLens's: torch's autograd on or off, for the whole process."""
        torch.set_grad_enabled(mode)

    # ---- whole-cache reshaping, as TransformerLens ---------------------------------------------

    def remove_batch_dim(self) -> "ActivationCache":
        """Drop the batch axis (batch 1 only), in place."""
        numpy = self._numpy().remove_batch_dim()
        self.cache_dict = {k: tensor(v) for k, v in numpy.cache_dict.items()}
        self.has_batch_dim = numpy.has_batch_dim
        return self

    def apply_slice_to_batch_dim(self, batch_slice) -> "ActivationCache":
        numpy = self._numpy().apply_slice_to_batch_dim(arrays(batch_slice))
        return ActivationCache({k: tensor(v) for k, v in numpy.cache_dict.items()}, self.model, numpy.has_batch_dim)

    def compute_head_results(self) -> None:
        """Add ``blocks.L.attn.hook_result`` [batch, pos, head, d_model] = z[h]·W_O[h] for every layer."""
        numpy = self._numpy()
        numpy.compute_head_results()
        for name, value in numpy.cache_dict.items():
            if name not in self.cache_dict:
                self.cache_dict[name] = tensor(value)

    def _call(self, method, *args, **kwargs):
        return tensors(getattr(self._numpy(), method)(*arrays(args), **{k: arrays(v) for k, v in kwargs.items()}))

    def stack_activation(self, *args, **kwargs):
        return self._call("stack_activation", *args, **kwargs)

    def get_neuron_results(self, *args, **kwargs):
        return self._call("get_neuron_results", *args, **kwargs)

    # ---- the decomposition API (refgpt/tl/decomposition.py) -------------------------------------

    def accumulated_resid(self, *args, **kwargs):
        return self._call("accumulated_resid", *args, **kwargs)

    def decompose_resid(self, *args, **kwargs):
        return self._call("decompose_resid", *args, **kwargs)

    def stack_head_results(self, *args, **kwargs):
        self.compute_head_results()  # as TransformerLens: the heads' results join the cache
        return self._call("stack_head_results", *args, **kwargs)

    def stack_neuron_results(self, *args, **kwargs):
        return self._call("stack_neuron_results", *args, **kwargs)

    def get_full_resid_decomposition(self, *args, **kwargs):
        self.compute_head_results()  # as TransformerLens (its stack_head_results)
        return self._call("get_full_resid_decomposition", *args, **kwargs)

    def apply_ln_to_stack(self, *args, **kwargs):
        return self._call("apply_ln_to_stack", *args, **kwargs)

    def logit_attrs(self, *args, **kwargs):
        return self._call("logit_attrs", *args, **kwargs)
