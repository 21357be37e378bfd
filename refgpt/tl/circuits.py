"""The model's weights read as circuits, under TransformerLens's names (``HookedTransformer``'s
weight helpers). Methods of ``Model`` (a mixin, so model.py stays the forward pass):

    model.W_E_pos                          [d_vocab + n_ctx, d_model]: W_E stacked on W_pos
    model.QK, model.OV                     every head's W_Q·W_Kᵀ and W_V·W_O, kept factored
    model.accumulated_bias(L, mlp_input)   Σ b_O (and b_out) of the blocks before L  [d_model]
    model.tokens_to_residual_directions(t) W_U[:, t]: the direction a token's logit reads
    model.all_head_labels()                ["L0H0", "L0H1", …]

``FactoredMatrix`` is a small stand-in for TransformerLens's: A [..., m, k] and B [..., k, n] with
``AB`` (the product, made on request), ``BA``, ``T``, ``shape``, ``A``/``B``; refgpt has no SVD,
eigenvalue or norm helpers on it (docs/transformerlens.md). Sums are in the model's dtype
(TransformerLens's accumulated_bias sums into float32 zeros).
"""

from __future__ import annotations

import numpy as np

from ..errors import RefGPTError
from .decomposition import accumulated_bias


class FactoredMatrix:
    """The product A·B [..., m, n] of A [..., m, k] and B [..., k, n], kept as its two factors."""

    def __init__(self, A, B):
        if A.shape[-1] != B.shape[-2]:
            raise RefGPTError(f"FactoredMatrix: A {list(A.shape)} and B {list(B.shape)} do not multiply")
        self.A, self.B = A, B

    @property
    def AB(self) -> np.ndarray:
        return self.A @ self.B  # [..., m, n]

    @property
    def BA(self) -> np.ndarray:
        return self.B @ self.A  # [..., k, k] (needs m == n)

    @property
    def T(self) -> "FactoredMatrix":
        return FactoredMatrix(np.swapaxes(self.B, -1, -2), np.swapaxes(self.A, -1, -2))

    @property
    def shape(self) -> tuple[int, ...]:
        return (*np.broadcast_shapes(self.A.shape[:-2], self.B.shape[:-2]), self.A.shape[-2], self.B.shape[-1])

    def __getitem__(self, index) -> "FactoredMatrix":
        """Index the leading (layer, head) axes: ``model.OV[3, 5]`` is head L3H5's."""
        return FactoredMatrix(self.A[index], self.B[index])

    def __repr__(self):
        return f"FactoredMatrix(shape={list(self.shape)}, inner={self.A.shape[-1]})"


class CircuitMethods:
    """TransformerLens's weight helpers; needs the stacked weight properties (W_Q, …) of Model."""

    @property
    def W_E_pos(self) -> np.ndarray:
        """W_E and W_pos stacked: [d_vocab + n_ctx, d_model]."""
        return np.concatenate([self.W_E, self.W_pos], axis=0)

    @property
    def QK(self) -> FactoredMatrix:
        """W_Q·W_Kᵀ [layer, head, d_model, d_model], factored."""
        return FactoredMatrix(self.W_Q, np.swapaxes(self.W_K, -1, -2))

    @property
    def OV(self) -> FactoredMatrix:
        """W_V·W_O [layer, head, d_model, d_model], factored."""
        return FactoredMatrix(self.W_V, self.W_O)

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> np.ndarray:
        """Σ b_O (and b_out, with ``include_mlp_biases``) over blocks 0 … layer − 1, plus block
        ``layer``'s b_O with ``mlp_input``: [d_model] (refgpt/tl/decomposition.py)."""
        return accumulated_bias(self, layer, mlp_input, include_mlp_biases)

    def tokens_to_residual_directions(self, tokens) -> np.ndarray:
        """W_U[:, tokens] with d_model last: [d_model] for one token (an id, or text that is one
        token), [..., d_model] for an array of ids."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        if hasattr(tokens, "detach"):
            tokens = tokens.detach().cpu().numpy()
        ids = np.asarray(tokens)
        if ids.dtype == bool or ids.dtype.kind not in "iu" or ((ids < 0) | (ids >= self.cfg.d_vocab)).any():
            raise RefGPTError(f"tokens_to_residual_directions: expected token ids in [0, {self.cfg.d_vocab}), found {tokens!r}")
        if ids.size == 1:
            return self.W_U[:, int(ids.reshape(-1)[0])]  # [d_model]
        return np.moveaxis(self.W_U[:, ids], 0, -1)  # [..., d_model]

    def all_head_labels(self) -> list[str]:
        return [f"L{L}H{h}" for L in range(self.cfg.n_layers) for h in range(self.cfg.n_heads)]
