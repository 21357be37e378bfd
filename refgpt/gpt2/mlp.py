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

from .linear import affine


def mlp(x, w, act, run_hooks):
    """One block's MLP. ``w``: W_in, b_in, W_out, b_out; ``run_hooks(name, a)`` runs the hooks at a hook point."""
    pre = run_hooks("hook_pre", affine(x, w["W_in"], w["b_in"]))  # [batch, pos, d_mlp]
    post = run_hooks("hook_post", act(pre))  # [batch, pos, d_mlp]
    return affine(post, w["W_out"], w["b_out"])  # [batch, pos, d_model]


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
