"""The registry of training tasks: flag value -> module holding the task's class.

Modules are imported only when selected, so choosing one task never pays for another's
imports. Adding a task is one module with a `TASK` attribute plus one line here (and its
flags in trainer/settings/task_flags.py).
"""

from __future__ import annotations

import importlib

from trainer.common.errors import UserError
from trainer.settings.run_config import RunConfig
from trainer.settings.task_flags import DEFAULT_TASK, task_names
from trainer.tasks.base import Task

_TASK_MODULES = {
    "image-classification": "trainer.tasks.image",
    "speech-recognition": "trainer.tasks.speech",
    "text-classification": "trainer.tasks.text",
}


def load_task(name: str) -> type[Task]:
    if name not in _TASK_MODULES:
        raise UserError(f'Unknown task "{name}": choose one of {", ".join(task_names())}.')
    return importlib.import_module(_TASK_MODULES[name]).TASK


def task_name(task_class: type[Task]) -> str:
    """The `--task` value of a task class."""
    return next(name for name in task_names() if load_task(name) is task_class)


def build_task(config: RunConfig) -> Task:
    """The task of a run's configuration."""
    options = config.task_options
    return load_task(config.task)(config.model, config.data, options, config.training.values)


__all__ = ["DEFAULT_TASK", "Task", "build_task", "load_task", "task_name", "task_names"]
