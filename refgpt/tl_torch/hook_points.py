"""TransformerLens's HookPoint for the torch-facing model: an ``nn.Module`` in the module tree
(``model.blocks[3].attn.hook_z``) whose hooks see and return torch tensors.

Each HookPoint stands for one of the NumPy model's hook points (refgpt/tl/hooks.py), which runs
the hooks. A hook added here is wrapped once (``TorchHook``): the NumPy forward pass hands it an
array, the user's function gets ``torch.from_numpy`` of it — the same memory, so an edit in place
is the activation that flows on — and ``hook=`` this HookPoint, as TransformerLens calls it; a
returned tensor goes back as ``.numpy()`` of it. Backward hooks get ∂/∂activation the same way
(refgpt/tl_torch/autograd.py) and may return a tensor or ``(tensor,)``.

While a pass that torch may differentiate runs, every tensor a forward hook receives is recorded
(``Recorder``): the pass makes each an output of its autograd node, so a metric of a tensor a hook
kept differentiates into the model, as in TransformerLens; and a hook that edits or replaces an
activation is noted, so that the backward of that pass — which would not be the gradient of what
ran — is refused by name (refgpt's analytic backward differentiates the unhooked forward).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..tl.hooks import DIRECTIONS, HookPoint as NumpyHookPoint
from .tensors import array, tensor
from .tl_errors import tl_semantics


@dataclass
class Recorder:
    """What the forward hooks of one differentiable pass received and did."""

    received: list = field(default_factory=list)  # (hook name, tensor) for every tensor a forward hook got
    changed: list = field(default_factory=list)  # hook names whose activation a hook replaced or edited


class TorchHook:
    """A user's hook ``fn(tensor, hook=HookPoint)`` as the NumPy model calls hooks, ``fn(array, point)``."""

    def __init__(self, fn, point: "HookPoint", dir: str):
        self.fn, self.point, self.dir = fn, point, dir

    def __call__(self, activation, _numpy_point):
        t = tensor(activation)
        shared = t.data_ptr() == activation.__array_interface__["data"][0]  # not a copy
        version = t._version
        recorder = self.point.model._recorder if self.dir == "fwd" else None
        if recorder is not None:
            recorder.received.append((self.point.name, t))
        result = self.fn(t, hook=self.point)
        if self.dir == "bwd" and isinstance(result, tuple) and len(result) == 1:
            result = result[0]  # torch's (grad,), as TransformerLens allows
        if result is None:
            edited = t._version != version
            if edited and recorder is not None:
                recorder.changed.append(self.point.name)
            return None if shared or not edited else array(t)  # an edit of a copy must flow on too
        if recorder is not None:
            recorder.changed.append(self.point.name)
        return array(result, f"hook at {self.point.name}")

    def __repr__(self):
        return f"TorchHook({self.fn!r})"


@tl_semantics
class HookPoint(nn.Module):
    """TransformerLens's HookPoint: ``name``, ``layer()``, ``ctx``, ``fwd_hooks``/``bwd_hooks``,
    ``add_hook(fn, dir=, is_permanent=, level=, prepend=)``, ``remove_hooks``, ``has_hooks``,
    ``clear_context``; calling it on a tensor runs its forward hooks. ``start`` and ``positions``
    are refgpt's (refgpt/tl/hooks.py)."""

    def __init__(self, point: NumpyHookPoint, model):
        super().__init__()
        self._point = point
        self.name = point.name
        object.__setattr__(self, "model", model)  # not a submodule: the model owns this point

    # ---- what TransformerLens's HookPoint has ---------------------------------------------------

    @property
    def ctx(self) -> dict:
        return self._point.ctx

    @ctx.setter
    def ctx(self, value):
        self._point.ctx = value

    @property
    def fwd_hooks(self) -> list:
        return self._point.fwd_hooks

    @property
    def bwd_hooks(self) -> list:
        return self._point.bwd_hooks

    @property
    def start(self) -> int:
        return self._point.start

    @property
    def positions(self):
        return None if self._point.positions is None else tensor(self._point.positions)

    def layer(self) -> int:
        return self._point.layer()

    def add_hook(self, hook, dir="fwd", is_permanent=False, level=None, prepend=False):
        self.model._check_hookable(self.name, "add_hook")
        self._point.add_hook(self.wrap(hook, dir), dir, is_permanent, level, prepend)

    def add_perma_hook(self, hook, dir="fwd"):
        self.add_hook(hook, dir=dir, is_permanent=True)

    def remove_hooks(self, dir="fwd", including_permanent=False, level=None):
        self._point.remove_hooks(dir, including_permanent, level)

    def has_hooks(self, dir="both", including_permanent=True, level=None) -> bool:
        return self._point.has_hooks(dir, including_permanent, level)

    def clear_context(self):
        self._point.clear_context()

    def wrap(self, fn, dir="fwd") -> TorchHook:
        if dir not in DIRECTIONS:
            from ..errors import RefGPTError

            raise RefGPTError(f"add_hook: dir must be 'fwd' or 'bwd', found {dir!r}")
        return fn if isinstance(fn, TorchHook) else TorchHook(fn, self, dir)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The identity, with this point's forward hooks applied (as calling TransformerLens's does)."""
        for handle in list(self.fwd_hooks):
            fn = handle.hook.fn if isinstance(handle.hook, TorchHook) else handle.hook
            result = fn(x, hook=self)
            if result is not None:
                x = result
        return x

    def __repr__(self):
        bits = [f"name={self.name!r}"]
        if self.fwd_hooks:
            bits.append(f"{len(self.fwd_hooks)} fwd")
        if self.bwd_hooks:
            bits.append(f"{len(self.bwd_hooks)} bwd")
        return f"HookPoint({', '.join(bits)})"
