"""Gradients through torch: one ``torch.autograd.Function`` per forward pass, whose backward is
refgpt's analytic backward (refgpt/backward.py, ``backward_from``).

TransformerLens users differentiate: ``metric(model(tokens)).backward()`` fills each parameter's
``.grad`` and fires the backward hooks (attribution patching). refgpt's NumPy forward is not
torch's, so torch cannot trace it; instead the whole pass is one node of torch's graph:

    forward   the NumPy pass, caching every activation the backward needs; its outputs (the
              logits, the loss) become tensors over the NumPy arrays, and so does every tensor a
              forward hook received (``hook_points.Recorder``), each an output of the node
    backward  torch hands over ∂metric/∂ each output it used: ∂logits (plus the loss's
              softmax − onehot, weighted, for a loss output) starts refgpt's backward, and
              ∂metric/∂ a hooked tensor joins the gradient at its hook point; the backward
              hooks fire as each gradient is made; the parameters' gradients go back to torch,
              which adds them to ``.grad``

So the gradients are refgpt's exact analytic ones (float64), not a re-derivation. A pass that
refgpt's backward does not describe — a forward hook replaced or edited an activation, a padded
batch, a KV cache, ``start_at_layer``/``stop_at_layer``, ``use_attn_in``/``use_split_qkv_input`` —
still returns tensors with a grad_fn, and its backward raises a RefGPTError saying which; a
silently wrong gradient is never returned.
"""

from __future__ import annotations

import numpy as np
import torch

from ..backward import backward_from
from ..errors import RefGPTError
from ..gpt2.loss import lm_cross_entropy_loss_backward
from ..tl.hooks import GradientRun
from .tensors import array, tensor


class Pass:
    """One forward pass that torch may differentiate: what ran, what it returned, and why (if so)
    refgpt's backward cannot differentiate it."""

    def __init__(self, model, tokens, run_kwargs, refusal=None):
        self.model = model  # the torch-facing model
        self.tokens = tokens  # int64 [batch, pos] or None
        self.run_kwargs = run_kwargs  # for model._numpy._run
        self.refusal = refusal
        self.cache = None  # the NumPy ActivationCache of every hook point
        self.names = []  # the hook point of each recorded tensor

    def forward(self, cache_names):
        from .hook_points import Recorder

        recorder = Recorder()
        self.model._recorder = recorder
        try:
            out, self.cache = self.model._numpy._run(cache_names=cache_names, **self.run_kwargs)
        finally:
            self.model._recorder = None
        if recorder.changed and self.refusal is None:
            self.refusal = (f"a forward hook replaced or edited {sorted(set(recorder.changed))[:3]}: refgpt's "
                            "analytic backward differentiates the unhooked forward pass, not the edited one")
        self.names = [name for name, _ in recorder.received]
        return out, [t for _, t in recorder.received]

    def backward(self, grad_logits, grad_loss, grad_received):
        """The parameters' gradients (NumPy, by name) from torch's ∂outputs."""
        if self.refusal is not None:
            raise RefGPTError(f"backward: {self.refusal}")
        numpy_model, kw = self.model._numpy, self.run_kwargs
        logits = self.cache["unembed.hook_out"]  # [batch, pos, d_vocab]
        grad = np.zeros_like(logits) if grad_logits is None else array(grad_logits).astype(logits.dtype, copy=True)
        if grad_loss is not None:  # (a padded pass is refused: no mask here)
            grad += lm_cross_entropy_loss_backward(logits, self.tokens, array(grad_loss),
                                                   per_token=kw.get("loss_per_token", False))
        arriving = {}
        for name, g in zip(self.names, grad_received):
            if g is not None:
                arriving[name] = arriving[name] + array(g) if name in arriving else array(g).copy()
        run_hooks = GradientRun(numpy_model.hook_dict, arriving)
        return backward_from(numpy_model, self.tokens, self.cache, grad, run_hooks).params


class NumpyForward(torch.autograd.Function):
    """The autograd node of one Pass: inputs the model's parameters, outputs (logits, loss,
    *every tensor a forward hook received); ``has`` says which of logits and loss are there."""

    @staticmethod
    def forward(ctx, run: Pass, cache_names, has, *params):
        ctx.set_materialize_grads(False)
        out, received = run.forward(cache_names)
        ctx.run, ctx.has, ctx.names = run, has, [n for n, _ in run.model.named_parameters()]
        outputs = []
        if has[0]:
            outputs.append(tensor(out[0] if has[1] else out))
        if has[1]:
            outputs.append(tensor(np.asarray(out[1] if has[0] else out)))
        ctx.mark_non_differentiable(*[t for t in received if not t.is_floating_point()])
        return (*outputs, *received)

    @staticmethod
    def backward(ctx, *grads):
        n_out = sum(ctx.has)
        grads_out, grad_received = grads[:n_out], grads[n_out:]
        grad_logits = grads_out[0] if ctx.has[0] else None
        grad_loss = grads_out[-1] if ctx.has[1] else None
        params = ctx.run.backward(grad_logits, grad_loss, grad_received)
        return (None, None, None, *(tensor(params[name]) for name in ctx.names))
