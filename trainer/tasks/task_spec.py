"""`TaskSpec`: everything task-specific outside a task's training code, in one object.

Resolution, the command line, the preflight, the server, offline predictions and the model
registry ask a task's spec, never a table of their own keyed by task name: a task is a folder
(its spec in `spec.py`, the modules it names beside it) registered once
(trainer/tasks/registry.py). A spec and its module import no torch or transformers, so asking
every task which one a model's config.json is for loads neither
(tests/processes/test_registry_import.py); recognising a local dataset's layout reads the
folder's files (and, for images, `datasets`' list of image extensions). The training code it
names is imported only when a run trains or checks that task.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.settings.run_config import DemoAssets

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
    predictor: type[Predictor] | None = None
    """How a delivered model of this task serves: its pipeline, instances, parameters, answer
    format (the one `--do_predict` writes too), warm-up input, and how `python -m
    trainer.predict` reads a test set for it and scores the answers. None for a task whose
    delivered model is another task's (`serves_as`)."""
    serves_as: str | None = None
    """The task whose model this task trains further and delivers (preference tuning: a
    text-generation model), named instead of a predictor of its own: that task claims the
    delivered model's config.json, so the server, offline predictions and the model registry
    serve it with that task's predictor (resolved through the registry); no second copy."""
    lora_targets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Model type -> the modules that get LoRA adapters unless `--lora_target_modules` says."""
    default_model: str | None = None
    """The model a run with only a dataset fine-tunes (as the task's HF example script does)."""
    recipes: tuple[str, ...] = ()
    """Its recipes shipped in trainer/recipes/ (each also names the task itself)."""
    demo: str | None = None
    """The module of the task's built-in demo (its folder's `demo.py`), with two functions:
    `build_model(model_dir)`, a tiny model made offline, and `build_dataset(dataset_dir)`,
    its data; run with `demo_recipe` when a command line with this `--task` names neither
    model nor data (the default task's demo: with no `--task` either). None: the task has
    none. Each builder writes into an empty folder; the node renames it into place once it
    is complete (trainer/node/demo_assets.py)."""
    demo_recipe: str | None = None
    """The demo's recipe in trainer/recipes/."""
    demo_folders: tuple[str, str] | None = None
    """The demo's model and data folder names in the cache, versioned so that assets an older
    release built are not reused (bump them when the builders change); None: `<task>-model`
    and `<task>-data`."""

    def __post_init__(self) -> None:
        if (self.predictor is None) == (self.serves_as is None):
            raise ValueError(f"task {self.name}: give a predictor or serves_as, one of them")

    def demo_assets_in(self, root: Path) -> DemoAssets:
        """Where the demo's model and data are, or will be built, under `root`."""
        model, data = self.demo_folders or (f"{self.name}-model", f"{self.name}-data")
        return DemoAssets(model_dir=root / model, dataset_dir=root / data)

    def demo_builders(self) -> tuple[Callable[[Path], None], Callable[[Path], None]]:
        """The demo module's `build_model` and `build_dataset` (the module imported now)."""
        module = importlib.import_module(str(self.demo))
        return module.build_model, module.build_dataset

    def task_class(self) -> type:
        """Its `Task` subclass (trainer/tasks/base.py, which refers to this module)."""
        module, _, name = self.training.partition(":")
        return getattr(importlib.import_module(module), name)
