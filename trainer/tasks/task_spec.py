"""`TaskSpec`: everything task-specific outside a task's training code, in one object.

Resolution, the command line, the preflight, the server, offline predictions and the model
registry ask a task's spec, never a table of their own keyed by task name: a task is its spec
and the modules it names, registered once (trainer/tasks/registry.py). A spec and its module
import no torch or transformers, so asking every task (which one a model's config.json is
for, which one a local dataset's files are laid out for) costs nothing; the training code it
names is imported only when a run trains or checks that task.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.data.sources import LocalLayout
    from trainer.tasks.predictor import Predictor


@dataclass(frozen=True)
class TaskSpec:
    name: str
    """The `--task` value."""
    flags: type
    """The frozen dataclass of the task's own flags (parsed beside the common ones)."""
    training: str
    """`module:Class` of its `Task` (trainer/tasks/base.py), imported when a run needs it."""
    claims_model: Callable[[dict], bool]
    """Whether a model's config.json is for this task (resolution, the server, the registry)."""
    detect_layout: Callable[[Path], LocalLayout]
    """A local dataset directory in this task's layout, or UserError saying why it is not."""
    predictor: type[Predictor]
    """How a delivered model of this task serves: its pipeline, instances, parameters, answer
    format (the one `--do_predict` writes too), warm-up input, and how `python -m
    trainer.predict` reads a test set for it and scores the answers."""
    lora_targets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Model type -> the modules that get LoRA adapters unless `--lora_target_modules` says."""
    default_model: str | None = None
    """The model a run with only a dataset fine-tunes (as the task's HF example script does)."""
    recipes: tuple[str, ...] = ()
    """Its recipes shipped in trainer/recipes/ (each also names the task itself)."""
    demo: str | None = None
    """`module:function(model_dir, dataset_dir)` building the task's built-in demo (a tiny
    model and a dataset made offline), run with `demo_recipe` when a command line with this
    `--task` names neither model nor data; None: the task has none (the default task's demo
    is trainer/node/demo_assets.py's)."""
    demo_recipe: str | None = None
    """The demo's recipe in trainer/recipes/."""

    def build_demo(self, model_dir: Path, dataset_dir: Path) -> None:
        module, _, name = (self.demo or "").partition(":")
        getattr(importlib.import_module(module), name)(model_dir, dataset_dir)

    def task_class(self) -> type:
        """Its `Task` subclass (trainer/tasks/base.py, which refers to this module)."""
        module, _, name = self.training.partition(":")
        return getattr(importlib.import_module(module), name)
