"""``--task compare``: each prompt's candidate file against the reference's pass on that prompt.

CANDIDATES is a directory holding one file per prompt, named by the prompt's record name or by
its id: ``ID.HASH.safetensors`` (the names ``--task golden`` gives, so a port can write its
activations beside refgpt's goldens' names), or ``ID.safetensors``; ``.npz`` too (e.g.
``7.npz`` for the prompt of line 7). Exactly one must exist; none, or two, fails that prompt.
The reference is made on the worker, in memory (``golden.make``: every activation and its
conditioning c_X; with ``backward`` every gradient), and compared as ``refgpt compare`` compares
(refgpt/oracle/comparison.py; ``name_map``, ``profile`` or ``atol``/``rtol`` as there).

Per prompt, a verdict: ``ok``, the first tensor out of tolerance and its status, every tensor out
of tolerance (forward order), what the candidate lacks, and the logits' agreement; the
candidate's sha256 (a re-run skips the prompt only while the candidate is unchanged). Summary:
how many candidates pass, and per tensor how often it is the *first* to fail and how often it
fails at all — where ports diverge, most common first.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from ..errors import RefGPTError
from ..oracle import comparison, golden
from ..oracle.name_maps import MAPS
from .prompts import escaped_id
from .task_golden import file_identity
from .tasks import Task, known_options

SUFFIXES = (".safetensors", ".npz")


class CompareTask(Task):
    name = "compare"
    min_tokens = 2

    @classmethod
    def check_options(cls, options: dict) -> dict:
        options = known_options(cls.name, options, {"candidates": None, "name_map": "refgpt", "profile": None,
                                                    "atol": None, "rtol": None, "backward": False})
        if options["candidates"] is None:
            raise RefGPTError("--task compare needs --candidates DIR (one candidate file per prompt)")
        directory = Path(options["candidates"]).absolute()
        if not directory.is_dir():
            raise RefGPTError(f"--candidates {directory}: not a directory")
        if options["name_map"] not in MAPS:
            raise RefGPTError(f"--map must be one of {list(MAPS)}, found {options['name_map']!r}")
        if options["profile"] is not None and (options["atol"] is not None or options["rtol"] is not None):
            raise RefGPTError("give either --profile or --atol/--rtol, not both")
        if options["profile"] is not None and options["profile"] not in comparison.UNIT_ROUNDOFF:
            raise RefGPTError(f"--profile must be one of {sorted(comparison.UNIT_ROUNDOFF)}, found {options['profile']!r}")
        return {**options, "candidates": str(directory), "backward": bool(options["backward"])}

    def __init__(self, model, options, out):
        super().__init__(model, options, out)
        self.directory = Path(options["candidates"])
        if not self.directory.is_dir():  # on a cluster: every worker must see it
            raise RefGPTError(f"--candidates {self.directory}: not a directory on this worker")

    def candidate(self, prompt) -> Path:
        names = [f"{stem}{suffix}" for stem in (prompt.stem, escaped_id(prompt.id)) for suffix in SUFFIXES]
        found = [self.directory / n for n in names if (self.directory / n).is_file()]
        if not found:
            raise RefGPTError(f"no candidate for prompt {prompt.id!r} in {self.directory} (looked for "
                              f"{', '.join(names)})")
        if len(found) > 1:
            raise RefGPTError(f"two candidates for prompt {prompt.id!r}: {found[0].name} and {found[1].name}")
        return found[0]

    def run(self, model, tokens, prompt) -> dict:
        path = self.candidate(prompt)
        reference = golden.make(model, tokens, command=["refgpt", "sweep", "--task", "compare", "--prompt-id", prompt.id],
                                backward=self.options["backward"])
        o = self.options
        report = comparison.compare(reference, path, atol=o["atol"], rtol=o["rtol"], profile=o["profile"],
                                    name_map=o["name_map"])
        first = report.first_divergence
        return {"candidate": file_identity(path, str(path)), "ok": report.ok,
                "first_divergence": first.name if first else None, "first_status": first.status if first else None,
                "out_of_tolerance": [t.name for t in report.tensors if not t.ok], "compared": len(report.tensors),
                "missing": report.missing, "too_little": report.too_little,
                "logits": asdict(report.logits) if report.logits else None}

    def files(self, result) -> list[dict]:
        return [result["candidate"]]

    @classmethod
    def summarize(cls, results) -> dict:
        ok, not_ok, first, failing, failed_ids = 0, 0, {}, {}, []
        for prompt_id, r in results:
            if r["ok"]:
                ok += 1
                continue
            not_ok += 1
            failed_ids.append(prompt_id)
            if r["first_divergence"] is not None:
                first[r["first_divergence"]] = first.get(r["first_divergence"], 0) + 1
            for name in r["out_of_tolerance"]:
                failing[name] = failing.get(name, 0) + 1

        def ranked(counts):
            return [{"tensor": name, "prompts": n} for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]

        return {"candidates": ok + not_ok, "ok": ok, "not_ok": not_ok, "first_divergence": ranked(first),
                "out_of_tolerance": ranked(failing), "not_ok_prompts": failed_ids}
