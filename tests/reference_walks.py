"""The reference's walks (refgpt/reference/bounds.py) applied to a Model's passes: its cached forward
and its analytic backward, row by row of a batch. Shared by tests/core/test_plain.py and
tests/reference/test_reference.py."""

from __future__ import annotations

from refgpt.reference import bounds as pb


def check_cached_pass(model, tokens, logits, cache, **kwargs) -> pb.Ledger:
    """check_forward on every row of a batch the path ran: ``cache`` [batch, …], ``logits`` [batch, pos, d_vocab]."""
    led = pb.Ledger()
    for i in range(len(tokens)):
        pb.check_forward(led, model.params, model.cfg, tokens[i], pb.row(cache, i), logits[i], **kwargs)
    return led


def check_gradients(model, tokens) -> pb.Ledger:
    """check_backward on the analytic backward (refgpt.backward) of a batch, its parameters' gradients and loss."""
    logits, cache = model.run_with_cache(tokens)
    g = model.loss_and_grads(tokens)
    rows = [(tokens[i], pb.row(cache.cache_dict, i), logits[i], pb.row(g.activations, i)) for i in range(len(tokens))]
    led = pb.Ledger()
    sums, loss, bound = pb.check_backward(led, model.params, model.cfg, rows,
                                          [pb.row(g.ln_out, i) for i in range(len(tokens))],
                                          [g.logits[i] for i in range(len(tokens))])
    sums.check(led, pb.backward_op, g.params)
    led.compare("loss", "loss", g.loss, loss, bound)
    return led
