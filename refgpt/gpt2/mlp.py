"""The MLP: two linear maps with a nonlinearity between, applied at each position alone.

    pre  = x·W_in + b_in        [pos, d_mlp]
    post = act(pre)             [pos, d_mlp]
    out  = post·W_out + b_out   [pos, d_model]

Backward (``mlp_backward``), line by line in reverse, with ∂ meaning ∂loss/∂:
    ∂post = ∂out·W_outᵀ     ∂W_out = Σ postᵀ·∂out     ∂b_out = Σ ∂out
    ∂pre  = act′(pre) ⊙ ∂post
    ∂x    = ∂pre·W_inᵀ      ∂W_in  = Σ xᵀ·∂pre        ∂b_in  = Σ ∂pre
(Σ over batch and position.)
"""

from __future__ import annotations

import functools
import inspect

from .linear import affine
from ..memory import buffer


def mlp(x, w, act, run_hooks, out=None):
    """One block's MLP. ``w``: W_in, b_in, W_out, b_out; ``run_hooks(name, a)`` runs the hooks at a hook point.
    ``out``: the [batch, pos, d_model] array to write the result into (default: a new one). pre and
    post go into the pass's scratch buffers when unwatched (refgpt/memory.py); ``act`` writes
    into one if it takes ``out=`` (activations.gelu_new)."""
    shape = (*x.shape[:-1], w["W_in"].shape[-1])  # [batch, pos, d_mlp]
    pre = affine(x, w["W_in"], w["b_in"], out=buffer(run_hooks, "pre", shape, x.dtype, "hook_pre"))
    pre = run_hooks("hook_pre", pre)  # [batch, pos, d_mlp]
    post = act(pre, out=buffer(run_hooks, "post", shape, x.dtype, "hook_post")) if _writes_into(act) else act(pre)
    post = run_hooks("hook_post", post)  # [batch, pos, d_mlp]
    return affine(post, w["W_out"], w["b_out"], out=out)  # [batch, pos, d_model]


@functools.lru_cache(maxsize=64)
def _writes_into(act) -> bool:
    """Does the nonlinearity take ``out=``?"""
    try:
        return "out" in inspect.signature(act).parameters
    except (TypeError, ValueError):
        return False


def mlp_backward(grad, x, pre, post, w, act_backward, run_hooks=None):
    """∂loss/∂(everything mlp read or computed), from grad = ∂loss/∂out [batch, pos, d_model],
    the input ``x`` and the forward's ``pre`` and ``post`` [batch, pos, d_mlp].
    ``act_backward(pre, ∂post)`` is the nonlinearity's backward (activations.BACKWARDS).

    Returns a dict: ``x``, ``W_in``, ``b_in``, ``W_out``, ``b_out``, ``hook_post``, ``hook_pre``.
    ``run_hooks(name, ∂)``, if given, sees each hook point's gradient as it is made and returns the one
    that flows on (backward hooks, refgpt/tl/hooks.py).
    """
    run_hooks = run_hooks or (lambda name, g: g)
    rows = (-1, grad.shape[-1])  # [batch·pos, d_model]
    grad_post = run_hooks("hook_post", grad @ w["W_out"].T)  # [batch, pos, d_mlp]
    grad_pre = run_hooks("hook_pre", act_backward(pre, grad_post))  # [batch, pos, d_mlp]
    g_pre_rows = grad_pre.reshape(-1, grad_pre.shape[-1])  # [batch·pos, d_mlp]
    return {
        "W_out": post.reshape(-1, post.shape[-1]).T @ grad.reshape(rows),  # [d_mlp, d_model]
        "b_out": grad.sum(axis=(0, 1)),  # [d_model]
        "W_in": x.reshape(rows).T @ g_pre_rows,  # [d_model, d_mlp]
        "b_in": g_pre_rows.sum(axis=0),  # [d_mlp]
        "x": grad_pre @ w["W_in"].T,  # [batch, pos, d_model]
        "hook_post": grad_post,
        "hook_pre": grad_pre,
    }
