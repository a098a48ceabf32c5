"""`python -m trainer`: find the cluster, check every flag, then become `accelerate launch`.

Runs once per node (the container's entrypoint). It resolves the topology from Vertex AI's
environment, validates the training program's flags and inputs (so bad input fails here,
in a second, before any process group or GPU is touched), builds the `accelerate launch`
command, and replaces itself with it. `--dry-run` prints the plan as JSON instead.

`build_launch_plan` is pure: the same topology, hardware and flags always give the same
command, which is what the tests check.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from trainer.common.cache import cache_dir, clear_stale_build_locks, torch_extensions_dir
from trainer.common.errors import UserError
from trainer.config.cluster import Topology, requested_accelerators, resolve_topology
from trainer.config.example_flags import translate_example_flags
from trainer.config.hardware import Hardware
from trainer.config.help import HELP_FLAGS, print_help
from trainer.config.launcher_flags import LauncherArguments
from trainer.config.recipes import RECIPES_DIR, config_file_flags, expand_config_file

DEMO_RECIPE = RECIPES_DIR / "demo.yaml"

VERTEX_NODE_LEVEL_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""Vertex AI sets these per NODE; torchrun sets its own per PROCESS, so ours are dropped."""

SECRET_FLAG_MARKERS = ("token", "key", "secret", "password")

SHUTDOWN_MARGIN_SECONDS = 5
"""On SIGTERM torchrun's agent passes the signal on to the training processes and kills
them TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds later (30 by default): the plan gives them
--stop_grace_seconds for their uploads plus this much to report and exit."""

LAUNCHED_AT_VARIABLE = "TRAINER_LAUNCHED_AT"
"""When `python -m trainer` started (epoch seconds): the training program reports the time
from there to its first optimizer step."""


@dataclass(frozen=True)
class LaunchPlan:
    topology: Topology
    hardware: Hardware
    argv: list[str]
    env: dict[str, str]
    """Variables set for the launched processes (on top of the current environment)."""
    unset_env: list[str]
    """Variables removed from the current environment before launching."""
    notices: list[str] = field(default_factory=list)
    """Lines for the log: what the launcher found and what it changed because of it."""

    def describe(self) -> dict:
        return {
            "topology": {**asdict(self.topology), "world_size": self.topology.world_size},
            "hardware": asdict(self.hardware),
            "command": redact_secrets(self.argv),
            "env": self.env,
            "unset_env": self.unset_env,
            "notices": self.notices,
        }


