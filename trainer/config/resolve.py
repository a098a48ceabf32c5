"""The one place a run's settings are decided: (argv, recipe, environment, hardware) ->
`RunConfig` (trainer/settings/run_config.py).

`resolve_run` alone turns what the user gave into what the run uses. Every source of a value
meets here, in this order, later ones filling only what earlier ones left open:
1. the command line, with a leading recipe YAML expanded before it (the command line wins);
2. flags from elsewhere (example scripts, transformers 4, launchers), translated
   (trainer/command_line/example_flags.py, after refusing a flag given twice), and the task
   inferred when `--task` is not given (trainer/config/task_inference.py);
3. a default model for a dataset without one, or the built-in demo for neither;
4. hardware defaults for flags the user did not give: mixed precision, fast settings
   (trainer/config/hardware_defaults.py), loader workers that fit /dev/shm;
5. what the task and the platform require of TrainingArguments (the task's columns and
   generation, the metric's direction, a stream's own resume position, gloo on CPU);
6. the output locations, from the flags, else Vertex AI's `AIP_*` variables in `env`, else
   `--output_dir` (trainer/storage/locations.py).

Every way in calls it once (the launcher once per node, `trainer.ray` and `trainer.jobspec`
once) and checks the result (trainer/preflight); the training processes change nothing, but for
gradient checkpointing the user left open on a GPU node
(`RunConfig.gradient_checkpointing_left_open`): it depends on the model, which only they load.
It reads only the files it is pointed at (recipe, DeepSpeed JSON, a local model's config.json):
no process, no write, and no network but for one file: a Hub model's config.json when the task
must be inferred and neither the cache nor the data tell it (trainer/config/task_inference.py).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from trainer.command_line.example_flags import (
    check_repeated_flags,
    translate_example_flags,
    typed_spellings,
)
from trainer.command_line.parser import FlagParser, ParsedFlags, parse_training_flags
from trainer.command_line.recipes import (
    RECIPES_DIR,
    command_line,
    config_file_flags,
    config_file_notices,
    expand_config_file,
)
from trainer.common.cache import cache_dir
from trainer.common.errors import UserError
from trainer.common.secrets import HUB_TOKEN_VARIABLE, parse_references
from trainer.config.deepspeed import resolve_deepspeed_config
from trainer.config.hardware_defaults import MIB, fast_defaults, flag_names, loader_workers_for_shm
from trainer.config.task_inference import infer_task
from trainer.config.topology import resolve_topology
from trainer.settings.data_flags import DataArguments
from trainer.settings.launcher_flags import LauncherArguments
from trainer.settings.mixtures import STREAMS, Mixture, mixture_of
from trainer.settings.model_flags import ModelArguments
from trainer.settings.run_config import DemoAssets, Hardware, RunConfig, TrainingFlags
from trainer.storage.locations import resolve_output_locations
from trainer.tasks.base import LENGTH_SAMPLING_STRATEGIES, Task
from trainer.tasks.registry import load_task, registered, task_spec

GIVE_BOTH = (
    "Give both --model_name_or_path and --dataset_name, or neither to run the built-in demo."
)


def resolve_run(argv: list[str], env: Mapping[str, str], hardware: Hardware) -> RunConfig:
    """The run's configuration: UserError (one line) for anything that cannot run."""
    check_repeated_flags(command_line(argv))  # a recipe's flags may be given again
    expanded = expand_config_file(argv)
    translated, notices = translate_example_flags(expanded)
    notices = [*config_file_notices(argv), *notices]
    launcher, training_argv = split_launcher_flags(translated)
    topology = resolve_topology(
        env, hardware.gpu_count, launcher.nproc_per_node, launcher.master_port
    )
    deepspeed = resolve_deepspeed_config(launcher.deepspeed)
    training_argv, task_notices = with_inferred_task(training_argv, env, launcher.skip_hub_check)
    # an unknown flag fails before anything else, named as the user typed it
    first = parse_training_flags(training_argv, typed_spellings(expanded), bool(task_notices))
    training_argv, demo = with_model_and_data(first, training_argv, env)
    given = flag_names(training_argv)  # a recipe's flags count as given
    if task_notices:
        given.discard("--task")  # inferred, not given
    mixed_precision = resolve_mixed_precision(
        first.training["bf16"], first.training["fp16"], hardware, bool(given & {"--bf16", "--fp16"})
    )
    flags = parse_training_flags([*training_argv, *defaults_for(hardware, given, mixed_precision)])
    data, split_notices = settle_evaluation_split(flags, given)
    training, shm_notices = fit_loader_workers(flags.training, hardware, topology.nproc_per_node)
    training["deepspeed"] = None if deepspeed is None else str(deepspeed)
    task_class = load_task(flags.task)
    training |= required_training_arguments(task_class, flags, training, hardware)
    task_class.check_training_values(training)
    check_attention(flags.model.attn_implementation)
    check_mixture(data, flags.task_options)
    check_streaming(data, training)
    check_hub_token(training, launcher)
    return RunConfig(
        launcher=launcher,
        topology=topology,
        hardware=hardware,
        task=flags.task,
        model=flags.model,
        data=data,
        task_options=asdict(task_class.settled_options(flags.task_options)),
        outputs=flags.outputs,
        training=TrainingFlags(training),
        locations=resolve_output_locations(flags.outputs, env, training["output_dir"]),
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


def with_inferred_task(
    training_argv: list[str], env: Mapping[str, str], skip_hub_check: bool
) -> tuple[list[str], list[str]]:
    """Without --task, the task the model's config.json (asked of the Hub if need be) or the
    local data name (one notice says which and why); the demo (no model, no dataset) stays the
    default task."""
    if "--task" in flag_names(training_argv):
        return training_argv, []
    known, _ = FlagParser([ModelArguments, DataArguments], add_help=False).parse_known_args(
        training_argv
    )
    if known.model_name_or_path is None and known.dataset_name is None:
        return training_argv, []
    task, why = infer_task(
        known.model_name_or_path, known.dataset_name, known.cache_dir, env, skip_hub_check
    )
    return ["--task", task, *training_argv], [f"task: {task} (no --task; {why})"]


def with_model_and_data(
    flags: ParsedFlags, training_argv: list[str], env: Mapping[str, str]
) -> tuple[list[str], DemoAssets | None]:
    """A model and a dataset: as given; a dataset alone gets the task's default model (as
    its HF example script has one: run_image_classification.py uses
    google/vit-base-patch16-224-in21k); neither is the built-in demo (tiny Whisper,
    synthesized speech), its recipe first so that the command line still wins."""
    model = flags.model.model_name_or_path
    data = flags.data
    dataset = (data.dataset_name or getattr(flags.task_options, "dataset_mixture", None)
               or getattr(flags.task_options, "train_file", None))  # fmt: skip
    if dataset is None:
        check_training_file(flags.task_options)
    if model is not None and dataset is not None:
        return training_argv, None
    if dataset is not None:
        default_model = task_spec(flags.task).default_model
        if default_model is None:
            raise UserError(GIVE_BOTH)
        return [*training_argv, "--model_name_or_path", default_model], None
    if model is not None:
        raise UserError(GIVE_BOTH)
    demo, recipe = demo_of(flags.task, cache_dir(env) / "demo")
    demo_flags = [
        "--model_name_or_path",
        str(demo.model_dir),
        "--dataset_name",
        str(demo.dataset_dir),
    ]
    return [*config_file_flags(recipe), *demo_flags, *training_argv], demo


def demo_of(task: str, root: Path) -> tuple[DemoAssets, Path]:
    """The task's built-in demo: where its model and data are (or will be built) under `root`,
    and its recipe; UserError for a task without one."""
    spec = task_spec(task)
    if spec.demo is None:
        with_demos = [s.name for s in registered() if s.demo]
        raise UserError(
            f"The built-in demos are {', '.join(sorted(with_demos))}; for other tasks give "
            "--model_name_or_path and --dataset_name (see docs/tasks.md for recipes)."
        )
    return spec.demo_assets_in(root), RECIPES_DIR / str(spec.demo_recipe)


def check_training_file(options: object) -> None:
    """--validation_file and --test_file name more splits of --train_file's data: given
    without it or --dataset_name, the run has no training split."""
    for name in ("validation_file", "test_file"):
        if getattr(options, name, None):
            raise UserError(
                f"--{name} is given without --train_file: the files name the splits of one "
                "dataset, the training examples first; add --train_file, or give the data as "
                "--dataset_name DIR (one file per split: train.csv, test.csv, ...)."
            )


def defaults_for(hardware: Hardware, given: set[str], mixed_precision: str) -> list[str]:
    """The hardware's fast settings and its precision, for flags the user did not give."""
    defaults = fast_defaults(hardware, given)
    if mixed_precision != "no" and not given & {"--bf16", "--fp16"}:
        defaults += [f"--{mixed_precision}", "true"]
    return defaults


def settle_evaluation_split(flags: ParsedFlags, given: set[str]) -> tuple[DataArguments, list[str]]:
    """Which evaluation split is read: with --train_val_split, a part of the training
    split (and no --eval_split_name); with evaluation turned off (--eval_strategy no, no
    --do_eval, no --eval_split_name), none, so that a dataset with only a train split runs;
    with --train_file, the --validation_file if given, else none. The notices say which."""
    data, training = flags.data, flags.training
    mixture = mixture_of(data, flags.task_options)
    if mixture is not None and not mixture.handbook:
        return mixture_evaluation(mixture, data, training, given)
    if data.train_val_split is not None:
        if "--eval_split_name" in given:
            raise UserError(
                "--train_val_split makes the evaluation split from the training split: "
                "leave --eval_split_name out, or --train_val_split."
            )
        return replace(data, eval_split_name=""), [
            f"evaluation split: {data.train_val_split:g} of split {data.train_split_name},"
            f" drawn with seed {training['seed']} (--train_val_split)"
        ]
    if evaluation_turned_off(training, given) and data.eval_split_name:
        how = "--eval_strategy no" if "--eval_strategy" in given else "--do_eval false"
        return replace(data, eval_split_name=""), [
            f"evaluation off ({how}): no evaluation split is read"
        ]
    if "--eval_split_name" in given:
        return data, []
    return default_evaluation_split(data, flags.task_options)


def mixture_evaluation(
    mixture: Mixture, data: DataArguments, training: Mapping[str, Any], given: set[str]
) -> tuple[DataArguments, list[str]]:
    """A `--dataset_mixture` evaluates on its `test_split_size` part (or `--train_val_split`'s);
    without one it has no evaluation split, and evaluation must be off (the handbook's
    `{ID: fraction}` evaluates on its datasets' --eval_split_name, as one dataset does)."""
    if "--eval_split_name" in given:
        raise UserError("--eval_split_name names a split of one dataset; a --dataset_mixture "
                        "evaluates on its test_split_size part: leave --eval_split_name "
                        "out.")  # fmt: skip
    if mixture.test_split_size is not None:
        if data.train_val_split is not None:
            raise UserError("--train_val_split and the mixture's test_split_size both hold out "
                            "an evaluation part: give one.")  # fmt: skip
        seed = training["seed"] if mixture.seed is None else mixture.seed
        return replace(data, eval_split_name=""), [
            f"evaluation split: {mixture.test_split_size:g} of the mixture, drawn with seed "
            f"{seed} (test_split_size)"
        ]
    if data.train_val_split is not None:
        return replace(data, eval_split_name=""), [
            f"evaluation split: {data.train_val_split:g} of the mixture, drawn with seed "
            f"{training['seed']} (--train_val_split)"
        ]
    strategy = str(getattr(training["eval_strategy"], "value", training["eval_strategy"]))
    if strategy != "no" or training["do_eval"]:
        raise UserError("The --dataset_mixture has no evaluation split: add test_split_size "
                        "to it (a part held out, e.g. 0.1), or --eval_strategy no.")  # fmt: skip
    return replace(data, eval_split_name=""), []


def default_evaluation_split(data: DataArguments, options: Any) -> tuple[DataArguments, list[str]]:
    """The evaluation split where the user names none: with --train_file, --validation_file's
    if given, else none; a local folder's validation split where it has no test; else test."""
    if getattr(options, "train_file", None):
        if getattr(options, "validation_file", None):
            return replace(data, eval_split_name="validation"), []
        return replace(data, eval_split_name=""), [
            "no --validation_file: no evaluation (--train_val_split makes one)"
        ]
    if validation_in_place_of_test(data):
        return replace(data, eval_split_name="validation"), [
            f"evaluation split: validation ({data.dataset_name} has train and validation, "
            "no test; --eval_split_name names another)"
        ]
    return data, []


def evaluation_turned_off(training: Mapping[str, Any], given: set[str]) -> bool:
    """--eval_strategy no, or --do_eval false (with no other strategy), and no
    --eval_split_name asks for an evaluation."""
    strategy = str(getattr(training["eval_strategy"], "value", training["eval_strategy"]))
    said = "--eval_strategy" in given or "--do_eval" in given
    asked = training["do_eval"] or "--eval_split_name" in given
    return strategy == "no" and said and not asked


def validation_in_place_of_test(data: DataArguments) -> bool:
    """A local folder (one file or folder per split, as people keep data) with a validation
    split and no test split, and the default evaluation split, test: its validation split is
    what the user means to evaluate on. Read from the folder's names only."""
    name = data.dataset_name
    if data.eval_split_name != "test" or not name or "," in name or "://" in name:
        return False
    folder = Path(name).expanduser()
    if not folder.is_dir():
        return False
    splits = {entry.stem if entry.is_file() else entry.name for entry in folder.iterdir()}
    return "train" in splits and "validation" in splits and "test" not in splits


def resolve_mixed_precision(
    bf16: bool, fp16: bool, hardware: Hardware, user_chose: bool = False
) -> str:
    """The user's --bf16/--fp16 if the hardware can do it, else what the hardware does best.
    `user_chose` means a precision flag was given at all: `--bf16 false` asks for fp32."""
    check_precision(bf16, fp16, hardware)
    if bf16 or fp16:
        return "bf16" if bf16 else "fp16"
    return "no" if user_chose else hardware.mixed_precision


def check_precision(bf16: bool, fp16: bool, hardware: Hardware) -> None:
    """One of --bf16 and --fp16 at most, and one the hardware runs."""
    if bf16 and fp16:
        raise UserError("--bf16 and --fp16 are mutually exclusive: choose one.")
    if fp16 and hardware.gpu_count == 0:
        raise UserError("--fp16 needs a GPU; this node has none (leave precision flags out).")
    if bf16 and not hardware.supports_bf16:
        device = hardware.gpu_name or "a CPU-only node"
        raise UserError(f"--bf16 needs an Ampere or newer GPU; this is {device}.")


def fit_loader_workers(
    training: dict[str, Any], hardware: Hardware, procs_per_node: int
) -> tuple[dict[str, Any], list[str]]:
    """The training values with --dataloader_num_workers lowered when /dev/shm cannot hold
    the workers; the notices say what /dev/shm has and what was changed."""
    if hardware.shm_bytes is None:
        return dict(training), ["/dev/shm: not present"]
    workers = training["dataloader_num_workers"]
    allowed, warning = loader_workers_for_shm(hardware.shm_bytes, workers, procs_per_node)
    notices = [
        f"/dev/shm: {hardware.shm_bytes // MIB} MiB, {workers} loader worker(s) per process asked"
    ]
    if warning is None:
        return dict(training), notices
    lowered = {"dataloader_num_workers": allowed}
    if allowed == 0:  # persistent workers need workers
        lowered["dataloader_persistent_workers"] = False
    return training | lowered, [*notices, f"warning: {warning}"]


def required_training_arguments(
    task_class: type[Task], flags: ParsedFlags, training: dict[str, Any], hardware: Hardware
) -> dict[str, Any]:
    """What the task and the platform require of TrainingArguments, whatever the flags say."""
    required = task_class.required_training_arguments(training)
    if training["metric_for_best_model"]:
        # The Trainer would treat WER as bigger-is-better.
        required["greater_is_better"] = greater_is_better(task_class, training)
    if flags.data.streaming:
        # The stream resumes at its own recorded position (trainer/data/streams.py); the
        # Trainer's skipping of already-trained batches would read them a second time.
        required["ignore_data_skip"] = True
    if hardware.gpu_count == 0:
        # Without CUDA, accelerate leaves the backend unset and every rank believes it is
        # alone: the training processes create the process group over gloo themselves
        # (trainer/training/distributed.py) and the Trainer is told to use that state.
        config = training["accelerator_config"] or {}
        if isinstance(config, str):
            config = json.loads(config)
        required["accelerator_config"] = {**config, "use_configured_state": True}
    return required


def greater_is_better(task_class: type[Task], training: Mapping[str, Any]) -> bool:
    """Whether a larger `metric_for_best_model` is better: `--greater_is_better` if given,
    else from the metric. The Trainer assumes bigger is better unless the name ends in
    "loss", which is wrong for WER; the task names its lower-is-better metrics."""
    if training["greater_is_better"] is not None:
        return training["greater_is_better"]
    metric = (training["metric_for_best_model"] or task_class.default_metric).removeprefix("eval_")
    return not (metric in task_class.lower_is_better or metric.endswith("loss"))


ATTENTION_KERNELS = ("sdpa", "eager")
"""What --attn_implementation runs in this image: PyTorch's scaled-dot-product attention (what
`from_pretrained` picks where the model supports it) and the plain one. No image installs
flash-attn (docker/Dockerfile, pyproject.toml): flash_attention_2 runs only where it is
importable, and is refused before launch elsewhere (it would fail in every training process at
the model's load)."""


def check_attention(kernel: str | None) -> None:
    """--attn_implementation: one of ATTENTION_KERNELS, or flash_attention_2 with flash-attn."""
    if kernel is None or kernel in ATTENTION_KERNELS:
        return
    if kernel == "flash_attention_2":
        if importlib.util.find_spec("flash_attn") is not None:
            return
        raise UserError("--attn_implementation flash_attention_2: flash-attn is not installed "
                        "in this image, which has PyTorch's sdpa kernels (--attn_implementation "
                        "sdpa, the default): leave it out.")  # fmt: skip
    raise UserError(f"--attn_implementation {kernel}: this image runs sdpa (the default) or "
                    "eager, and flash_attention_2 where flash-attn is installed.")  # fmt: skip


def check_streaming(data: DataArguments, training: Mapping[str, Any]) -> None:
    """What a stream, which has no length and no random access, cannot do; several
    datasets need one probability each (and one config each, if any)."""
    if data.interleave_probabilities:
        check_interleaving(data)
    if not data.streaming:
        return
    if training["max_steps"] is None or training["max_steps"] <= 0:
        raise UserError(
            "--streaming needs --max_steps: a stream has no length, so --num_train_epochs "
            "cannot say when training ends (a shard set's index.json gives the examples "
            "per epoch: max_steps = examples / (batch size x processes) per epoch)."
        )
    if training["train_sampling_strategy"] in LENGTH_SAMPLING_STRATEGIES:
        raise UserError(
            f"--train_sampling_strategy {training['train_sampling_strategy']} needs every "
            "example's length before training, which a stream does not have: leave it out."
        )
    if data.shuffle_buffer_size < 1:
        raise UserError("--shuffle_buffer_size must be at least 1.")


def check_mixture(data: DataArguments, options: Any) -> None:
    """A mixture names its datasets itself, and is read whole."""
    if not getattr(options, "dataset_mixture", None):
        return
    flag = "--dataset_mixture"
    if data.dataset_name:
        raise UserError(f"--dataset_name and {flag} both name the data: give the datasets in "
                        f"{flag} only.")  # fmt: skip
    if data.streaming or data.interleave_probabilities:
        raise UserError(f"{flag} with --streaming or --interleave_probabilities: {STREAMS}.")


def check_interleaving(data: DataArguments) -> None:
    if not data.streaming:
        raise UserError("--interleave_probabilities mixes streams: add --streaming true.")
    names = (data.dataset_name or "").split(",")
    probabilities = data.probabilities()
    if len(names) < 2 or len(probabilities) != len(names):
        raise UserError(
            f"--interleave_probabilities gives {len(probabilities)} probabilities for "
            f"{len(names)} dataset(s) in --dataset_name: give two or more datasets, "
            "separated by commas, and one probability each."
        )
    configs = data.dataset_config_name.split(",") if data.dataset_config_name else []
    if len(configs) not in (0, 1, len(names)):
        raise UserError(
            f"--dataset_config_name gives {len(configs)} configs for {len(names)} datasets: "
            "give one, or one per dataset (separated by commas)."
        )


def check_hub_token(training: Mapping[str, Any], launcher: LauncherArguments) -> None:
    if training["hub_token"] and HUB_TOKEN_VARIABLE in parse_references(launcher.secret):
        raise UserError(
            f"--hub_token and --secret {HUB_TOKEN_VARIABLE}=... both give the Hub token: "
            "give one (--secret keeps it out of the job spec)."
        )
