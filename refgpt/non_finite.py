"""The non-finite guard: a forward pass never returns NaN or ±∞ from finite input without saying where.

After every pass the Model sums its output once, block of rows by block of rows on the BLAS's
threads (a NaN or ∞ anywhere makes its block's sum non-finite; benchmarks/bench_guards.py measures
the cost: ≤ 0.5 % of a forward); a block whose sum is not finite is looked at element by element,
since finite terms may overflow their sum. Only when an element is not finite does
``raise_at_first_non_finite`` run the same pass again with every hook point checked after its
hooks, and raise a RefGPTError naming the first hook point, index and value that is not finite
(the −∞ of the causal mask in the attention scores is expected); every hook point finite, it names
the output itself. A second pass that finds nothing (a hook returning something else each time)
is an error too.
"""

from __future__ import annotations

import numpy as np

from . import threads
from .errors import RefGPTError
from .tl.hooks import HookRun


def output_is_finite(output) -> bool:
    """One pass over the output: is every element finite? Each block of rows is summed (on the
    threads, refgpt/threads.py): a NaN or ∞ anywhere makes its block's sum non-finite; a block whose
    sum is not finite is then checked element by element (its sum may have overflowed from finite
    terms), so the answer is exact."""
    rows = threads.rows(np.asarray(output))  # [batch·pos, d_vocab] (a copy if not C-contiguous)

    def block_is_finite(a, b):
        with np.errstate(over="ignore", invalid="ignore"):
            total = np.add.reduce(rows[a:b], axis=None)
        # A sum that overflowed from finite terms: the block is looked at element by element, so a
        # finite output is never sent to the locating pass (which would find nothing and raise).
        return bool(np.isfinite(total)) or bool(np.isfinite(rows[a:b]).all())

    blocks = threads.row_blocks(len(rows), rows.shape[-1] * rows.itemsize)
    return all(threads.map_blocks(block_is_finite, blocks, rows.nbytes))


def raise_at_first_non_finite(model, tokens, past, start, last_only, padding, start_at_layer=None,
                              stop_at_layer=None, resid=None, positions=None):
    """The pass's output (the logits, or with stop_at_layer the stream) holds NaN or ±∞ (or only
    its sum overflowed): run the same pass again, checking every hook point after its hooks, and
    raise at the first non-finite one. The hooks run a second time; a KV cache is rewound first."""
    if past is not None:
        past.length = start  # the cache is rewritten with the same positions
    run = FirstNonFinite(model.hook_dict, start=start, positions=positions)
    try:
        output = model.run_gpt2(tokens, run, past, last_only, padding, start_at_layer, stop_at_layer,
                                resid)  # [batch, pos, d_vocab], or [batch, pos, d_model] with stop_at_layer
    except _NonFinite as found:
        name, index, value = found.args
        raise RefGPTError(f"the forward pass produced {value} at {name} (index {list(index)}) from finite "
                          "input: an overflow of the weights, a hook or an intervention; "
                          f"{model.dtype.name} cannot represent the result") from None
    bad = np.argwhere(~np.isfinite(output))
    if len(bad):
        where, why = (("the logits", "the unembedding overflowed") if stop_at_layer is None else
                      (f"the stream entering block {stop_at_layer}", "the embedding overflowed"))
        raise RefGPTError(f"the forward pass produced {output[tuple(bad[0])]} in {where} "
                          f"(index {[int(i) for i in bad[0]]}) from finite input: {why}")
    # Found by tests/core/test_edge_fuzz.py: a hook that returns NaN once and finite values the
    # next time made the locating pass clean, and the first pass's NaN logits were returned.
    raise RefGPTError("the forward pass produced a non-finite value from finite input, but the same pass run "
                      "again did not: a hook or intervention that returns something different each time it runs")


class _NonFinite(Exception):
    """Raised inside the locating pass at the first hook point holding NaN or ±∞."""


class FirstNonFinite(HookRun):
    """A HookRun that, after each hook point's hooks, checks the activation is finite."""

    def __call__(self, name: str, activation: np.ndarray) -> np.ndarray:
        activation = super().__call__(name, activation)
        bad = ~np.isfinite(activation)
        if name.endswith("hook_attn_scores"):
            bad &= activation != -np.inf  # the causal mask
        if bad.any():
            raise _NonFinite(name, tuple(int(i) for i in np.argwhere(bad)[0]), activation[bad][0])
        return activation

    def watched(self, name: str) -> bool:
        return True  # every activation is checked: none may be overwritten in place
