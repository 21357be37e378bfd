"""refgpt.sweep: one task over a corpus of prompts — in this process, or on Dask — with results
that do not depend on how many workers ran it or in what order they finished.

    from refgpt.sweep import run_sweep
    result = run_sweep("prompts.txt", "loss", "out/", workers=2)     # or `refgpt sweep` (docs/sweep.md)

The room sits above analysis and oracle (its tasks are theirs: lens, attribution, golden files,
comparison) and below the CLI. Dask is an optional extra (``pip install 'refgpt[dask]'``), imported
only by refgpt/sweep/on_dask.py, and only when a sweep runs on it; ``workers=0`` needs none.

- prompts.py    PROMPTS files; each prompt's id, content hash, order and record name
- tasks.py      the task protocol; task_golden, task_compare, task_lens, task_attribute, task_loss;
                registry.py finds one by name
- worker.py     one process's side: the model loaded once, a prompt → its record
- records.py    OUT: records, sweep.json, manifest.jsonl, summary.json; verification; the lock
- driver.py     a sweep from start to end (run_sweep)
- on_dask.py    the LocalCluster, the worker plugin, batches of prompts as tasks
- progress.py   the progress line on a terminal
"""

from .driver import SweepResult, run_sweep
from .prompts import Prompt, read_prompts
from .registry import TASKS

__all__ = ["Prompt", "SweepResult", "TASKS", "read_prompts", "run_sweep"]
