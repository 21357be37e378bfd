"""The key/value cache: what incremental decoding remembers between steps.

A new token's attention needs the keys and values of every earlier position, and those never
change (a position sees only its past), so they are computed once and kept. With a KVCache, a
forward pass over the *new* tokens only is exactly the full forward pass's last rows: the same
q·kᵀ products, the same softmax over the same keys (tests/core/test_kv_cache.py).

Mutable on purpose, unlike the activation cache: each forward pass given a KVCache appends its
positions. Buffers are allocated for n_ctx positions up front, so an append copies only the new
rows. During an incremental step the hooks and the activation cache see the new positions only:
``hook_q/k/v/z`` and the residual stream are [batch, new, ...], while ``hook_attn_scores`` and
``hook_pattern`` are [batch, head, new, past + new] (the new queries against every key). A hook
reads the absolute position of the first new row as ``hook.start`` (refgpt/tl/hooks.py): that
is how a steering vector on the prompt's positions is added once, when they are computed, and
reaches every later token through the cached keys and values.
"""

from __future__ import annotations

import numpy as np

from ..errors import RefGPTError


class KVCache:
    """Keys and values per layer for ``batch`` sequences: [layer, batch, n_ctx, head, d_head]."""

    def __init__(self, cfg, batch: int, dtype):
        shape = (cfg.n_layers, batch, cfg.n_ctx, cfg.n_heads, cfg.d_head)
        self.keys = np.zeros(shape, dtype)  # [layer, batch, n_ctx, head, d_head]
        self.values = np.zeros(shape, dtype)  # [layer, batch, n_ctx, head, d_head]
        self.length = 0  # positions stored so far
        self.n_ctx, self.batch = cfg.n_ctx, batch
        self.mask = None  # [batch, n_ctx] 1 real, 0 pad, once a padded batch came through (refgpt/gpt2/padding.py)

    def check(self, batch: int, new: int):
        if batch != self.batch:
            raise RefGPTError(f"KVCache: made for batch {self.batch}, given tokens with batch {batch}")
        if self.length + new > self.n_ctx:
            raise RefGPTError(f"KVCache: {self.length} positions stored + {new} new exceeds n_positions={self.n_ctx}")

    def extend(self, layer: int, k: np.ndarray, v: np.ndarray):
        """Store the new positions' k, v [batch, new, head, d_head]; return all keys and values so far."""
        end = self.length + k.shape[1]
        self.keys[layer, :, self.length:end] = k
        self.values[layer, :, self.length:end] = v
        return self.keys[layer, :, :end], self.values[layer, :, :end]  # [batch, past + new, head, d_head]

    def attention_mask(self, new_mask, new: int) -> np.ndarray:
        """The padding mask over the stored positions and ``new`` more [batch, length + new]: the
        stored rows (all real if none was ever given), then ``new_mask`` [batch, new] or ones."""
        if self.mask is None:
            self.mask = np.ones((self.batch, self.n_ctx), dtype=np.int64)  # [batch, n_ctx]
        end = self.length + new
        self.mask[:, self.length:end] = 1 if new_mask is None else new_mask
        return self.mask[:, :end]  # [batch, length + new]

    def advance(self, new: int):
        """Called once every layer has stored its keys and values for ``new`` positions."""
        self.length += new
