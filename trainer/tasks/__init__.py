"""The registry of training tasks: flag value -> module holding the task's class.

Modules are imported only when selected, so choosing one task never pays for another's
imports. Adding a task is one module with a `TASK` attribute plus one line here.
"""

from __future__ import annotations

import importlib

from trainer.common.errors import UserError
from trainer.tasks.base import Task

DEFAULT_TASK = "speech-recognition"

_TASK_MODULES = {
    "image-classification": "trainer.tasks.image",
    "speech-recognition": "trainer.tasks.speech",
    "text-classification": "trainer.tasks.text",
}


def task_names() -> list[str]:
    return sorted(_TASK_MODULES)


def load_task(name: str) -> type[Task]:
    if name not in _TASK_MODULES:
        raise UserError(f'Unknown task "{name}": choose one of {", ".join(task_names())}.')
    return importlib.import_module(_TASK_MODULES[name]).TASK


__all__ = ["DEFAULT_TASK", "Task", "load_task", "task_names"]
