"""The model's weights read as circuits, under TransformerLens's names (``HookedTransformer``'s
weight helpers). Methods of ``Model`` (a mixin, so model.py stays the forward pass):

    model.W_E_pos                          [d_vocab + n_ctx, d_model]: W_E stacked on W_pos
    model.QK, model.OV                     every head's W_Q·W_Kᵀ and W_V·W_O, kept factored
    model.accumulated_bias(L, mlp_input)   Σ b_O (and b_out) of the blocks before L  [d_model]
    model.tokens_to_residual_directions(t) W_U[:, t]: the direction a token's logit reads
    model.all_head_labels()                ["L0H0", "L0H1", …]

``FactoredMatrix`` is TransformerLens's: A [..., m, k] and B [..., k, n] kept as factors, with the
product on request (``AB``, ``BA``), products with matrices and vectors kept factored (``@``),
scalar ``*``, ``T``, indexing of the leading axes (and of rows/columns, as TL), the SVD of the
product computed from the factors (``svd()``, ``U``, ``S``, ``V``), ``eigenvalues`` (of BA, the
nonzero ones of AB), ``norm()`` (Frobenius), ``make_even()``, ``collapse_l/r``, ``get_corner``,
``unsqueeze``, ``pair``, ``ldim``/``mdim``/``rdim``, TL's repr. One implementation for two array
libraries: ``FactoredMatrix`` holds NumPy arrays; the torch-facing model's (refgpt/tl_torch/circuits.py)
is the same class over torch tensors, with torch's LAPACK, as TransformerLens computes it.
Sums are in the model's dtype (TransformerLens's accumulated_bias sums into float32 zeros).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from ..errors import RefGPTError
from .decomposition import accumulated_bias


class NumpyOps:
    """The array operations FactoredMatrix needs, for NumPy arrays (LAPACK: NumPy's)."""

    broadcast_shapes = staticmethod(lambda a, b: tuple(np.broadcast_shapes(tuple(a), tuple(b))))
    broadcast_to = staticmethod(np.broadcast_to)
    unsqueeze = staticmethod(np.expand_dims)
    sqrt = staticmethod(np.sqrt)
    numel = staticmethod(np.size)

    @staticmethod
    def svd(a):
        """(U, S, Vh) of a [..., m, n], reduced (U [..., m, r], S [..., r], Vh [..., r, n])."""
        return np.linalg.svd(a, full_matrices=False)

    @staticmethod
    def eigenvalues(a):
        return np.linalg.eigvals(a)  # [..., n] complex


class FactoredMatrix:
    """The product A·B [..., ldim, rdim] of A [..., ldim, mdim] and B [..., mdim, rdim], kept as its
    two factors (TransformerLens's FactoredMatrix; leading axes broadcast)."""

    ops = NumpyOps
    __array_ufunc__ = None  # ndarray @ FactoredMatrix: NumPy defers to __rmatmul__

    def __init__(self, A, B):
        if A.shape[-1] != B.shape[-2]:
            raise RefGPTError(f"FactoredMatrix: A {list(A.shape)} and B {list(B.shape)} do not multiply "
                              "(A's last axis must match B's second-to-last)")
        self.ldim, self.mdim, self.rdim = A.shape[-2], A.shape[-1], B.shape[-1]
        self.has_leading_dims = A.ndim > 2 or B.ndim > 2
        try:
            leading = self.ops.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        except (ValueError, RuntimeError):
            raise RefGPTError(f"FactoredMatrix: shape mismatch: the leading axes of A {list(A.shape)} and B "
                              f"{list(B.shape)} do not broadcast") from None
        self.shape = leading + type(leading)((self.ldim, self.rdim))
        self.A = self.ops.broadcast_to(A, leading + type(leading)((self.ldim, self.mdim)))
        self.B = self.ops.broadcast_to(B, leading + type(leading)((self.mdim, self.rdim)))

    def _new(self, A, B):
        return type(self)(A, B)

    # ---- products ------------------------------------------------------------------------------

    def __matmul__(self, other):
        """FactoredMatrix @ FactoredMatrix or matrix → FactoredMatrix; @ vector [rdim] → [..., ldim]."""
        if isinstance(other, FactoredMatrix):
            return (self @ other.A) @ other.B
        if other.ndim < 2:  # a vector: the factorisation collapses
            return (self.A @ (self.B @ self.ops.unsqueeze(other, -1))).squeeze(-1)
        if other.shape[-2] != self.rdim:
            raise RefGPTError(f"FactoredMatrix @: {list(self.shape)} times {list(other.shape)}: inner sizes differ")
        if self.rdim > self.mdim:
            return self._new(self.A, self.B @ other)
        return self._new(self.AB, other)

    def __rmatmul__(self, other):
        """matrix @ FactoredMatrix → FactoredMatrix; vector [ldim] @ → [..., rdim]."""
        if isinstance(other, FactoredMatrix):
            return other.A @ (other.B @ self)
        if other.shape[-1] != self.ldim:
            raise RefGPTError(f"@ FactoredMatrix: {list(other.shape)} times {list(self.shape)}: inner sizes differ")
        if other.ndim < 2:
            return ((self.ops.unsqueeze(other, -2) @ self.A) @ self.B).squeeze(-2)
        if self.ldim > self.mdim:
            return self._new(other @ self.A, self.B)
        return self._new(other, self.AB)

    def __mul__(self, scalar):
        """A scalar times the product: it scales A."""
        if not isinstance(scalar, (int, float, np.number)) and self.ops.numel(scalar) != 1:
            raise RefGPTError(f"FactoredMatrix *: a scalar is needed, found shape {list(scalar.shape)} (use @)")
        return self._new(self.A * scalar, self.B)

    __rmul__ = __mul__

    @property
    def AB(self):
        """The product [..., ldim, rdim] (made on request: it can be large)."""
        return self.A @ self.B

    @property
    def BA(self):
        """The reverse product [..., mdim, mdim]; only for a square product (ldim == rdim)."""
        if self.ldim != self.rdim:
            raise RefGPTError(f"FactoredMatrix.BA: needs ldim == rdim, the shape is {list(self.shape)}")
        return self.B @ self.A

    @property
    def T(self) -> "FactoredMatrix":
        return self._new(self.B.swapaxes(-1, -2), self.A.swapaxes(-1, -2))

    # ---- the SVD, from the factors: A = Ua·Sa·Vaᵀ, B = Ub·Sb·Vbᵀ, then the small middle ---------

    @cached_property
    def _svd(self):
        Ua, Sa, Vha = self.ops.svd(self.A)  # [..., ldim, r], [..., r], [..., r, mdim]
        Ub, Sb, Vhb = self.ops.svd(self.B)  # [..., mdim, r], [..., r], [..., r, rdim]
        middle = Sa[..., :, None] * Vha @ Ub * Sb[..., None, :]  # [..., r, r] = Sa·Vaᵀ·Ub·Sb
        Um, Sm, Vhm = self.ops.svd(middle)
        return Ua @ Um, Sm, Vhb.swapaxes(-1, -2) @ Vhm.swapaxes(-1, -2)

    def svd(self):
        """(U, S, V) with U·diag(S)·Vᵀ = AB: U [..., ldim, mdim], S [..., mdim], V [..., rdim, mdim]."""
        return self._svd

    U = property(lambda self: self._svd[0], doc="Left singular vectors [..., ldim, mdim].")
    S = property(lambda self: self._svd[1], doc="Singular values [..., mdim], largest first.")
    V = property(lambda self: self._svd[2], doc="Right singular vectors [..., rdim, mdim] (AB = U·diag(S)·Vᵀ).")
    @property
    def Vh(self):
        """TransformerLens's old name for V (it is V, not Vᵀ); deprecated there, with its warning."""
        import warnings

        warnings.warn("FactoredMatrix.Vh has always returned V (right singular vectors), not Vh; use .V",
                      DeprecationWarning, stacklevel=2)
        return self._svd[2]

    @property
    def eigenvalues(self):
        """The eigenvalues of BA [..., mdim] (complex): AB's nonzero ones, since BAv = λv gives AB(Av) = λ(Av)."""
        return self.ops.eigenvalues(self.BA)

    def norm(self):
        """The Frobenius norm of AB, √(Σ S²): [...]."""
        return self.ops.sqrt((self.S ** 2).sum(-1))

    def make_even(self) -> "FactoredMatrix":
        """The same product as (U·√S)(√S·Vᵀ): each factor holds half of every singular value."""
        root = self.ops.sqrt(self.S)  # [..., mdim]
        return self._new(self.U * root[..., None, :], root[..., :, None] * self.V.swapaxes(-1, -2))

    def collapse_l(self):
        """S·Vᵀ [..., mdim, rdim]: the product with its left orthogonal factor U removed."""
        return self.S[..., :, None] * self.V.swapaxes(-1, -2)

    def collapse_r(self):
        """U·S [..., ldim, mdim]: the product with its right orthogonal factor V removed."""
        return self.U * self.S[..., None, :]

    # ---- shape and indexing --------------------------------------------------------------------

    def __getitem__(self, idx) -> "FactoredMatrix":
        """Index the leading axes (``model.OV[3, 5]`` is head L3H5's); an index one or two longer
        also picks rows (of A) and columns (of B), an int keeping its axis, as TransformerLens."""
        idx = idx if isinstance(idx, tuple) else (idx,)
        length = len([i for i in idx if i is not None])
        if length <= len(self.shape) - 2:
            return self._new(self.A[idx], self.B[idx])
        if length == len(self.shape) - 1:
            idx = _int_as_slice(idx, -1)
            return self._new(self.A[idx], self.B[idx[:-1]])
        if length == len(self.shape):
            idx = _int_as_slice(_int_as_slice(idx, -1), -2)
            return self._new(self.A[idx[:-1]], self.B[idx[:-2] + (slice(None), idx[-1])])
        raise RefGPTError(f"FactoredMatrix: index {idx} is too long for shape {list(self.shape)}")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def unsqueeze(self, k: int) -> "FactoredMatrix":
        return self._new(self.ops.unsqueeze(self.A, k), self.ops.unsqueeze(self.B, k))

    @property
    def pair(self):
        return self.A, self.B

    def get_corner(self, k: int = 3):
        """The top-left k×k corner of AB (of every leading index's first k, as TL's get_corner)."""
        corner = self.A[..., :k, :] @ self.B[..., :, :k]
        return corner[tuple(slice(k) for _ in corner.shape)]

    def __repr__(self):
        return f"FactoredMatrix: Shape({self.shape}), Hidden Dim({self.mdim})"


def _int_as_slice(idx: tuple, i: int) -> tuple:
    """TransformerLens's _convert_to_slice: an int at position i becomes a one-long slice."""
    idx = list(idx)
    if isinstance(idx[i], (int, np.integer)):
        value = int(idx[i])
        idx[i] = slice(value, value + 1 if value != -1 else None)
    return tuple(idx)


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
