"""A task is a folder (docs/tasks.md, "Adding a task"): every shipped task's code in
trainer/tasks/<task>/ with the same roles, trainer/tasks/ itself holding only what two tasks or
other packages share, and the import contracts naming every task folder. Also the shared hooks
a task with two models plans with (a frozen reference beside the trained model), and the
config recognisers' tables, read without importing transformers, against transformers' own."""

from __future__ import annotations

import importlib
from collections import defaultdict

import grimp
import pytest
import tomllib

from tests.support.helpers import REPO_ROOT
from trainer.common.step_time import ForwardFlops
from trainer.tasks import registered
from trainer.tasks.model_config import _auto_tables
from trainer.tasks.step_memory import TrainingFootprint

TASKS = REPO_ROOT / "trainer" / "tasks"
REQUIRED_ROLES = ("__init__.py", "spec.py", "training.py", "serving.py")
"""The light spec (flags, claims, layout, `SPEC`; no torch), the training side (its `Task`),
the serving side (its `Predictor`). A task whose delivered model is another task's
(`TaskSpec.serves_as`: preference tuning delivers a text-generation model) has no serving
side: that task's predictor serves it."""
OPTIONAL_ROLES = ("trainer.py", "demo.py")
"""Its Trainer subclass, its built-in demo."""


def task_folders() -> list[str]:
    return sorted(p.name for p in TASKS.iterdir() if (p / "__init__.py").is_file())


def shipped_specs():
    return [spec for spec in registered() if spec.training.startswith("trainer.tasks.")]


def test_every_shipped_task_is_a_folder_with_the_roles():
    assert sorted(spec.name.replace("-", "_") for spec in shipped_specs()) == task_folders()
    for spec in shipped_specs():
        package = f"trainer.tasks.{spec.name.replace('-', '_')}"
        files = {path.name for path in (TASKS / package.rsplit(".", 1)[1]).glob("*.py")}
        roles = [r for r in REQUIRED_ROLES if not (spec.serves_as and r == "serving.py")]
        assert set(roles) <= files, (spec.name, sorted(files))
        assert importlib.import_module(f"{package}.spec").SPEC is spec
        assert spec.training.partition(":")[0] == f"{package}.training"
        if spec.serves_as:
            assert "serving.py" not in files and spec.predictor is None, spec.name
        else:
            assert spec.predictor.__module__ == f"{package}.serving"
        assert spec.demo in (None, f"{package}.demo")
        assert (spec.demo is None) == ("demo.py" not in files), spec.name
        if "trainer.py" in files:
            assert trainer_subclasses(f"{package}.trainer"), f"{package}.trainer"


def trainer_subclasses(module_name: str) -> list[type]:
    """The `transformers.Trainer` subclasses a module defines."""
    from transformers import Trainer

    module = importlib.import_module(module_name)
    return [value for value in vars(module).values() if isinstance(value, type)
            and issubclass(value, Trainer) and value.__module__ == module_name]  # fmt: skip


def test_trainer_tasks_keeps_only_what_is_shared():
    """A module of trainer/tasks/ itself is imported by two or more task folders, or by code
    outside the task folders; one that only one task uses belongs in that task's folder."""
    graph = grimp.build_graph("trainer", cache_dir=None)  # no .grimp_cache in the checkout
    folders = [f"trainer.tasks.{name}" for name in task_folders()]
    used_by = defaultdict(set)
    for path in TASKS.glob("[!_]*.py"):
        module = f"trainer.tasks.{path.stem}"
        for importer in graph.find_modules_that_directly_import(module):
            folder = next((f for f in folders if importer.startswith(f"{f}.")), None)
            used_by[module].add(folder or "elsewhere")
    single = {module: users for module, users in used_by.items()
              if len(users) == 1 and "elsewhere" not in users}  # fmt: skip
    assert single == {}, "used by one task only: move it into that task's folder"


def test_the_import_contracts_name_every_task_folder():
    contracts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    folders = {f"trainer.tasks.{name}" for name in task_folders()}
    by_type = {contract["type"]: contract for contract in contracts["contracts"]}
    assert set(by_type["independence"]["modules"]) == folders
    forbidden = [c for c in contracts["contracts"] if c["type"] == "forbidden"]
    assert any(set(c["forbidden_modules"]) == folders for c in forbidden)


@pytest.mark.parametrize("table", sorted(_auto_tables()))
def test_the_auto_tables_read_from_source_are_transformers_own(table):
    import transformers.models.auto.modeling_auto as auto

    assert _auto_tables()[table] == frozenset(getattr(auto, table))


def footprint(reference: int, zero_stage: int | None = None) -> TrainingFootprint:
    return TrainingFootprint(
        parameters=1000, trainable_parameters=1000, activation_values=10,
        checkpointed_activation_values=5, batch_size=1, mixed_precision=True,
        zero_stage=zero_stage, optimizer_offloaded=False, world_size=4,
        reference_parameters=reference,
    )  # fmt: skip


def test_a_frozen_reference_model_is_planned_beside_the_trained_one():
    """Full fine-tuning with a reference: its weights at the frozen width (16-bit under
    DeepSpeed's mixed precision), partitioned under ZeRO-3 like the policy's; no gradients or
    optimizer state for it. The default task hook adds none."""
    assert footprint(1000, 2).weight_bytes() - footprint(0, 2).weight_bytes() == 2 * 1000
    assert footprint(1000, 3).weight_bytes() - footprint(0, 3).weight_bytes() == 2 * 1000 / 4
    for part in ("gradient_bytes", "optimizer_bytes"):
        assert getattr(footprint(1000, 2), part)() == getattr(footprint(0, 2), part)()
    assert footprint(1000, 3).describe(False)["reference_parameters"] == 1000
    assert "reference_parameters" not in footprint(0, 3).describe(False)


def test_a_reference_forward_pass_is_counted_once_per_example():
    one = ForwardFlops(weights=100.0, trainable_weights=100.0, attention=10.0)
    two = ForwardFlops(weights=100.0, trainable_weights=100.0, attention=10.0, reference=110.0)
    for checkpointing in (False, True):
        assert two.training(checkpointing) - one.training(checkpointing) == 110.0
