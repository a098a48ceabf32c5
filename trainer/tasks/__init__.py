"""The training tasks: each is a `TaskSpec` (task_spec.py) registered in registry.py, with the
training code, predictor and checks it names. Importing this package loads no torch."""

from trainer.tasks.registry import (
    DEFAULT_TASK,
    build_task,
    load_task,
    register,
    registered,
    task_names,
    task_of_model,
    task_spec,
)

__all__ = [
    "DEFAULT_TASK",
    "build_task",
    "load_task",
    "register",
    "registered",
    "task_names",
    "task_of_model",
    "task_spec",
]
