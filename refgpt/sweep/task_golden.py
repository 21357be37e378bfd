"""``--task golden``: one golden file per prompt (refgpt/oracle/golden.py), forward and with
``backward`` backward, in OUT/goldens/ID.HASH.safetensors.

The worker writes the file itself (atomically: refgpt/files/atomic_write.py), so on a cluster OUT
must be on a file system every worker shares; only the small record travels back. A forward
golden is streamed (``golden.write_streamed``: one stage of activations held at a time); with
``backward`` it is made whole and written (``golden.write``), as ``refgpt golden`` does. The
golden's ``command`` metadata names the sweep and the prompt, not the worker's own command line,
so a prompt's golden file is the same bytes whichever worker wrote it.

Per prompt: the file's name, sha256 and size (checked again before a re-run skips the prompt),
its tensor count, ``loss_sum`` and ``n_targets`` and the conditioning c_X of every tensor.
Summary: files and bytes, the corpus's mean loss, and per tensor the largest c_X met over the
corpus (the prompts that make a tensor ill-conditioned for a float32 port).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

from ..oracle import golden
from ..oracle.name_maps import forward_order
from .tasks import Task, floats, known_options, ratio

GOLDEN_DIR = "goldens"


def file_identity(path: Path, relative: str) -> dict:
    """{path, sha256, bytes} of a file."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return {"path": relative, "sha256": h.hexdigest(), "bytes": size}


class GoldenTask(Task):
    name = "golden"
    min_tokens = 2  # a golden file holds the loss of each next token

    @classmethod
    def check_options(cls, options: dict) -> dict:
        options = known_options(cls.name, options, {"backward": False, "names": None})
        names = options["names"]
        if names is not None:
            names = [names] if isinstance(names, str) else list(names)
        return {"backward": bool(options["backward"]), "names": names}

    def __init__(self, model, options, out):
        super().__init__(model, options, out)
        self.names = golden.select(model, options["names"]) if options["names"] else None  # checked once per worker

    def run(self, model, tokens, prompt) -> dict:
        relative = f"{GOLDEN_DIR}/{prompt.stem}.safetensors"
        path = self.out / relative
        command = ["refgpt", "sweep", "--task", "golden", *(["--backward"] if self.options["backward"] else []),
                   "--dtype", model.dtype.name, "--prompt-id", prompt.id]
        if self.options["backward"]:
            golden.write(path, golden.make(model, tokens, self.names, command=command, backward=True))
        else:
            golden.write_streamed(path, model, tokens, self.names, command=command)
        written = golden.read(path)
        loss = floats(written.tensors["loss"])
        result = {"file": file_identity(path, relative), "tensors": len(written.tensors),
                  "loss_sum": math.fsum(loss), "n_targets": len(loss), "conditioning": written.conditioning}
        del written  # the mapped file is let go
        return result

    def files(self, result) -> list[dict]:
        return [result["file"]]

    @classmethod
    def summarize(cls, results) -> dict:
        files, size, loss, n, worst = 0, 0, 0.0, 0, {}
        for prompt_id, r in results:
            files += 1
            size += r["file"]["bytes"]
            loss += r["loss_sum"]
            n += r["n_targets"]
            for name, c in r["conditioning"].items():
                if name not in worst or c > worst[name][0]:
                    worst[name] = (c, prompt_id)  # the first prompt (in id order) to reach the largest c_X
        return {"files": files, "bytes": size, "loss_mean": ratio(loss, n), "targets": n,
                "conditioning_max": {name: {"c_X": worst[name][0], "prompt": worst[name][1]}
                                     for name in forward_order(worst)}}
