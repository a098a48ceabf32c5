"""The one place a run's settings are decided: (argv, recipe, environment, hardware) ->
`RunConfig`.

`resolve_run` is the only function that turns what the user gave into what the run uses.
Every source of a value meets here, in this order, later ones filling only what earlier
ones left open:
1. the command line, with a leading recipe YAML expanded before it (the command line wins);
2. flags from elsewhere (example scripts, transformers 4, launchers), translated
   (trainer/config/example_flags.py, after refusing a flag given twice), and the task
   inferred when `--task` is not given (trainer/config/task_inference.py);
3. a default model for a dataset without one, or the built-in demo for neither;
4. hardware defaults for flags the user did not give: mixed precision, fast settings
   (trainer/config/hardware_defaults.py), loader workers that fit /dev/shm;
5. what the task and the platform require of TrainingArguments (the task's columns and
   generation, the metric's direction, a stream's own resume position, gloo on CPU).

The launcher calls it once per node, checks the result, and hands it to every training
process (`to_json` / `from_json`, in the environment: nothing is written to disk); the
training processes build their flag objects from it and change none of them. The one
setting left to the training processes is gradient checkpointing when the user did not
choose it on a GPU node (`decide_gradient_checkpointing`): it depends on the model, which
only they load. It reads only the files it is pointed at (the recipe, a DeepSpeed JSON):
no network, no process, no write.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from trainer.common.cache import cache_dir
from trainer.common.errors import UserError
from trainer.config.cluster import Topology, resolve_topology
from trainer.config.deepspeed import resolve_deepspeed_config
from trainer.config.demo import DEMO_RECIPE, DemoAssets, demo_assets_in
from trainer.config.example_flags import check_repeated_flags, translate_example_flags
from trainer.config.flags import (
    FlagParser,
    FlagValues,
    ParsedFlags,
    flags_from_values,
    greater_is_better,
    parse_flag_values,
)
from trainer.config.hardware import Hardware
from trainer.config.hardware_defaults import (
    MIB,
    fast_defaults,
    flag_names,
    loader_workers_for_shm,
)
from trainer.config.launcher_flags import LauncherArguments
from trainer.config.recipes import command_line, config_file_flags, expand_config_file
from trainer.config.secrets import (
    HUB_TOKEN_VARIABLE,
    SECRET_FLAG_VARIABLES,
    masked_value,
    parse_references,
)
from trainer.config.task_inference import infer_task
from trainer.data.arguments import DataArguments
from trainer.storage.locations import OutputArguments, OutputLocations, resolve_output_locations
from trainer.tasks import DEFAULT_TASK, load_task
from trainer.tasks.arguments import ModelArguments

GIVE_BOTH = (
    "Give both --model_name_or_path and --dataset_name, or neither to run the built-in demo."
)


@dataclass(frozen=True)
class RunConfig:
    """A run's settings, resolved once: what every node's launcher and every training
    process of the run go by."""

    launcher: LauncherArguments
    topology: Topology
    hardware: Hardware
    flags: FlagValues
    """The final training flags, grouped (trainer/config/flags.py `FlagValues`)."""
    given: tuple[str, ...]
    """The flags the user gave, on the command line or in a recipe (sorted names)."""
    mixed_precision: str
    """What `accelerate launch` is told: no, fp16 or bf16."""
    notices: tuple[str, ...] = ()
    """Lines for the log: what resolution found and changed because of it."""
    demo: DemoAssets | None = None
    """Where the built-in demo's assets must be, when the run is the demo."""

    def parsed(self) -> ParsedFlags:
        """The flag objects, built anew from the values (parsing nothing again)."""
        return flags_from_values(self.flags)

    def output_locations(self, env: Mapping[str, str]) -> OutputLocations:
        """Where checkpoints, the model and logs go, from the values alone: what a process
        that reports a failure needs, without building the task."""
        outputs = OutputArguments(**self.flags["outputs"])
        return resolve_output_locations(outputs, env, self.flags["training"]["output_dir"])

    @property
    def deepspeed_config(self) -> str | None:
        return self.flags["training"]["deepspeed"]

    @property
    def gradient_checkpointing_left_open(self) -> bool:
        """Whether the training processes decide gradient checkpointing from the model's
        estimated memory: on a GPU, when the user did not choose."""
        return self.hardware.gpu_count > 0 and "--gradient_checkpointing" not in self.given

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)  # the demo's paths

    def without_secrets(self) -> tuple[RunConfig, dict[str, str]]:
        """This configuration with its secret flags (`--hub_token`) emptied, and their values
        as the environment variables their libraries read instead (SECRET_FLAG_VARIABLES):
        what the launcher hands to the training processes, so that the configuration they
        get, and everything built from it, holds no secret."""
        training = dict(self.flags["training"])
        variables = {}
        for name, variable in SECRET_FLAG_VARIABLES.items():
            if training.get(name):
                variables[variable] = training[name]
                training[name] = None
        return replace(self, flags={**self.flags, "training": training}), variables

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        data = json.loads(text)
        hardware = data["hardware"]
        capability = hardware["compute_capability"]
        demo = data["demo"]
        return cls(
            launcher=LauncherArguments(**data["launcher"]),
            topology=Topology(**data["topology"]),
            hardware=Hardware(
                **{**hardware, "compute_capability": capability and tuple(capability)}
            ),
            flags=data["flags"],
            given=tuple(data["given"]),
            mixed_precision=data["mixed_precision"],
            notices=tuple(data["notices"]),
            demo=demo and DemoAssets(Path(demo["model_dir"]), Path(demo["dataset_dir"])),
        )

    def describe(self) -> dict:
        """The configuration as the dry run shows it, secret-looking values masked."""
        flags = {
            group: {name: masked_value(name, value) for name, value in values.items()}
            if isinstance(values, dict)
            else values
            for group, values in self.flags.items()
        }
        return {
            "flags": flags,
            "given": list(self.given),
            "mixed_precision": self.mixed_precision,
            "gradient_checkpointing": "decided from the model's memory estimate"
            if self.gradient_checkpointing_left_open
            else self.flags["training"]["gradient_checkpointing"],
            "demo": self.demo and str(self.demo.model_dir.parent),
        }


