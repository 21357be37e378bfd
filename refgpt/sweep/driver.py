"""A sweep from start to end: which prompts still need running, running them, the records, the
manifest and the summary.

    result = refgpt.sweep.run_sweep("prompts.txt", "lens", "out/", workers=2)

1. The prompts are read (refgpt/sweep/prompts.py) and the task's options checked (refgpt/sweep/tasks.py).
2. OUT is opened and locked (refgpt/sweep/records.py), the model identified by its weights' sha256
   (read here for a sweep on this machine; reported by the workers for ``scheduler=``), and OUT's
   sweep.json checked against this sweep.
3. Every prompt whose record exists and verifies is skipped; the rest run: in this process
   (``workers=0``), on an embedded LocalCluster (``workers=None``: sized to the machine, or N), or
   on the Dask cluster at ``scheduler`` (refgpt/sweep/on_dask.py).
4. Each record is written as it arrives, in whatever order the workers finish; a record computed
   with other weights than the sweep's is refused (the sweep stops: a worker reads another model).
5. At the end (also after Ctrl-C or an error) manifest.jsonl lists every prompt; when every prompt
   has a record, summary.json holds the task's reductions, computed from the records as written,
   in prompt-id order: the same bytes for a serial run, 1 worker or 20, in any completion order,
   and for a run resumed after an interrupt.

``SweepResult.failed`` lists the prompts that failed (id, one-line error); the sweep goes on past
them, and the ``refgpt sweep`` command exits with status 1 and their count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import strict_json
from ..dtypes import compute_dtype
from ..errors import RefGPTError
from ..version import __version__
from .progress import Progress
from .prompts import Prompt, read_prompts
from .records import SUMMARY_FORMAT, SweepDirectory, canonical
from .registry import task_class
from .worker import FORMAT_VERSION, Sweeper, SweepSpec, model_sha256


@dataclass
class SweepResult:
    out: Path
    total: int
    skipped: int  # prompts whose records existed and verified
    ran: int  # prompts run in this session
    failed: list[tuple[str, str]]  # (id, one-line error), in prompt-id order
    summary: dict | None  # None when some prompt has no record (interrupted)
    seconds: float
    where: str  # what ran the prompts
    notes: list[str] = field(default_factory=list)
    workers: dict = field(default_factory=dict)  # Dask worker address → what it ran with (pid, BLAS, malloc)

    @property
    def complete(self) -> bool:
        return self.summary is not None


class SerialExecutor:
    """The prompts run one after the other in this process (``workers=0``; no Dask needed)."""

    def __init__(self, spec: SweepSpec, expected_sha256: dict | None):
        self.spec, self.expected = spec, expected_sha256
        self.where, self.notes, self.model_sha256 = "serial, in this process", [], expected_sha256

    def start(self, todo):
        self.sweeper = Sweeper(self.spec, self.expected)
        self.model_sha256 = self.sweeper.model_sha256

    def run(self, prompts, batch_size=None):
        for prompt in prompts:
            yield prompt, self.sweeper.run(prompt)

    def close(self):
        self.sweeper = None


def run_sweep(prompts, task: str, out, *, options: dict | None = None, model=None, dtype="float64", bos=False,
              workers: int | None = None, scheduler: str | None = None, batch_size: int | None = None,
              blas_threads: int | None = None, prompts_format: str | None = None, progress=None,
              on_record=None) -> SweepResult:
    """Run ``task`` over ``prompts`` (a PROMPTS file, or Prompt objects) into ``out`` (module docstring).

    ``workers``: 0 runs in this process; None (default) an embedded LocalCluster sized to the
    machine; N a LocalCluster of N worker processes. ``scheduler``: the address of a running Dask
    scheduler instead. ``progress``: the stream for the progress line (default stderr; shown only
    on a terminal). ``on_record(prompt, record)`` is called after each record is written.
    """
    started = time.monotonic()
    prompts = read_prompts(prompts, prompts_format) if isinstance(prompts, (str, Path)) else _checked(prompts)
    options = task_class(task).check_options(dict(options or {}))
    dtype = compute_dtype(dtype).name
    if scheduler is not None and workers is not None:
        raise RefGPTError("give --workers N (a cluster on this machine) or --scheduler ADDR (a running one), not both")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0):
        raise RefGPTError(f"workers must be a whole number ≥ 0, found {workers!r}")
    if workers == 0 and blas_threads is not None:
        raise RefGPTError("--blas-threads sets the BLAS threads of Dask workers; --workers 0 runs in this process, "
                          "whose threads are yours (OPENBLAS_NUM_THREADS)")
    if model is not None and Path(model).is_dir():
        model = str(Path(model).absolute())  # workers may start elsewhere
    directory = SweepDirectory(out)
    executor, records, ran, progress_line, checked = None, {}, 0, None, False
    try:
        spec = SweepSpec(task, str(directory.path), options, None if model is None else str(model), dtype, bool(bos))
        local = scheduler is None
        sha = model_sha256(spec) if local else None
        todo = _todo(directory, prompts, spec, sha, records) if local else prompts
        checked = local
        if workers == 0:
            executor = SerialExecutor(spec, sha)
        elif todo:
            from .on_dask import DaskExecutor

            executor = DaskExecutor(spec, sha, workers=workers, scheduler=scheduler, blas_threads=blas_threads)
        if executor is not None and todo:
            executor.start(todo)
            if not local:
                sha = executor.model_sha256
                todo = _todo(directory, prompts, spec, sha, records)
                checked = True
        if todo:
            directory.remove_summary()
        progress_line = Progress(len(prompts), len(prompts) - len(todo), progress)
        for prompt, record in (executor.run(todo, batch_size) if todo else ()):
            if record["status"] == "ok" and record["provenance"]["model_sha256"] != sha:
                raise RefGPTError(f"a worker computed prompt {prompt.id!r} with other weights (sha256 "
                                  f"{record['provenance']['model_sha256']}) than the sweep's ({sha}): every "
                                  "worker must read the same model")
            directory.write_record(prompt, record)
            records[prompt.id] = record
            ran += 1
            progress_line.update(failed=record["status"] != "ok")
            if on_record is not None:
                on_record(prompt, record)
    finally:
        if progress_line is not None:
            progress_line.close()
        try:
            if executor is not None:
                executor.close()
        finally:
            if checked:  # OUT is this sweep's (never overwrite another sweep's manifest)
                directory.write_manifest(prompts, records)
            directory.close()
    summary = None
    if all(p.id in records for p in prompts):
        summary = _summary(directory, prompts, spec, sha)
        directory.write_summary(summary)
    failed = [(p.id, records[p.id]["error"]) for p in prompts if p.id in records and records[p.id]["status"] != "ok"]
    where = executor.where if executor is not None else "nothing to run"
    return SweepResult(directory.path, len(prompts), len(prompts) - len(todo), ran, failed, summary,
                       time.monotonic() - started, where, executor.notes if executor is not None else [],
                       getattr(executor, "reports", {}))


def _checked(prompts) -> list[Prompt]:
    prompts = list(prompts)
    if not prompts or not all(isinstance(p, Prompt) for p in prompts):
        raise RefGPTError("prompts: expected a PROMPTS file or a non-empty list of refgpt.sweep.Prompt")
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise RefGPTError(f"prompts: id {next(i for i in ids if ids.count(i) > 1)!r} appears twice")
    return sorted(prompts, key=lambda p: p.order)


def _identity(spec: SweepSpec, sha: dict) -> dict:
    """What OUT/sweep.json pins: a re-run must agree on all of it."""
    return {"task": spec.task, "options": spec.options, "model_sha256": sha, "dtype": spec.dtype, "bos": spec.bos,
            "refgpt_version": __version__}


def _todo(directory: SweepDirectory, prompts, spec: SweepSpec, sha: dict, records: dict) -> list[Prompt]:
    """The prompts without a verified record; ``records`` gets the verified ones (and failed ones)."""
    directory.check_spec(_identity(spec, sha), {"model": spec.model})
    todo = []
    for p in prompts:
        record = directory.verified(p, spec.task, sha, spec.dtype)
        if record is None:
            todo.append(p)
            failed = directory.read_record(p)
            if failed is not None and failed.get("status") == "failed":
                records[p.id] = failed  # listed as failed until it runs again
        else:
            records[p.id] = record
    return todo


def _summary(directory: SweepDirectory, prompts, spec: SweepSpec, sha: dict) -> dict:
    """summary.json: read back from the records as written, in prompt-id order."""
    records = [directory.read_record(p) for p in prompts]
    if any(r is None for r in records):
        raise RefGPTError(f"{directory.path}: a record changed while the summary was made; run the sweep again")
    ok = [(p.id, r["result"]) for p, r in zip(prompts, records) if r["status"] == "ok"]
    blas = {canonical({k: v for k, v in r["provenance"]["blas"].items() if k != "threads"})
            for r in records if r["status"] == "ok" and r["provenance"].get("blas")}
    return {"format": SUMMARY_FORMAT, "format_version": FORMAT_VERSION, **_identity(spec, sha),
            "blas": [strict_json.loads(b, "blas") for b in sorted(blas)],
            "prompts": len(prompts), "ok": len(ok), "failed": len(prompts) - len(ok),
            "failures": [{"id": p.id, "error": r["error"]} for p, r in zip(prompts, records) if r["status"] != "ok"],
            "result": task_class(spec.task).summarize(iter(ok))}
