"""NumPy ↔ torch at the torch-facing model's boundary, without copying where memory allows.

refgpt computes in NumPy; a TransformerLens user holds torch tensors. Every array that crosses to
the user becomes a tensor over the *same memory* (``torch.from_numpy``): an activation a hook
receives, edited in place, is the activation the forward pass carries on with, as in
TransformerLens. Every tensor the user hands in becomes an array over its memory (``.numpy()``).
A copy is made only where NumPy or torch cannot share: a read-only array (a copy the user may
write), a tensor that is conjugated or negated lazily, a dtype torch lacks.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import RefGPTTypeError

#: NumPy dtype name → torch dtype, for the dtypes refgpt computes in.
TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32}


def torch_dtype(dtype) -> torch.dtype:
    """The torch dtype of a NumPy dtype (float64, float32)."""
    return TORCH_DTYPES[np.dtype(dtype).name]


def tensor(a) -> torch.Tensor:
    """An array (or NumPy scalar, or Python number) as a tensor over the same memory when it can be.

    A read-only array is shared when its memory is writable underneath (a read-only *view*, as
    refgpt's cache hands out: the tensor views the same buffer through a writable view); memory that
    is truly read-only is copied, so that writing to the tensor is never undefined behaviour."""
    if isinstance(a, torch.Tensor):
        return a
    if not isinstance(a, np.ndarray):
        return torch.tensor(np.asarray(a))
    if a.ndim == 0:
        return torch.tensor(a[()])
    if not a.flags.writeable:
        view = a.view()
        try:
            view.flags.writeable = True  # allowed when the buffer underneath is writable
            a = view
        except ValueError:
            a = a.copy()
    if any(s < 0 for s in a.strides):
        a = a.copy()  # torch has no negative strides
    return torch.from_numpy(a).view(a.shape)  # (a view: an op torch dispatches, so its watchers see the tensor made)


def array(t, what="tensor") -> np.ndarray:
    """A tensor (or anything array-like) as a NumPy array over the same memory when it can be."""
    if isinstance(t, torch.Tensor):
        if t.device.type != "cpu":
            raise RefGPTTypeError(f"{what}: refgpt computes on the CPU, found a tensor on {t.device}")
        if t.dtype == torch.bfloat16:
            raise RefGPTTypeError(f"{what}: bfloat16 has no NumPy dtype; refgpt computes in float64 or float32")
        if t.requires_grad:
            t = t.detach()
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        return t.numpy()
    return t


def arrays(x):
    """``array`` applied through lists, tuples and dicts (arguments to a NumPy function)."""
    if isinstance(x, torch.Tensor):
        return array(x)
    if isinstance(x, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in x):
        return type(x)(arrays(v) for v in x)
    return x


def tensors(x):
    """``tensor`` applied through tuples, lists and dicts of results; other values pass as they are."""
    if isinstance(x, np.ndarray) or isinstance(x, np.generic):
        return tensor(x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a NamedTuple (Output)
        return type(x)(*(tensors(v) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(tensors(v) for v in x)
    if isinstance(x, dict):
        return {k: tensors(v) for k, v in x.items()}
    return x