def resolve_run(argv: list[str], env: Mapping[str, str], hardware: Hardware) -> RunConfig:
    """The run's configuration: UserError (one line) for anything that cannot run."""
    check_repeated_flags(command_line(argv))  # a recipe's flags may be given again
    translated, notices = translate_example_flags(expand_config_file(argv))
    launcher, training_argv = split_launcher_flags(translated)
    topology = resolve_topology(
        env, hardware.gpu_count, launcher.nproc_per_node, launcher.master_port
    )
    deepspeed = resolve_deepspeed_config(launcher.deepspeed)
    training_argv, task_notices = with_inferred_task(training_argv)
    values = parse_flag_values(training_argv)  # fails on an unknown flag before anything else
    demo = None
    model = values["model"]["model_name_or_path"]
    dataset = values["data"]["dataset_name"] or values["task_options"].get("train_file")
    if model is None and dataset is None:
        demo = demo_assets_in(cache_dir(env) / "demo")
        training_argv = with_demo(values, training_argv, demo)
    elif model is None:
        training_argv = with_default_model(values, training_argv)
    elif dataset is None:
        raise UserError(GIVE_BOTH)
    given = flag_names(training_argv)  # a recipe's flags count as given
    if task_notices:
        given.discard("--task")  # inferred, not given
    mixed_precision = resolve_mixed_precision(
        values["training"]["bf16"],
        values["training"]["fp16"],
        hardware,
        user_chose=bool(given & {"--bf16", "--fp16"}),
    )
    defaults = fast_defaults(hardware, given)
    if mixed_precision != "no" and not given & {"--bf16", "--fp16"}:
        defaults += [f"--{mixed_precision}", "true"]
    values = parse_flag_values([*training_argv, *defaults])
    split_notices = settle_evaluation_split(values, given)
    shm_notices = fit_loader_workers(values["training"], hardware, topology.nproc_per_node)
    values["training"]["deepspeed"] = None if deepspeed is None else str(deepspeed)
    settle_training_arguments(values, hardware)
    flags_from_values(values)  # every check the training processes will make, made here
    if values["training"]["hub_token"] and HUB_TOKEN_VARIABLE in parse_references(launcher.secret):
        raise UserError(
            f"--hub_token and --secret {HUB_TOKEN_VARIABLE}=... both give the Hub token: "
            "give one (--secret keeps it out of the job spec)."
        )
    return RunConfig(
        launcher=launcher,
        topology=topology,
        hardware=hardware,
        flags=values,
        given=tuple(sorted(given)),
        mixed_precision=mixed_precision,
        notices=(*notices, *task_notices, *split_notices, *shm_notices),
        demo=demo,
    )


