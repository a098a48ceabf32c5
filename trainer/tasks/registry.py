"""The registry of tasks: one `TaskSpec` per `--task` value, registered once.

Adding a task is one module holding its spec (and the code the spec names) plus one entry in
`REGISTERED` (or a `register` call, for a task defined outside this package). Every table
keyed by task name that the command line, resolution, the preflight, the server, offline
predictions and the model registry need is derived from here. Importing it loads no torch or
transformers (the task modules' training code is imported by `load_task`, when selected).

The order of registration is the order tasks are asked: the first task that claims a model's
config.json is its task (Whisper before the classifiers), and the first whose local layout a
dataset directory has is its task (a Common Voice directory holds .tsv tables too, so speech
is asked before text; a folder of chats is text generation's, asked before a table of labelled
texts). Preference tuning claims no model (its causal language models are text generation's,
and its delivered model is one: `serves_as`), so its place only orders the layouts: a folder
of `chosen`/`rejected` tables is its, asked before text generation's folders (whose `prompt`
column such a table may share) and before the labelled texts; and a command line whose model
text generation claims is preference tuning's when its data is in this layout
(trainer/config/task_inference.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.common.errors import UserError
from trainer.tasks.image_classification import spec as image_classification
from trainer.tasks.preference_tuning import spec as preference_tuning
from trainer.tasks.speech_recognition import spec as speech_recognition
from trainer.tasks.task_spec import TaskSpec
from trainer.tasks.text_classification import spec as text_classification
from trainer.tasks.text_generation import spec as text_generation

if TYPE_CHECKING:
    from trainer.settings.run_config import RunConfig
    from trainer.tasks.base import Task

REGISTERED: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        speech_recognition.SPEC,
        image_classification.SPEC,
        preference_tuning.SPEC,
        text_generation.SPEC,
        text_classification.SPEC,
    )
}
"""`--task` value -> its spec, in the order tasks are asked."""

DEFAULT_TASK = speech_recognition.SPEC.name
"""The task of a command line that names none and whose model and data say none (the demo)."""


def register(spec: TaskSpec) -> TaskSpec:
    """Add a task defined outside this package; it is asked after those registered before."""
    if spec.name in REGISTERED:
        raise ValueError(f"a task named {spec.name} is registered already")
    REGISTERED[spec.name] = spec
    return spec


def refining_tasks(name: str) -> list[TaskSpec]:
    """The tasks that train `name`'s models further and deliver one of them (`serves_as`)."""
    return [spec for spec in registered() if spec.serves_as == name]


def registered() -> list[TaskSpec]:
    """Every task's spec, in the order tasks are asked."""
    return list(REGISTERED.values())


def task_names() -> list[str]:
    return sorted(REGISTERED)


def task_spec(name: str) -> TaskSpec:
    if name not in REGISTERED:
        raise UserError(f'Unknown task "{name}": choose one of {", ".join(task_names())}.')
    return REGISTERED[name]


def load_task(name: str) -> type[Task]:
    """The task's training class (its module imported now)."""
    return task_spec(name).task_class()


def task_of_model(config: dict) -> str | None:
    """The task a model's config.json is for: the first task that claims it; None when no
    task does (an encoder-decoder text-to-text model, say), never a guess."""
    return next((spec.name for spec in registered() if spec.claims_model(config)), None)


def build_task(config: RunConfig) -> Task:
    """The task of a run's configuration, its flags typed again."""
    spec = task_spec(config.task)
    options = spec.flags(**config.task_options)
    return spec.task_class()(config.model, config.data, options, config.training.values)
