"""TransformerLens's FactoredMatrix over torch tensors: refgpt's FactoredMatrix (refgpt/tl/circuits.py),
the same code, with torch's operations and torch's LAPACK (``torch.linalg.svd``, ``torch.linalg.eig``)
as TransformerLens computes them, so singular vectors and eigenvalues come out in TransformerLens's
order and with its signs.

``TorchLapack`` is the NumPy FactoredMatrix with torch's SVD: weight processing uses it
(``refactor_factored_attn_matrices``) so the torch-facing model's refactored weights are
TransformerLens's, sign for sign.
"""

from __future__ import annotations

import torch

from ..tl.circuits import FactoredMatrix as NumpyFactoredMatrix, NumpyOps
from .tensors import tensor
from .tl_errors import tl_semantics


class TorchOps:
    """FactoredMatrix's array operations, for torch tensors."""

    broadcast_shapes = staticmethod(torch.broadcast_shapes)
    broadcast_to = staticmethod(lambda t, shape: t.broadcast_to(shape))  # methods: TL's TensorLike duck types too
    unsqueeze = staticmethod(lambda t, k: t.unsqueeze(k))
    sqrt = staticmethod(torch.sqrt)
    numel = staticmethod(lambda t: t.numel() if isinstance(t, torch.Tensor) else torch.tensor(t).numel())

    @staticmethod
    def svd(a):
        return torch.linalg.svd(a, full_matrices=False)

    @staticmethod
    def eigenvalues(a):
        if a.dtype in (torch.bfloat16, torch.float16):
            a = a.to(torch.float32)  # as TransformerLens: no 16-bit eig
        return torch.linalg.eig(a).eigenvalues


@tl_semantics
class FactoredMatrix(NumpyFactoredMatrix):
    """TransformerLens's FactoredMatrix: A [..., ldim, mdim] and B [..., mdim, rdim] torch tensors."""

    ops = TorchOps


class TorchLapackOps(NumpyOps):
    """NumPy arrays in and out, torch's LAPACK for the SVD."""

    @staticmethod
    def svd(a):
        return tuple(t.numpy() for t in torch.linalg.svd(tensor(a), full_matrices=False))


class TorchLapack(NumpyFactoredMatrix):
    ops = TorchLapackOps