def split_launcher_flags(argv: list[str]) -> tuple[LauncherArguments, list[str]]:
    """The launcher's own flags, and the training flags that remain."""
    options, training_argv = FlagParser([LauncherArguments]).parse_known_args(argv)
    launcher = LauncherArguments(**vars(options))
    parse_references(launcher.secret)  # a malformed reference fails before anything else
    if launcher.chief_resolve_timeout < 0:
        raise UserError("--chief_resolve_timeout must be 0 (one attempt) or more seconds.")
    return launcher, training_argv


def with_inferred_task(training_argv: list[str]) -> tuple[list[str], list[str]]:
    """Without --task, the task the model's config.json or the local data name (one notice
    says which and why); the demo (no model, no dataset) stays the default task."""
    if "--task" in flag_names(training_argv):
        return training_argv, []
    known, _ = FlagParser([ModelArguments, DataArguments], add_help=False).parse_known_args(
        training_argv
    )
    if known.model_name_or_path is None and known.dataset_name is None:
        return training_argv, []
    task, why = infer_task(known.model_name_or_path, known.dataset_name, known.cache_dir)
    return ["--task", task, *training_argv], [f"task: {task} (no --task; {why})"]


def settle_evaluation_split(values: FlagValues, given: set[str]) -> list[str]:
    """Which evaluation split is read: with --train_val_split, a part of the training
    split (and no --eval_split_name); with evaluation turned off (--eval_strategy no, no
    --do_eval, no --eval_split_name), none, so that a dataset with only a train split runs;
    with --train_file, the --validation_file if given, else none. The notices say which."""
    data, training = values["data"], values["training"]
    if data["train_val_split"] is not None:
        if "--eval_split_name" in given:
            raise UserError(
                "--train_val_split makes the evaluation split from the training split: "
                "leave --eval_split_name out, or --train_val_split."
            )
        data["eval_split_name"] = ""
        return [
            f"evaluation split: {data['train_val_split']:g} of split {data['train_split_name']},"
            f" drawn with seed {training['seed']} (--train_val_split)"
        ]
    evaluation_off = str(getattr(training["eval_strategy"], "value", training["eval_strategy"]))
    if (
        evaluation_off == "no"
        and "--eval_strategy" in given
        and not training["do_eval"]
        and "--eval_split_name" not in given
        and data["eval_split_name"]
    ):
        data["eval_split_name"] = ""
        return ["evaluation off (--eval_strategy no): no evaluation split is read"]
    options = values["task_options"]
    if options.get("train_file") and "--eval_split_name" not in given:
        data["eval_split_name"] = "validation" if options["validation_file"] else ""
        if not options["validation_file"]:
            return ["no --validation_file: no evaluation (--train_val_split makes one)"]
    return []


