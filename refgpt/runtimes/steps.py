"""A decode golden's steps from a runtime that runs whole sequences: each step is a pass over the
sequence so far.

A decode golden (refgpt/oracle/decode.py) holds step S's tensors at its new positions only, as a
port's KV-cached step computes them. A runtime refgpt runs as a model candidate takes a whole
sequence, so step S is run as the pass over the golden's tokens up to and including step S's, and
its last ``new`` positions are step S's tensors (attention's scores and pattern: the last ``new``
query rows against every key so far) — in exact arithmetic the numbers a cached step computes.
The steps run along the golden's own tokens, and a greedy golden's ``step.S.chosen`` is the
candidate's own arg-max of its last logits (ties to the lowest id), so a runtime that would choose
another token is named at that step. **Unjudged**: the KV cache (``attn.cache_k``, ``cache_v``: a
pass without a cache has none) and each step's position ids.

A padded golden (``attention_mask``) needs a runtime fed the mask and the positions: an ONNX graph
with ``attention_mask`` and ``position_ids`` inputs; any other is refused in one line.
"""

from __future__ import annotations

import json
import re

import numpy as np

from ..errors import RefGPTError

_STEP = re.compile(r"step\.(\d+)\.")  # a decode golden's names (refgpt/oracle/decode.py): step.S.<golden name>

NOTES = ["decode steps run as passes over the sequence so far, along the golden's tokens: each step's new "
         "positions judged; the KV cache (attn.cache_k, attn.cache_v) is not a runtime pass's tensor and is not judged"]


def step_ranges(golden_tensors) -> list[tuple[int, int, int]]:
    """(step S, the sequence length after it, its new positions) for every step of a decode golden."""
    out, end = [], 0
    steps = sorted({int(m.group(1)) for m in map(_STEP.match, golden_tensors) if m})
    for S in steps:
        if f"step.{S}.tokens" not in golden_tensors:
            raise RefGPTError(f"the decode golden has no step.{S}.tokens: remake it with `refgpt golden --generate`")
        new = int(np.shape(golden_tensors[f"step.{S}.tokens"])[1])
        end += new
        out.append((S, end, new))
    return out


def as_step(captured: dict, step: int, new: int) -> dict:
    """A pass's ``captured`` tensors (refgpt names, [batch, pos, …]) as step ``step``'s: its last ``new``
    positions, under ``step.S.`` names (``tokens`` is left out: the golden's are the sequence's)."""
    out = {}
    for name, x in captured.items():
        if name == "tokens":
            continue
        x = np.asarray(x)
        if name.endswith(("hook_attn_scores", "hook_pattern")):
            x = x[:, :, -new:]  # [batch, head, new, keys]
        else:
            x = x[:, -new:]  # [batch, new, …]
        out[f"step.{step}.{name}"] = x
    return out


def chosen(golden, candidate: dict, ranges) -> dict:
    """For a greedy decode golden, each step's ``step.S.chosen`` from the candidate's own last logits
    (arg-max, ties to the lowest id: np.argmax's); a forced one's are the golden's tokens (nothing to add)."""
    info = json.loads(golden.metadata.get("decode", "{}"))
    if info.get("continuation") != "greedy":
        return {}
    return {f"step.{S}.chosen": np.argmax(np.asarray(candidate[f"step.{S}.logits"])[:, -1], axis=-1)
            for S, _, _ in ranges if f"step.{S}.logits" in candidate}  # [batch]


def run_steps(run, golden, ranges) -> tuple[list[dict], list[str]]:
    """A decode golden's steps through ``run(end)`` — a runtime's pass over the first ``end``
    positions, giving (groups of {refgpt name: (the runtime's name, tensor)}, notes) — each step
    its pass's last new positions (``as_step``), the golden's tokens and the candidate's own
    ``step.S.chosen`` added: (groups under step names, notes)."""
    grouped, notes = [], list(NOTES)
    for S, end, new in ranges:
        more, step_notes = run(end)
        notes += [n for n in step_notes if n not in notes]
        for i, group in enumerate(more):
            stepped = as_step({k: v for k, (_, v) in group.items()}, S, new)
            names = {f"step.{S}.{k}": source for k, (source, _) in group.items()}
            while len(grouped) <= i:
                grouped.append({})
            grouped[i].update({k: (f"step.{S}.{names[k]}", v) for k, v in stepped.items()})
    grouped[0]["tokens"] = ("tokens", np.asarray(golden.tensors["tokens"]))
    grouped[0].update({k: (k, v) for k, v in chosen(golden, {k: v for k, (_, v) in grouped[0].items()},
                                                    ranges).items()})
    return grouped, notes
