"""``--task attribute``: exact logit attribution (refgpt/analysis/attribution.py) over a corpus.

Two modes:

- ``target`` given (text that is one token, or an id; ``against`` optional): the logit of the
  target (minus the logit of ``against``) at position ``pos`` (default −1, the last) of each
  prompt, split into every component;
- no target: at every position j, the logit of the prompt's own next token j + 1. The pass runs
  on tokens[:−1] (position j's logit depends on tokens 0..j only), each position with its own
  target.

``granularity`` "layer" (default), "head" or "neuron", as ``refgpt attribute``. Per prompt: the
components' labels, and per component the sum over the attributed positions of its contribution
and of its absolute value (fsum), the positions counted, the sum of the logits attributed and the
largest |Σ components − logit| (the decomposition is exact up to rounding). Summary: per
component the corpus mean contribution and mean |contribution| per attributed position, and the
20 components largest in mean |contribution|.
"""

from __future__ import annotations

import math

import numpy as np

from ..analysis.attribution import GRANULARITIES, attribute, required_hooks
from ..errors import RefGPTError
from ..tl.decomposition import token_id
from .tasks import Task, fsum_rows, known_options, ratio

TOP = 20


class AttributeTask(Task):
    name = "attribute"

    @classmethod
    def check_options(cls, options: dict) -> dict:
        options = known_options(cls.name, options, {"target": None, "against": None, "pos": -1, "granularity": "layer"})
        if options["granularity"] not in GRANULARITIES:
            raise RefGPTError(f"--granularity must be one of {list(GRANULARITIES)}, found {options['granularity']!r}")
        for key in ("target", "against"):
            value = options[key]
            if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int))):
                raise RefGPTError(f"--{key}: a token is text or an integer id, found {value!r:.40}")
        if options["against"] is not None and options["target"] is None:
            raise RefGPTError("--against needs --target (without a target, each position's next token is attributed)")
        if isinstance(options["pos"], bool) or not isinstance(options["pos"], int):
            raise RefGPTError(f"--pos must be an integer, found {options['pos']!r:.40}")
        if options["target"] is None and options["pos"] != -1:
            raise RefGPTError("--pos goes with --target (without a target, every position is attributed)")
        return options

    @property
    def min_tokens(self):
        return 2 if self.options["target"] is None else 1

    def __init__(self, model, options, out):
        super().__init__(model, options, out)
        self.target = None if options["target"] is None else token_id(model, options["target"], "--target")
        self.against = None if options["against"] is None else token_id(model, options["against"], "--against")

    def run(self, model, tokens, prompt) -> dict:
        names = required_hooks(model.cfg, logits=False)
        if self.target is None:
            logits, cache = model.run_with_cache(tokens[None, :-1], names=names)  # [1, pos − 1, d_vocab]
            result = attribute(cache, tokens[None, 1:], granularity=self.options["granularity"], logits=logits)
            values, logit, where = result.values[:, 0], result.logit[0], None  # [component, pos − 1], [pos − 1]
        else:
            pos = self.options["pos"]
            if not -len(tokens) <= pos < len(tokens):
                raise RefGPTError(f"--pos {pos} is outside the prompt's {len(tokens)} positions")
            where = pos % len(tokens)
            logits, cache = model.run_with_cache(tokens[None], names=names)  # [1, pos, d_vocab]
            result = attribute(cache, self.target, self.against, granularity=self.options["granularity"], logits=logits)
            values, logit = result.values[:, 0, where:where + 1], result.logit[0, where:where + 1]  # [component, 1], [1]
        return {"labels": result.labels, "position": where, "n_positions": int(values.shape[1]),
                "sum": fsum_rows(values), "abs_sum": fsum_rows(np.abs(values)),
                "logit_sum": math.fsum(logit.tolist()), "max_error": result.check()}

    @classmethod
    def summarize(cls, results) -> dict:
        labels, total, absolute, n, logit, error, prompts = None, None, None, 0, 0.0, 0.0, 0
        for prompt_id, r in results:
            if labels is None:
                labels, total, absolute = r["labels"], np.zeros(len(r["labels"])), np.zeros(len(r["labels"]))
            elif r["labels"] != labels:
                raise RefGPTError(f"prompt {prompt_id!r}: its record's components differ from the first prompt's")
            total += np.asarray(r["sum"], dtype=np.float64)  # elementwise, in prompt order
            absolute += np.asarray(r["abs_sum"], dtype=np.float64)
            n += r["n_positions"]
            logit += r["logit_sum"]
            error = max(error, r["max_error"])
            prompts += 1
        if labels is None:
            return {"prompts": 0, "positions": 0}
        mean, mean_abs = total / n, absolute / n
        order = np.argsort(-mean_abs, kind="stable")[:TOP]
        return {"prompts": prompts, "positions": n, "logit_mean": ratio(logit, n), "max_error": error,
                "labels": labels, "mean": mean.tolist(), "mean_abs": mean_abs.tolist(),
                "top": [{"component": labels[i], "mean": float(mean[i]), "mean_abs": float(mean_abs[i])} for i in order]}