def with_default_model(values: FlagValues, training_argv: list[str]) -> list[str]:
    """A dataset but no model: the task's default model, as its HF example script has one
    (run_image_classification.py: google/vit-base-patch16-224-in21k)."""
    model = load_task(values["task"]).default_model
    if model is None:
        raise UserError(GIVE_BOTH)
    return [*training_argv, "--model_name_or_path", model]


def with_demo(values: FlagValues, training_argv: list[str], demo: DemoAssets) -> list[str]:
    """No model and no dataset given: the built-in demo (tiny Whisper, synthesized speech),
    its recipe first so that the command line still wins."""
    if values["task"] != DEFAULT_TASK:
        raise UserError(
            f"The built-in demo is {DEFAULT_TASK}; for other tasks give "
            "--model_name_or_path and --dataset_name (see docs/tasks.md for recipes)."
        )
    return [
        *config_file_flags(DEMO_RECIPE),
        "--model_name_or_path", str(demo.model_dir),
        "--dataset_name", str(demo.dataset_dir),
        *training_argv,
    ]  # fmt: skip


def resolve_mixed_precision(
    bf16: bool, fp16: bool, hardware: Hardware, user_chose: bool = False
) -> str:
    """The user's --bf16/--fp16 if the hardware can do it, else what the hardware does best.

    `user_chose` means a precision flag was given at all: `--bf16 false` asks for fp32.
    """
    if bf16 and fp16:
        raise UserError("--bf16 and --fp16 are mutually exclusive: choose one.")
    if fp16 and hardware.gpu_count == 0:
        raise UserError("--fp16 needs a GPU; this node has none (leave precision flags out).")
    if bf16 and not hardware.supports_bf16:
        device = hardware.gpu_name or "a CPU-only node"
        raise UserError(f"--bf16 needs an Ampere or newer GPU; this is {device}.")
    if bf16:
        return "bf16"
    if fp16:
        return "fp16"
    return "no" if user_chose else hardware.mixed_precision


def fit_loader_workers(training: dict, hardware: Hardware, procs_per_node: int) -> list[str]:
    """Lower --dataloader_num_workers (in `training`) when /dev/shm cannot hold them; the
    notices say what /dev/shm has and what was changed."""
    if hardware.shm_bytes is None:
        return ["/dev/shm: not present"]
    workers = training["dataloader_num_workers"]
    allowed, warning = loader_workers_for_shm(hardware.shm_bytes, workers, procs_per_node)
    shm_mib = hardware.shm_bytes // MIB
    notices = [f"/dev/shm: {shm_mib} MiB, {workers} loader worker(s) per process asked"]
    if warning is None:
        return notices
    training["dataloader_num_workers"] = allowed
    if allowed == 0:  # persistent workers need workers
        training["dataloader_persistent_workers"] = False
    return [*notices, f"warning: {warning}"]


def settle_training_arguments(values: FlagValues, hardware: Hardware) -> None:
    """What the task and the platform require of TrainingArguments, set in `values`."""
    parsed = flags_from_values(values)
    training = parsed.training
    parsed.task.adjust_training_arguments(training)
    if training.metric_for_best_model:
        # The Trainer would treat WER as bigger-is-better.
        training.greater_is_better = greater_is_better(parsed)
    if parsed.data.streaming:
        # The stream resumes at its own recorded position (trainer/data/streams.py); the
        # Trainer's skipping of already-trained batches would read them a second time.
        training.ignore_data_skip = True
    if hardware.gpu_count == 0:
        # Without CUDA, accelerate leaves the backend unset and every rank believes it is
        # alone: the training processes create the process group over gloo themselves
        # (trainer/training/distributed.py) and the Trainer is told to use that state.
        config = training.accelerator_config or {}
        if isinstance(config, str):
            config = json.loads(config)
        training.accelerator_config = {**config, "use_configured_state": True}
    values["training"] = vars(training)
