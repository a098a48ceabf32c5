"""A run's settings, as every process of the run reads them: typed, frozen, decided once.

trainer/config/resolve.py builds the `RunConfig` from the command line, the environment the
launcher saw and the node's hardware; the launcher checks it and hands it to every training
process as JSON (`to_json` / `from_json`, in TRAINER_RUN_CONFIG: nothing is written to
disk). Nothing changes it afterwards: the output locations too are decided at resolution,
so every process (a rank, a Ray worker, a launcher reporting a killed rank) reads the same
ones. This package imports nothing above trainer/common, no torch and no transformers: a
process that only reports a failure reads its configuration in milliseconds.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from trainer.common.secrets import SECRET_FLAG_VARIABLES, masked_value
from trainer.settings.data_flags import DataArguments
from trainer.settings.launcher_flags import LauncherArguments
from trainer.settings.model_flags import ModelArguments
from trainer.settings.output_flags import OutputArguments

T = TypeVar("T")


@dataclass(frozen=True)
class Topology:
    """The shape of the training cluster as seen from this node (trainer/config/topology.py
    reads it from Vertex AI's CLUSTER_SPEC)."""

    num_nodes: int
    node_rank: int
    master_addr: str
    master_port: int
    nproc_per_node: int
    role: str
    """"chief" (node rank 0) or "worker"."""

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.nproc_per_node


@dataclass(frozen=True)
class Hardware:
    """What a training node has: detected there (trainer/node/machine.py), or read from a
    job spec's machine type (trainer/preflight/vertex_machines.py)."""

    gpu_count: int
    gpu_name: str | None
    compute_capability: tuple[int, int] | None
    cpu_count: int
    shm_bytes: int | None = None
    """The size of /dev/shm, where loader workers hand over batches (None: not present)."""
    gpu_memory_bytes: int | None = None
    """The smallest GPU's memory (None on a CPU node): what a training step must fit in."""

    @property
    def mixed_precision(self) -> str:
        """bf16 on Ampere and newer (compute capability 8.0+), fp16 on older GPUs, none on CPU."""
        if self.compute_capability is None:
            return "no"
        return "bf16" if self.compute_capability >= (8, 0) else "fp16"

    @property
    def supports_bf16(self) -> bool:
        return self.mixed_precision == "bf16"


@dataclass(frozen=True)
class OutputLocations:
    """Where the run's outputs go: `gs://` URIs, `/gcs/` paths or local directories
    (trainer/storage/locations.py decides them from the flags and Vertex AI's `AIP_*`)."""

    checkpoints: str
    model: str
    tensorboard: str | None
    """Where TensorBoard logs are synced to (None: they stay in OUTPUT_DIR/runs)."""
    shared_checkpoints: bool
    """False when checkpoints stay in each node's own output dir (nothing shared)."""


@dataclass(frozen=True)
class DemoAssets:
    """Where a task's built-in demo model and data are (its folder's demo.py builds them, once
    per node: trainer/node/demo_assets.py)."""

    model_dir: Path  # a save_pretrained'd tiny model and its processor
    dataset_dir: Path  # a dataset directory in the task's local layout


class Value(Generic[T]):
    """A typed, read-only view of one value of `TrainingFlags.values`."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, flags: TrainingFlags, owner: type | None = None) -> T:
        return flags.values[self.name]


@dataclass(frozen=True)
class TrainingFlags:
    """The Trainer's `TrainingArguments` values by their Hugging Face names, resolved: what each
    training process builds the task's class from (trainer/tasks/training_arguments.py). Over a
    hundred, all passed on; those read before that object exists are typed below."""

    values: dict[str, Any]

    output_dir = Value[str]()
    deepspeed = Value["str | None"]()
    """The DeepSpeed JSON's path (None: no DeepSpeed)."""
    seed = Value[int]()
    ddp_timeout = Value[int]()
    max_steps = Value[int]()
    per_device_train_batch_size = Value[int]()
    bf16 = Value[bool]()
    fp16 = Value[bool]()
    gradient_checkpointing = Value[bool]()
    metric_for_best_model = Value["str | None"]()
    greater_is_better = Value["bool | None"]()
    hub_token = Value["str | None"]()


@dataclass(frozen=True)
class RunConfig:
    """A run's settings, resolved once: what every node's launcher and every training
    process of the run go by."""

    launcher: LauncherArguments
    topology: Topology
    hardware: Hardware
    task: str
    """The `--task` value (trainer/tasks builds the task from it and the groups below)."""
    model: ModelArguments
    data: DataArguments
    task_options: dict[str, Any]
    """The task's own flags by name (their dataclass is the task's, trainer/tasks: it builds
    them from these values, as `TrainingArguments` from `training`)."""
    outputs: OutputArguments
    training: TrainingFlags
    locations: OutputLocations
    given: tuple[str, ...]
    """The flags the user gave, on the command line or in a recipe (sorted names)."""
    mixed_precision: str
    """What `accelerate launch` is told: no, fp16 or bf16."""
    notices: tuple[str, ...] = ()
    """Lines for the log: what resolution found and changed because of it."""
    demo: DemoAssets | None = None
    """Where the built-in demo's assets must be, when the run is the demo."""

    @property
    def gradient_checkpointing_left_open(self) -> bool:
        """Whether the training processes decide gradient checkpointing from the model's
        estimated memory: on a GPU, when the user did not choose."""
        return self.hardware.gpu_count > 0 and "--gradient_checkpointing" not in self.given

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)  # the demo's paths

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        data = json.loads(text)
        hardware, demo = data["hardware"], data["demo"]
        capability = hardware["compute_capability"]
        return cls(
            launcher=LauncherArguments(**data["launcher"]),
            topology=Topology(**data["topology"]),
            hardware=Hardware(
                **{**hardware, "compute_capability": capability and tuple(capability)}
            ),
            task=data["task"],
            model=ModelArguments(**data["model"]),
            data=DataArguments(**data["data"]),
            task_options=data["task_options"],
            outputs=OutputArguments(**data["outputs"]),
            training=TrainingFlags(data["training"]["values"]),
            locations=OutputLocations(**data["locations"]),
            given=tuple(data["given"]),
            mixed_precision=data["mixed_precision"],
            notices=tuple(data["notices"]),
            demo=demo and DemoAssets(Path(demo["model_dir"]), Path(demo["dataset_dir"])),
        )

    def without_secrets(self) -> tuple[RunConfig, dict[str, str]]:
        """This configuration with its secret flags (`--hub_token`) emptied, and their values as
        the variables their libraries read instead (SECRET_FLAG_VARIABLES): what the launcher
        hands the training processes, so nothing built from their configuration holds a secret."""
        values = dict(self.training.values)
        variables = {}
        for name, variable in SECRET_FLAG_VARIABLES.items():
            if values.get(name):
                variables[variable] = values[name]
                values[name] = None
        return replace(self, training=TrainingFlags(values)), variables

    def describe(self) -> dict:
        """The configuration as the dry run shows it, secret-looking values masked."""
        groups = {"model": self.model, "data": self.data, "outputs": self.outputs}
        flags = {name: asdict(group) for name, group in groups.items()}
        flags["task_options"] = dict(self.task_options)
        flags["training"] = self.training.values
        return {
            "flags": {"task": self.task}
            | {
                group: {name: masked_value(name, value) for name, value in values.items()}
                for group, values in flags.items()
            },
            "locations": asdict(self.locations),
            "given": list(self.given),
            "mixed_precision": self.mixed_precision,
            "gradient_checkpointing": "decided from the model's memory estimate"
            if self.gradient_checkpointing_left_open
            else self.training.gradient_checkpointing,
            "demo": self.demo and str(self.demo.model_dir.parent),
        }
