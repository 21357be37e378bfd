"""Decode goldens: the prompt pass and every KV-cached decoding step, as a port's cached step computes it.

A port's generation loop runs the prompt once, filling a key/value cache, then feeds one token per
step, attending over the cache. ``make`` records that loop in refgpt (refgpt/gpt2/kv_cache.py), step
by step, under refgpt's golden names with a step prefix:

    step.S.tokens                  [batch, new]                the tokens step S feeds (the prompt at S = 0)
    step.S.position_ids            [batch, new]                their positions
    step.S.<hook point>            [batch, new, …]             step S's activations, the new positions only;
                                   [batch, head, new, keys]    attention scores and pattern: the new queries
                                                               against every key so far (the cache and these)
    step.S.blocks.L.ln1.out …      [batch, new, d_model]       each LayerNorm's output
    step.S.blocks.L.attn.cache_k   [batch, keys, head, d_head] the KV cache of layer L after step S (keys,
    step.S.blocks.L.attn.cache_v                               values): every position so far, these included
    step.S.logits, step.S.log_probs [batch, new, d_vocab]
    step.S.chosen                  [batch]                     the token step S chooses, fed at step S + 1:
                                                               greedy (the arg-max of its last logits, ties
                                                               to the lowest id) or a forced continuation's

Steps run S = 0 … N − 1 for N generated tokens (as HF's ``generate(max_new_tokens=N)`` runs N
passes: the last chosen token is never fed); ``tokens`` [batch, prompt + N] is the prompt and the N
chosen tokens. With a padded prompt (several prompts of different lengths, left-padded, as every
batched generator pads) the file also holds ``attention_mask`` [batch, prompt + N] (1 real, 0 pad;
the chosen tokens are real), and positions are each row's real tokens before it (refgpt/gpt2/padding.py).

The metadata's ``decode`` says how many steps, the prompt length, greedy or forced, and the cache
layout (HF's ``past_key_values`` are [batch, head, pos, d_head]: the name maps transpose). c_X, r_X
and f_X (refgpt/oracle/golden.py) are measured per step tensor from refgpt's float32 decode, forced
along the float64 one's tokens, from the same decode with one more random rounding at every hook
point (refgpt/oracle/perturbed.py), and from the sequential port's full pass over the whole sequence,
whose rows at a step's positions are, in exact arithmetic, that step's numbers.

``refgpt compare`` walks the steps in order (refgpt/oracle/name_maps.py, ``forward_key``) and names
the first divergent (step, tensor) with its row and absolute position (refgpt/oracle/comparison.py).
"""

from __future__ import annotations

import json

import numpy as np

from ..errors import RefGPTError
from ..gpt2.activations import log_softmax
from ..gpt2.ln_views import cached_output
from ..gpt2.padding import position_ids
from ..model import Model
from . import golden, perturbed, sequential
from .name_maps import forward_order, split_step

CACHE = ("attn.cache_k", "attn.cache_v")


def step_name(step: int, name: str) -> str:
    return f"step.{step}.{name}"


def run(model: Model, prompt, steps: int, continuation=None, attention_mask=None, progress=None, past=None):
    """(tensors, chosen [batch, steps]) of the decode loop in ``model``'s dtype (module docstring).

    ``continuation`` [batch, steps]: the tokens each step chooses, forced (None: greedy). ``progress``:
    called with (step, steps) after each step. ``past``: the KV cache to decode with (default a new
    ``model.kv_cache``; tests give a port's, with a planted bug)."""
    cfg = model.cfg
    prompt, _ = model.check_tokens(prompt)  # [batch, P]
    batch, P = prompt.shape
    past = model.kv_cache(batch) if past is None else past
    out, chosen = {}, np.zeros((batch, steps), dtype=np.int64)
    mask = None if attention_mask is None else np.asarray(attention_mask, np.int64)  # [batch, P]
    feed = prompt
    for S in range(steps):
        start = past.length
        new = feed.shape[1]
        step_mask = (mask if S == 0 else np.ones((batch, 1), np.int64)) if mask is not None else None
        logits, cache = model.run_with_cache(feed, past=past, attention_mask=step_mask)  # [batch, new, d_vocab]
        t = {"tokens": feed}
        if mask is None:
            t["position_ids"] = np.broadcast_to(np.arange(start, start + new), (batch, new)).copy()
        else:
            full = np.concatenate([mask, np.ones((batch, start + new - P), np.int64)], axis=1)  # [batch, keys]
            t["position_ids"] = np.where(full[:, start:] == 1, position_ids(full, start), 0)  # [batch, new], pads 0
        for name in model.hook_names:
            t[name] = np.asarray(cache[name])
            if name.endswith("hook_normalized"):
                prefix = name[: -len("hook_normalized")]
                t[prefix + "out"] = cached_output(cache, prefix)  # [batch, new, d_model]
        for L in range(cfg.n_layers):
            t[f"blocks.{L}.attn.cache_k"] = past.keys[L, :, : past.length].copy()  # [batch, keys, head, d_head]
            t[f"blocks.{L}.attn.cache_v"] = past.values[L, :, : past.length].copy()
        t["logits"], t["log_probs"] = logits, log_softmax(logits)
        chosen[:, S] = logits[:, -1].argmax(-1) if continuation is None else continuation[:, S]
        t["chosen"] = chosen[:, S].copy()
        out.update({step_name(S, n): a for n, a in t.items()})
        feed = chosen[:, S:S + 1]
        if progress is not None:
            progress(S + 1, steps)
    return out, chosen


