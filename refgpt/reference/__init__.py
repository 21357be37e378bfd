"""The reference: GPT-2 and the rule that judges a port, in one room, NumPy and the standard library only.

Read it top to bottom, in this order:

    gpt2.py      GPT-2's forward and backward pass, one small function per op; every activation
                 the Model accepts; the einsum letters and every weight's shape at the top
    weights.py   HF's checkpoint names and layouts → TransformerLens's circuits names (c_attn's
                 split, Conv1D's orientation, the tied unembedding): the map the loader uses
    bounds.py    each op's rounding bound at a unit roundoff u, derived (§1–§11), and the walks
                 that hold a computation's values to gpt2.py's op by op
    local.py     each op's rounding bound at a port's precision (bfloat16, float16, float32), for
                 judging every op on the port's own inputs: the local verdicts
    compare.py   the rule that judges a port's tensor against a golden file's, whole tensors,
                 written to be read
    golden.py    a golden file's layout (names, order, metadata) and a reader of a page

Nothing here imports the rest of refgpt; the rest of refgpt — the fast Model, its threads and
memory, the blocked attention, the streamed golden writer, the blocked and memory-mapped
comparison, TransformerLens compatibility, analysis, sweep — is the engine, tested against this
room (tests/reference/, tests/core/test_plain.py, tests/oracle/test_blocked_compare.py).
"""
