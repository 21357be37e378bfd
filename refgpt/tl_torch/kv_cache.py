"""TransformerLens's key/value cache for the torch-facing model: ``TransformerLensKeyValueCache.
init_cache(cfg, device, batch_size)``, ``freeze()``/``unfreeze()``, passed as ``past_kv_cache=``.

It is refgpt's KVCache (refgpt/gpt2/kv_cache.py) under TransformerLens's name and constructor.
Frozen, a pass still attends to every stored position and its own, but stores nothing: the next
pass starts from the same cache (TransformerLens's ``freeze``).
"""

from __future__ import annotations

import numpy as np

from ..errors import RefGPTError
from ..gpt2.kv_cache import KVCache
from .tensors import TORCH_DTYPES


class TransformerLensKeyValueCache(KVCache):
    """refgpt's KVCache with TransformerLens's ``init_cache``, ``freeze`` and ``unfreeze``."""

    frozen = False

    @classmethod
    def init_cache(cls, cfg, device=None, batch_size: int = 1) -> "TransformerLensKeyValueCache":
        if device is not None and str(device) != "cpu":
            raise RefGPTError(f"init_cache: refgpt computes on the CPU, not {device}")
        dtype = {v: k for k, v in TORCH_DTYPES.items()}.get(getattr(cfg, "dtype", None), "float64")
        return cls(cfg, batch_size, np.dtype(dtype))

    @property
    def previous_attention_mask(self):
        """TransformerLens's record of the mask so far [batch, positions] (kept beside the keys and
        values, as TL keeps it: ``append_attention_mask`` extends it)."""
        import torch

        if not hasattr(self, "_previous"):
            self._previous = torch.ones((self.batch, self.length), dtype=torch.int64)
        return self._previous

    def append_attention_mask(self, attention_mask):
        """TransformerLens's: the mask so far followed by ``attention_mask`` [batch, new], kept unless frozen."""
        import torch

        updated = torch.cat([self.previous_attention_mask, torch.as_tensor(attention_mask)], dim=-1)
        if not self.frozen:
            self._previous = updated
        return updated

    def freeze(self):
        self.frozen = True

    def unfreeze(self):
        self.frozen = False

    def advance(self, new: int):
        if not self.frozen:
            super().advance(new)
