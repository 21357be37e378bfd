"""What runs a sweep's prompts, in one process: the model loaded once, then prompt after prompt.

A ``SweepSpec`` says what a sweep computes (task, options, model, dtype, --bos) and where it
writes (OUT): plain JSON, the same for every worker. A ``Sweeper`` is one process's side of it:
it loads the model once (``refgpt.load``: weights stored in the compute dtype are memory-mapped,
so workers on one machine share their pages), hashes its weight files once, prepares the task,
then turns each prompt into a record (refgpt/sweep/records.py). The serial sweep runs one in the
user's process; on Dask each worker holds one, made by a worker plugin (refgpt/sweep/on_dask.py).

A prompt that fails — tokens out of the vocabulary, longer than the context, too short for the
task, a missing candidate — becomes a record with ``status: "failed"`` and its one-line error; the
next prompt runs. Only Ctrl-C (KeyboardInterrupt) and SystemExit stop the loop.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import RefGPTError, one_line
from ..files.checkpoint import load
from ..files.default_model import default_model_path
from ..oracle.golden import weight_hashes
from ..version import __version__
from .prompts import Prompt
from .registry import task_class

RECORD_FORMAT = "refgpt-sweep-record"
FORMAT_VERSION = "1"


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep computes and where it writes; ``model`` None is the embedded default."""

    task: str
    out: str  # OUT, absolute
    options: dict = field(default_factory=dict)
    model: str | None = None
    dtype: str = "float64"
    bos: bool = False

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def key(self) -> str:
        """A short hash of the spec: names this sweep's worker plugin."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:12]

    def model_path(self):
        return self.model if self.model is not None else default_model_path()


def blas_info() -> dict:
    """The BLAS NumPy computes with in this process: library, version, kernel and threads
    (threadpoolctl, the ``dask`` and ``bench`` extras; without it, numpy's build information and no
    thread count). Another package may have loaded a BLAS of its own (scipy's OpenBLAS, in
    ``scipy.libs``): NumPy's is the one in its wheel's ``numpy.libs``, else the first one found."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        deps = np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
        return {"library": deps.get("name"), "version": deps.get("version"), "kernel": None, "threads": None}
    found = [info for info in threadpool_info() if info.get("user_api") == "blas"]
    numpy_libs = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    own = [info for info in found if Path(info.get("filepath") or "").resolve().parent == numpy_libs]
    for info in own or found:
        return {"library": info.get("internal_api"), "version": info.get("version"),
                "kernel": info.get("architecture"), "threads": info.get("num_threads")}
    return {"library": None, "version": None, "kernel": None, "threads": None}


class Sweeper:
    """One process's side of a sweep: the model, its identity, the task; ``run(prompt)`` → record."""

    def __init__(self, spec: SweepSpec, expected_sha256: dict | None = None):
        self.spec = spec
        self.model = load(spec.model_path(), dtype=spec.dtype)
        self.model_sha256 = weight_hashes(self.model.source)
        if expected_sha256 is not None and self.model_sha256 != expected_sha256:
            raise RefGPTError(f"{self.model.source}: the weights here (sha256 {_short(self.model_sha256)}) are not the "
                              f"sweep's (sha256 {_short(expected_sha256)}): every worker must read the same model")
        self.task = task_class(spec.task)(self.model, spec.options, Path(spec.out))
        self.lock = threading.Lock()  # a Dask worker with several threads runs one prompt at a time

    def provenance(self, tokens) -> dict:
        return {"model_sha256": self.model_sha256, "refgpt_version": __version__, "dtype": self.model.dtype.name,
                "numpy_version": np.__version__, "blas": blas_info(),
                "tokens": None if tokens is None else [int(t) for t in tokens]}

    def tokens(self, prompt: Prompt) -> np.ndarray:
        """The prompt's tokens [pos], checked: not empty, within the context and the vocabulary,
        as long as the task needs."""
        model = self.model
        if prompt.text is not None:
            if model.tokenizer is None:
                raise RefGPTError(f"{model.source} has no tokenizer for a text prompt; give tokens (JSONL \"tokens\")")
            tokens = list(model.to_tokens(prompt.text, prepend_bos=self.spec.bos, truncate=False)[0])  # [pos]
        else:
            tokens = list(prompt.tokens)
        if len(tokens) == 0:
            raise RefGPTError("the prompt is empty: no tokens to run" + (
                "" if self.spec.bos or prompt.text is None else " (--bos starts each text with <|endoftext|>)"))
        if len(tokens) > model.cfg.n_ctx:
            raise RefGPTError(f"the prompt is {len(tokens)} tokens long, but the model's context holds at most "
                              f"{model.cfg.n_ctx}")
        if len(tokens) < self.task.min_tokens:
            raise RefGPTError(f"the prompt is {len(tokens)} token{'s' if len(tokens) != 1 else ''} long; "
                              f"--task {self.spec.task} needs at least {self.task.min_tokens}")
        return model.check_tokens(tokens)[0][0]  # [pos] int64, every id within the vocabulary

    def run(self, prompt: Prompt) -> dict:
        """The prompt's record (refgpt/sweep/records.py): its result, or its one-line error."""
        tokens, result, error = None, None, None
        with self.lock:
            try:
                tokens = self.tokens(prompt)
                result = self.task.run(self.model, tokens, prompt)
            except RefGPTError as e:
                error = one_line(e)
            except MemoryError as e:
                error = f"out of memory{': ' + one_line(e) if str(e) else ''}"
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as e:  # a bug: recorded like any failure, and the sweep goes on
                error = f"internal error (please report): {type(e).__name__}: {one_line(e)}"
        return record(prompt, self.spec.task, self.provenance(tokens), result, error,
                      self.task.files(result) if error is None else [])


def record(prompt: Prompt, task: str, provenance: dict, result: dict | None, error: str | None, files=()) -> dict:
    """A prompt's record (refgpt/sweep/records.py), before it is sealed with its record_sha256."""
    return {"format": RECORD_FORMAT, "format_version": FORMAT_VERSION, "id": prompt.id,
            "content_sha256": prompt.content_sha256, "task": task, "status": "ok" if error is None else "failed",
            "error": error, "provenance": provenance, "result": result, "files": list(files)}


def _short(hashes: dict) -> str:
    return ", ".join(f"{name} {h[:12]}…" for name, h in sorted(hashes.items())) or "none"


def model_sha256(spec: SweepSpec) -> dict:
    """{weight file: sha256} of the spec's model, read here without loading it (the same hashes a
    Sweeper computes; remembered per file, refgpt.oracle.golden.weight_hashes)."""
    path = spec.model_path()
    directory = Path(path)
    if not directory.is_dir():
        from ..files.hub import resolve

        directory = resolve(path)
    return weight_hashes(directory)