def make(model: Model, prompt, steps: int, continuation=None, attention_mask=None, command=None,
         progress=None) -> golden.Golden:
    """A decode golden (module docstring) of ``steps`` generated tokens after ``prompt`` [batch, P]:
    greedy, or along ``continuation`` [batch, steps] (forced); ``attention_mask`` [batch, P] for a
    left-padded prompt. ``progress(done, total)`` is called as the passes run."""
    cfg = model.cfg
    prompt, _ = model.check_tokens(prompt)  # [batch, P]
    batch, P = prompt.shape
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise RefGPTError(f"--generate: the number of steps must be a whole number ≥ 1, found {steps!r}")
    if P + steps - 1 > cfg.n_ctx:
        raise RefGPTError(f"--generate {steps}: {P} prompt tokens + {steps - 1} fed steps exceed the model's "
                          f"context of {cfg.n_ctx} positions")
    if continuation is not None:
        continuation, _ = model.check_tokens(continuation)
        if continuation.shape != (batch, steps):
            raise RefGPTError(f"forced continuation: shape {list(continuation.shape)}, expected [{batch}, {steps}]")
    if attention_mask is not None:
        attention_mask = np.asarray(attention_mask, np.int64)
        if attention_mask.shape != prompt.shape or not np.isin(attention_mask, (0, 1)).all():
            raise RefGPTError(f"attention_mask: must be 0/1 of the prompt's shape {list(prompt.shape)}")
        if (attention_mask[:, -1] == 0).any():
            raise RefGPTError("decoding a padded batch needs left padding: every row's last prompt token must be "
                              "real (pass --padding-side left)")
    total = 3 * steps
    done = [0]

    def tick(*_):
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    exact = model if model.dtype == np.float64 else Model(cfg, dict(model.params), dtype="float64")
    tensors, chosen = run(exact, prompt, steps, continuation, attention_mask, tick)
    rounded = golden.float32_twin(model)
    f32, _ = run(rounded, prompt, steps, chosen, attention_mask, tick)  # along the float64 decode's tokens
    with rounded.hooks(perturbed.hooks()):  # the perturbed pass (refgpt/oracle/perturbed.py), along them too
        mc, _ = run(rounded, prompt, steps, chosen, attention_mask)
    sequence = np.concatenate([prompt, chosen], axis=1)  # [batch, P + steps]
    full_mask = None if attention_mask is None else np.concatenate(
        [attention_mask, np.ones((batch, steps), np.int64)], axis=1)  # [batch, P + steps]
    fed = P + steps - 1
    twin = sequential.compute(cfg, rounded.params, sequence[:, :fed], None,
                              attention_mask=None if full_mask is None else full_mask[:, :fed])
    done[0] = total - 1
    tick()
    errors = golden.ErrorModel()
    for name, r in tensors.items():
        if r.dtype.kind == "f":
            errors.add(name, r, f32[name], _twin_rows(twin, name, tensors), mc[name])
        step, inner = split_step(name)
        if inner == "log_probs":  # each step's softmax, as llm.c keeps it (its per-step dumps' probs)
            errors.add(step_name(step, "probs"), np.exp(r), np.exp(f32[name].astype(np.float64)),
                       _twin_rows(twin, step_name(step, "probs"), tensors), np.exp(mc[name].astype(np.float64)))
    out = {"tokens": sequence, **({"attention_mask": full_mask} if full_mask is not None else {}), **tensors}
    out = {n: out[n] for n in forward_order(out)}
    info = {"steps": int(steps), "prompt_length": int(P), "continuation": "greedy" if continuation is None else "forced",
            "new_per_step": [int(P)] + [1] * (steps - 1),
            "cache": "step.S.blocks.L.attn.cache_k / cache_v: layer L's keys and values after step S, "
                     "[batch, pos, head, d_head] (HF's past_key_values: [batch, head, pos, d_head])",
            "padding": None if attention_mask is None else "left"}
    metadata = {**golden.provenance(model, command), **errors.metadata(), "error_model": golden.ERROR_MODEL,
                "decode": json.dumps(info), "targets": "none (a decode golden has no loss)"}
    return golden.Golden(out, metadata)


def _twin_rows(twin, name, tensors):
    """The sequential port's full-pass value at decode tensor ``name``'s positions (None if it has none)."""
    step, inner = split_step(name)
    start = sum(tensors[step_name(s, "tokens")].shape[1] for s in range(step))  # positions before the step
    return step_rows(twin, inner, start, start + tensors[step_name(step, "tokens")].shape[1])


def step_rows(full: dict, inner: str, start: int, end: int):
    """A decode step's tensor ``inner`` (new positions start … end − 1) cut from a full forward pass's
    tensors ``full`` (golden names, over at least ``end`` positions): the rows of the new positions;
    attention scores and patterns those queries against keys 0 … end − 1; the KV cache after the step
    (``attn.cache_k``/``cache_v``) the keys (values) of positions 0 … end − 1. None when ``full``
    lacks it, or for tokens, chosen and position_ids, which a full pass does not make."""
    if inner.endswith(CACHE):
        source = full.get(inner[: -len("cache_k")] + ("hook_k" if inner.endswith("cache_k") else "hook_v"))
        return None if source is None else np.asarray(source)[:, :end]  # [batch, keys, head, d_head]
    source = full.get(inner)
    if source is None or inner in ("tokens", "chosen", "position_ids", "targets", "loss"):
        return None
    source = np.asarray(source)
    if inner.endswith(("attn.hook_attn_scores", "attn.hook_pattern")):
        return source[:, :, start:end, :end]  # [batch, head, new, keys]
    return source[:, start:end]


def info(g: golden.Golden) -> dict | None:
    """The ``decode`` metadata of a decode golden (None for any other golden)."""
    text = g.metadata.get("decode")
    if not text:
        return None
    from .. import strict_json

    return strict_json.loads(text, "golden metadata 'decode'")


__all__ = ["make", "run", "info", "step_name", "step_rows"]
