"""``--task loss``: the next-token loss at every position of every prompt.

Per prompt: ``loss`` [pos − 1], the model's per-token loss ``model(tokens, return_type="loss",
loss_per_token=True)`` (nats, −log p of each next token), its ``loss_sum`` (fsum) and
``n_targets``. Summary: the corpus's mean loss per token (Σ loss_sum / Σ n_targets) and its
perplexity, the mean of the prompts' own means, and ``loss_by_position``: the mean loss at each
position, over the prompts long enough to have it.
"""

from __future__ import annotations

import math

import numpy as np

from .tasks import Task, floats, ratio


class LossTask(Task):
    name = "loss"
    min_tokens = 2

    def run(self, model, tokens, prompt) -> dict:
        loss = model(tokens[None], return_type="loss", loss_per_token=True)[0]  # [pos − 1]
        values = floats(loss)
        total = math.fsum(values)
        return {"loss": values, "loss_sum": total, "n_targets": len(values), "loss_mean": total / len(values)}

    @classmethod
    def summarize(cls, results) -> dict:
        total, n, prompt_means, prompts = 0.0, 0, 0.0, 0
        by_position, counts = np.zeros(0), np.zeros(0, dtype=np.int64)
        for _, r in results:
            total += r["loss_sum"]
            n += r["n_targets"]
            prompt_means += r["loss_mean"]
            prompts += 1
            loss = np.asarray(r["loss"], dtype=np.float64)  # [pos − 1]
            if len(loss) > len(by_position):
                by_position = np.concatenate([by_position, np.zeros(len(loss) - len(by_position))])
                counts = np.concatenate([counts, np.zeros(len(loss) - len(counts), dtype=np.int64)])
            by_position[:len(loss)] += loss  # elementwise: the same order for every position
            counts[:len(loss)] += 1
        mean = ratio(total, n)
        return {"prompts": prompts, "targets": n, "loss_mean": mean,
                "perplexity": math.exp(mean) if mean is not None else None,
                "prompt_loss_mean": ratio(prompt_means, prompts),
                "loss_by_position": (by_position / np.maximum(counts, 1)).tolist(),
                "prompts_by_position": counts.tolist()}
