"""The sweep's tasks by name: ``--task golden|compare|lens|attribute|loss`` (refgpt/sweep/tasks.py)."""

from __future__ import annotations

from ..errors import RefGPTError
from .task_attribute import AttributeTask
from .task_compare import CompareTask
from .task_golden import GoldenTask
from .task_lens import LensTask
from .task_loss import LossTask
from .tasks import Task

#: The tasks, in the order `refgpt sweep --help` lists them.
TASKS = {t.name: t for t in (GoldenTask, CompareTask, LensTask, AttributeTask, LossTask)}


def task_class(name: str) -> type[Task]:
    if name not in TASKS:
        raise RefGPTError(f"no sweep task {name!r} (choose from {', '.join(TASKS)})")
    return TASKS[name]