def build_launch_plan(
    topology: Topology,
    hardware: Hardware,
    options: LauncherArguments,
    deepspeed_config: Path | None,
    training_argv: list[str],
    mixed_precision: str,
    current_env: Mapping[str, str],
    cache_dir: Path,
    python: str = sys.executable,
    stop_grace_seconds: float = 25,
) -> LaunchPlan:
    """The `accelerate launch` command and environment for this node (pure)."""
    argv = [
        # accelerate launch, with failures in one line
        python, "-m", "trainer.launcher.accelerate_launch",
        "--num_machines", str(topology.num_nodes),
        "--machine_rank", str(topology.node_rank),
        "--num_processes", str(topology.world_size),
        "--main_process_ip", topology.master_addr,
        "--main_process_port", str(topology.master_port),
        "--mixed_precision", mixed_precision,
        "--dynamo_backend", "no",
        "--rdzv_backend", "static",
        "--rdzv_conf", f"timeout={options.rdzv_timeout}",
        "--max_restarts", "0",
    ]  # fmt: skip
    if deepspeed_config is not None:
        argv += [
            "--use_deepspeed",
            "--deepspeed_config_file", str(deepspeed_config),
            "--deepspeed_multinode_launcher", "standard",
        ]  # fmt: skip
    elif topology.world_size > 1:
        argv.append("--multi_gpu")
    argv += ["--module", "trainer.training.main", *training_argv]
    if deepspeed_config is not None:
        argv += ["--deepspeed", str(deepspeed_config)]

    env = {
        "PYTHONUNBUFFERED": "1",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(
            math.ceil(stop_grace_seconds) + SHUTDOWN_MARGIN_SECONDS
        ),
        "OMP_NUM_THREADS": current_env.get(
            "OMP_NUM_THREADS", str(max(1, hardware.cpu_count // topology.nproc_per_node))
        ),
    }
    if hardware.gpu_count == 0:
        env["DS_ACCELERATOR"] = "cpu"
        env["TORCH_EXTENSIONS_DIR"] = str(torch_extensions_dir(current_env, cache_dir))
    unset = [name for name in VERTEX_NODE_LEVEL_VARIABLES if name in current_env]
    return LaunchPlan(topology, hardware, argv, env, unset)


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


def redact_secrets(argv: list[str]) -> list[str]:
    redacted = list(argv)
    for i, arg in enumerate(redacted[:-1]):
        if arg.startswith("--") and any(mark in arg.lower() for mark in SECRET_FLAG_MARKERS):
            redacted[i + 1] = "***"
    return redacted


def prepare_launch(argv: list[str], env: Mapping[str, str]) -> tuple[LauncherArguments, LaunchPlan]:
    """Everything before the exec: parse, validate, resolve (the I/O: local checks, the
    GCS dataset fetch and probes, and one Hub metadata call per uncached Hub id)."""
    from trainer.config.deepspeed import resolve_deepspeed_config
    from trainer.config.flags import FlagParser, parse_flags
    from trainer.config.hardware_defaults import fast_defaults, flag_names
    from trainer.launcher.hardware import check_gpus_usable, detect_hardware, gpu_evidence
    from trainer.launcher.hub_checks import check_hub_ids, hub_ids
    from trainer.storage.locations import check_output_locations, resolve_output_locations

    options, training_argv = FlagParser([LauncherArguments]).parse_known_args(
        expand_config_file(argv)
    )
    options = LauncherArguments(**vars(options))
    if options.chief_resolve_timeout < 0:
        raise UserError("--chief_resolve_timeout must be 0 (one attempt) or more seconds.")
    hardware = detect_hardware()
    check_gpus_usable(hardware.gpu_count, requested_accelerators(env), gpu_evidence(), env)
    if hardware.gpu_count == 0:
        # As the plan sets for the training processes: the checks below import DeepSpeed,
        # which otherwise warns, on a node known to have no GPU, that it found none.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    topology = resolve_topology(
        env, hardware.gpu_count, options.nproc_per_node, options.master_port
    )
    deepspeed_config = resolve_deepspeed_config(options.deepspeed)

    training_argv, notices = translate_example_flags(training_argv)
    flags = parse_flags(training_argv)
    if flags.model.model_name_or_path is None and flags.data.dataset_name is not None:
        training_argv = with_default_model(flags, training_argv)
        flags = parse_flags(training_argv)
    if flags.model.model_name_or_path is None or flags.data.dataset_name is None:
        training_argv = with_demo_defaults(flags, training_argv)
        flags = parse_flags(training_argv)
    sources = flags.task.sources()  # several when streams are interleaved
    for source in sources:
        source.check_inputs()
    if not options.skip_hub_check:
        ids = hub_ids(flags.model.model_name_or_path, None) + [
            repo for source in sources for repo in hub_ids(None, source.data_args.dataset_name)
        ]
        check_hub_ids(ids, env, flags.model.cache_dir)
    if not options.dry_run:  # a dry run writes nothing, not even a probe file
        check_output_locations(
            resolve_output_locations(flags.outputs, env, flags.training.output_dir)
        )
    given = flag_names(training_argv)  # recipes are flags by now, so they count as given
    chose_precision = bool(given & {"--bf16", "--fp16"})
    mixed_precision = resolve_mixed_precision(
        flags.training.bf16, flags.training.fp16, hardware, chose_precision
    )
    if mixed_precision != "no" and not chose_precision:
        training_argv = [*training_argv, f"--{mixed_precision}", "true"]
    training_argv = [*training_argv, *fast_defaults(hardware, given)]
    training_argv, shm_notices = fit_loader_workers(training_argv, topology.nproc_per_node)

    plan = build_launch_plan(
        topology,
        hardware,
        options,
        deepspeed_config,
        training_argv,
        mixed_precision,
        env,
        cache_dir(),
        stop_grace_seconds=flags.outputs.stop_grace_seconds,
    )
    return options, replace(plan, notices=[*notices, *shm_notices])


def fit_loader_workers(
    training_argv: list[str], procs_per_node: int
) -> tuple[list[str], list[str]]:
    """Log /dev/shm's size; lower --dataloader_num_workers when it cannot hold them."""
    from trainer.config.hardware_defaults import MIB, last_flag_value, loader_workers_for_shm
    from trainer.launcher.hardware import shared_memory_bytes

    shm = shared_memory_bytes()
    if shm is None:
        return training_argv, ["/dev/shm: not present"]
    workers = int(last_flag_value(training_argv, "--dataloader_num_workers") or 0)
    allowed, warning = loader_workers_for_shm(shm, workers, procs_per_node)
    notices = [f"/dev/shm: {shm // MIB} MiB, {workers} loader worker(s) per process asked"]
    if warning is None:
        return training_argv, notices
    lowered = ["--dataloader_num_workers", str(allowed)]
    if allowed == 0:  # persistent workers need workers
        lowered += ["--dataloader_persistent_workers", "false"]
    return [*training_argv, *lowered], [*notices, f"warning: {warning}"]


def wait_for_name(
    host: str,
    timeout: float,
    resolve: Callable[[str], object] = lambda host: socket.getaddrinfo(host, None),
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Retry resolving `host` with backoff (1, 2, 4 ... 15 s) until `timeout` seconds pass.

    On Vertex AI a worker may start before the chief, whose name resolves only once the
    chief's Service exists; static rendezvous given a name that does not resolve fails at
    once instead of waiting. A name that never resolves is one UserError.
    """
    deadline = clock() + timeout
    delay, attempt = 1.0, 1
    while True:
        try:
            resolve(host)
            return
        except OSError as error:
            remaining = deadline - clock()
            if remaining <= 0:
                raise UserError(
                    f"The chief's address {host} did not resolve within {timeout:g} s "
                    f"({attempt} attempt(s), last: {error}): the chief replica has not started "
                    "or its name is wrong; raise --chief_resolve_timeout if replicas start "
                    "further apart."
                ) from None
            print(f"waiting for the chief's address {host} to resolve ({error})", flush=True)
            sleep(min(delay, remaining))
            delay, attempt = min(delay * 2, 15.0), attempt + 1


def with_default_model(flags, training_argv: list[str]) -> list[str]:
    """A dataset but no model: the task's default model, as its HF example script has one
    (run_image_classification.py: google/vit-base-patch16-224-in21k); unchanged if none."""
    model = flags.task.default_model
    return training_argv if model is None else [*training_argv, "--model_name_or_path", model]


def with_demo_defaults(flags, training_argv: list[str]) -> list[str]:
    """No model and no dataset given: the built-in demo (tiny Whisper, synthesized speech).

    Its assets are built on this node (once; they are cached), since nodes share no disk.
    """
    from trainer.tasks import DEFAULT_TASK, load_task

    if flags.model.model_name_or_path is not None or flags.data.dataset_name is not None:
        raise UserError(
            "Give both --model_name_or_path and --dataset_name, "
            "or neither to run the built-in demo."
        )
    if type(flags.task) is not load_task(DEFAULT_TASK):
        raise UserError(
            f"The built-in demo is {DEFAULT_TASK}; for other tasks give "
            "--model_name_or_path and --dataset_name (see docs/tasks.md for recipes)."
        )
    from trainer.launcher.demo_assets import prepare_demo_assets

    assets = prepare_demo_assets(cache_dir() / "demo")
    return [
        *config_file_flags(DEMO_RECIPE),
        "--model_name_or_path", str(assets.model_dir),
        "--dataset_name", str(assets.dataset_dir),
        *training_argv,
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    launched_at = time.time()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if set(HELP_FLAGS) & set(argv):
            print_help([a for a in argv if a not in HELP_FLAGS], "--help-all" in argv)
            return
        from trainer.common.quiet import silence_known_noise
        from trainer.launcher.cuda_driver import ensure_cuda_driver

        driver = ensure_cuda_driver(argv, os.environ)  # before torch loads; may start again
        silence_known_noise()  # the demo's assets are built here; the environment is inherited
        options, plan = prepare_launch(argv, os.environ)
        for notice in [driver, *plan.notices]:  # stdout is the plan's JSON in a dry run
            print(notice, file=sys.stderr if options.dry_run else sys.stdout, flush=True)
        if options.dry_run:
            print(json.dumps(plan.describe(), indent=2))
            return
        if plan.topology.role == "worker":
            wait_for_name(plan.topology.master_addr, options.chief_resolve_timeout)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)
    topology = plan.topology
    print(
        f"node {topology.node_rank} of {topology.num_nodes} ({topology.role}), "
        f"{topology.nproc_per_node} process(es) per node, world size {topology.world_size}, "
        f"rendezvous {topology.master_addr}:{topology.master_port} "
        f"(launcher checks took {time.time() - launched_at:.1f} s)",
        flush=True,
    )
    if "TORCH_EXTENSIONS_DIR" in plan.env:
        for lock in clear_stale_build_locks(Path(plan.env["TORCH_EXTENSIONS_DIR"]), time.time()):
            print(f"removed a stale build lock left by a killed run: {lock}", flush=True)
    env = {k: v for k, v in os.environ.items() if k not in plan.unset_env} | plan.env
    env[LAUNCHED_AT_VARIABLE] = str(launched_at)  # for the time-to-first-step line
    os.execve(plan.argv[0], plan.argv, env)
