"""The MLP: two linear maps with a nonlinearity between, applied at each position alone.

    pre  = x·W_in + b_in        [pos, d_mlp]
    post = act(pre)             [pos, d_mlp]
    out  = post·W_out + b_out   [pos, d_model]
"""

from __future__ import annotations


def mlp(x, w, act, point):
    """One block's MLP. ``w``: W_in, b_in, W_out, b_out; ``point`` is the hook point."""
    pre = point("hook_pre", x @ w["W_in"] + w["b_in"])  # [batch, pos, d_mlp]
    post = point("hook_post", act(pre))  # [batch, pos, d_mlp]
    return post @ w["W_out"] + w["b_out"]  # [batch, pos, d_model]
