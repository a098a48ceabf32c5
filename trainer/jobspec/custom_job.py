"""The CustomJobSpec that config.yaml holds and every tuning trial runs: the flags of
`python -m trainer.jobspec` that shape a job, their checks (the image pinned, the package's
bucket, placement, scheduling, the A3 fabric: what Vertex AI would otherwise refuse only
once the job is submitted), and each worker pool's machine, env and container args, or,
with --python_package, the installed sdist as its program."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from trainer.common.errors import UserError
from trainer.common.flag_fields import flag
from trainer.config.topology import GPUS_PER_REPLICA_VARIABLE
from trainer.preflight.vertex_machines import resolve_accelerator

DEFAULT_IMAGE = "us-central1-docker.pkg.dev/PROJECT_ID/vertex-trainer/vertex-hf-trainer:COMMIT_SHA"
"""cloudbuild.yaml's immutable push target, `:${_TAG}` (the commit SHA), with its default
substitutions; PROJECT_ID and COMMIT_SHA are yours. Not `:latest`: Vertex AI pulls the image
again on every restart, and a resumed job must run the code it started with."""

MUTABLE_TAGS = {"latest"}

DEFAULT_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "NCCL_DEBUG": "WARN",
}
"""Progress bars redraw with carriage returns, which Cloud Logging turns into thousands of
lines; NCCL warnings are what explains a multi-node hang."""

MIN_BOOT_DISK_GB = 100

SPOT_SAVE_INTERVAL_MINUTES = 10
"""With --spot every node also saves by time (unless the training flags set
`--save_interval_minutes`): a preemption whose stop checkpoint cannot be uploaded within the
grace (whisper-medium and up; whisper-small below about 1 GB/s) loses at most this much work.
Young's optimum sqrt(2 x save cost x mean time between preemptions) for the largest shipped
model's blocking save (whisper-large-v3, ~15 s) and an assumed 4 h between preemptions (Vertex
AI publishes no rate) is about 11 minutes (docs/restarts.md, "The save interval with --spot")."""

DEFAULT_MAX_WAIT_HOURS = 24
"""Vertex AI's own default for a FLEX_START job's maxWaitDuration (1 day)."""
FLEX_START_MAX_TIMEOUT_HOURS = 7 * 24
FLEX_START_GPUS = {
    "NVIDIA_L4", "NVIDIA_TESLA_A100", "NVIDIA_A100_80GB", "NVIDIA_H100_80GB",
    "NVIDIA_H100_MEGA_80GB", "NVIDIA_H200_141GB",
}  # fmt: skip
"""Dynamic Workload Scheduler's requirements for custom training (Vertex AI, "Schedule training
jobs based on resource availability"): L4, A100, H100, H200 or B200 GPUs, a timeout of 7 days
or less, one machine configuration in every worker pool (as always written here)."""


@dataclass
class JobSpecArguments:
    nodes: int = flag(2, "Machines in the job (1 chief + workers).")
    machine_type: str = flag("a2-highgpu-8g", "Vertex machine type.")
    accelerator_type: str | None = flag(None, "GPU type (default: the machine type's own).")
    accelerator_count: int | None = flag(
        None,
        "GPUs per machine (default: the most it offers that its vCPUs can feed, "
        "4 vCPUs a GPU: n1-standard-4 gets 1 T4, n1-standard-16 gets 4).",
    )
    image: str = flag(
        DEFAULT_IMAGE, "The training image, pinned: its commit tag or @sha256 digest."
    )
    spot: bool = flag(
        False,
        "Run on Spot VMs (scheduling strategy SPOT); preempted jobs resume, and "
        f"nodes save every {SPOT_SAVE_INTERVAL_MINUTES} minutes unless the training flags "
        "give --save_interval_minutes.",
    )
    flex_start: bool = flag(
        False,
        "Dynamic Workload Scheduler (scheduling strategy FLEX_START): the job waits "
        "until every GPU it asks for is available, then starts all nodes together.",
    )
    max_wait_hours: int | None = flag(
        None,
        "With --flex_start or --spot: hours Vertex AI may wait for the GPUs "
        f"(maxWaitDuration; FLEX_START's default {DEFAULT_MAX_WAIT_HOURS}, 0 waits without "
        "limit; with --spot not written unless given).",
    )
    base_output_dir: str = flag(
        "gs://BUCKET/whisper-small-sr",
        "gs:// prefix of checkpoints, logs and model (baseOutputDirectory).",
    )
    boot_disk_size_gb: int = flag(200, "Per machine: the image, caches and local checkpoints.")
    timeout_hours: int = flag(24, "Vertex stops the job after this.")
    recipe: str = flag(
        "whisper-small.yaml", "Recipe shipped in the image (trainer/recipes/) or a /gcs/ path."
    )
    deepspeed: str = flag("zero2", "DeepSpeed preset or JSON path.")
    env: list[str] = flag([], "Extra NAME=VALUE variables for every node.")
    skip_hub_check: bool = flag(
        False, "Do not ask the Hugging Face Hub whether the model and dataset exist."
    )
    accept_tcp_between_nodes: bool = flag(
        False,
        "Allow a multi-node job on A3 machines although this image configures no "
        "GPUDirect-TCPX/TCPXO: NCCL then runs over TCP between nodes (a few GB/s instead of "
        "hundreds); every multi-node run prints its measured all-reduce bandwidth.",
    )
    service_account: str | None = flag(
        None,
        "The service account email every node runs as (serviceAccount): it reads "
        "the --secret references, the bucket and a --tensorboard instance. Default: "
        "Vertex AI's own service agent.",
    )
    tensorboard: str | None = flag(
        None,
        "A Vertex AI TensorBoard instance for the job's logs: "
        "projects/P/locations/L/tensorboards/ID (needs --service_account).",
    )
    enable_web_access: bool = flag(
        False, "An interactive shell into every node, e.g. to look into a hang."
    )
    network: str | None = flag(
        None, "A peered VPC network for the nodes: projects/PROJECT_NUMBER/global/networks/NAME."
    )
    reservation: str | None = flag(
        None,
        "Compute Engine reservation to draw the machines from: "
        "projects/P/zones/Z/reservations/NAME, or 'any' for any matching one.",
    )
    persistent_resource_id: str | None = flag(
        None, "Run on this Vertex AI persistent resource (already provisioned)."
    )
    python_package: bool = flag(
        False,
        "Run this checkout's code on --image without rebuilding it: build its "
        "sdist, upload it under --base_output_dir/packages/ and write every pool as a "
        "pythonPackageSpec (executor: --image; --check builds but uploads nothing).",
    )
    python_package_command: bool = flag(
        False,
        "With --python_package: write every pool as a containerSpec of --image "
        "whose command installs the sdist from Cloud Storage FUSE (/gcs/...) and then "
        "runs python -m trainer, as the Vertex AI SDK does for an image that is not a "
        "prebuilt one, instead of a pythonPackageSpec (docs/deploy.md says when).",
    )
    max_trial_count: int = flag(8, "Tuning: trials in total.")
    parallel_trial_count: int = flag(2, "Tuning: trials at once.")


def check_options(options: JobSpecArguments) -> None:
    if options.nodes < 1:
        raise UserError(f"--nodes must be at least 1 (the chief), got {options.nodes}.")
    if not options.base_output_dir.startswith("gs://") or options.base_output_dir == "gs://":
        raise UserError(
            f"--base_output_dir must be a gs:// URI (Vertex AI derives AIP_CHECKPOINT_DIR, "
            f"AIP_MODEL_DIR and AIP_TENSORBOARD_LOG_DIR from it), got {options.base_output_dir!r}."
        )
    if options.boot_disk_size_gb < MIN_BOOT_DISK_GB:
        raise UserError(f"--boot_disk_size_gb must be at least {MIN_BOOT_DISK_GB} (Vertex AI).")
    if options.timeout_hours < 1:
        raise UserError("--timeout_hours must be at least 1.")
    if not 1 <= options.parallel_trial_count <= options.max_trial_count:
        raise UserError(
            "--parallel_trial_count must be between 1 and --max_trial_count "
            f"({options.max_trial_count}), got {options.parallel_trial_count}."
        )
    for item in options.env:
        if "=" not in item or not item.split("=", 1)[0]:
            raise UserError(f'--env takes NAME=VALUE, got "{item}".')
    check_image_is_pinned(options.image)
    check_package_bucket(options)
    check_flex_start(options)
    check_placement(options)
    check_fabric(options)


def check_fabric(options: JobSpecArguments) -> None:
    """A3 machines' GPUs talk across nodes through GPUDirect-TCPX (A3 High) or TCPXO (A3 Mega),
    whose NCCL plugins and settings this image lacks (and could not verify): NCCL then falls
    back to TCP, many times slower, so a multi-node A3 job needs the user's explicit consent."""
    multi_node_a3 = options.nodes > 1 and options.machine_type.startswith("a3-")
    if multi_node_a3 and not options.accept_tcp_between_nodes:
        raise UserError(
            f"--nodes {options.nodes} on {options.machine_type}: this image does not set up "
            "A3's GPUDirect-TCPX/TCPXO fabric, so NCCL would run over TCP between nodes "
            "(a few GB/s, not hundreds); use one A3 node, or pass "
            "--accept_tcp_between_nodes to run anyway (docs/deploy.md)."
        )


PLACEMENT_SHAPES = {
    "service_account": (r"[^@\s]+@[^@\s]+\.[a-z]+", "NAME@PROJECT.iam.gserviceaccount.com"),
    "tensorboard": (
        r"projects/[^/]+/locations/[^/]+/tensorboards/[^/]+",
        "projects/P/locations/L/tensorboards/ID",
    ),
    "network": (
        r"projects/\d+/global/networks/[^/]+",
        "projects/PROJECT_NUMBER/global/networks/NAME",
    ),
    "reservation": (
        r"any|projects/[^/]+/zones/[^/]+/reservations/[^/]+",
        "projects/P/zones/Z/reservations/NAME or any",
    ),
    "persistent_resource_id": (r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?", "lower-case letters, digits, -"),
}
"""Flag -> (what Vertex AI accepts, an example): its API reference for CustomJobSpec and
MachineSpec's ReservationAffinity, checked here rather than by a rejected submission."""


def check_placement(options: JobSpecArguments) -> None:
    """Who the nodes run as, where they run, and what they may reach."""
    for name, (shape, example) in PLACEMENT_SHAPES.items():
        value = getattr(options, name)
        if value is not None and not re.fullmatch(shape, value):
            raise UserError(f"--{name} {value!r} is not of the form {example}.")
    if options.tensorboard and not options.service_account:
        raise UserError(
            "--tensorboard needs --service_account: Vertex AI writes to a TensorBoard instance "
            "only as a service account that has roles/aiplatform.user and roles/storage.admin "
            "on the job's bucket (docs/deploy.md)."
        )
    check_scheduling(options)


def check_scheduling(options: JobSpecArguments) -> None:
    """Machines a reservation or persistent resource provides are not scheduled."""
    scheduled = "--spot" if options.spot else "--flex_start" if options.flex_start else None
    if options.reservation and scheduled:
        raise UserError(
            f"--reservation and {scheduled}: reserved machines are neither Spot VMs nor "
            "scheduled by Dynamic Workload Scheduler; choose one."
        )
    if options.persistent_resource_id and scheduled:
        raise UserError(
            f"--persistent_resource_id and {scheduled}: a persistent resource's machines are "
            "already provisioned, so the job has no scheduling strategy; choose one."
        )


def placement_fields(options: JobSpecArguments) -> dict:
    """The CustomJobSpec fields of the placement flags that were given (REST names)."""
    fields = {
        "serviceAccount": options.service_account,
        "tensorboard": options.tensorboard,
        "enableWebAccess": options.enable_web_access or None,
        "network": options.network,
        "persistentResourceId": options.persistent_resource_id,
    }
    return {name: value for name, value in fields.items() if value is not None}


def reservation_affinity(reservation: str) -> dict:
    """MachineSpec.reservationAffinity for --reservation (a name, or any)."""
    if reservation == "any":
        return {"reservationAffinityType": "ANY_RESERVATION"}
    return {
        "reservationAffinityType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": [reservation],
    }


def check_flex_start(options: JobSpecArguments) -> None:
    """FLEX_START's own rules, which Vertex AI would only enforce once the job is submitted."""
    if options.max_wait_hours is not None and options.max_wait_hours < 0:
        raise UserError("--max_wait_hours must be 0 (no limit) or more.")
    if not options.flex_start:
        if options.max_wait_hours is not None and not options.spot:
            raise UserError("--max_wait_hours only applies with --flex_start or --spot.")
        return
    if options.spot:
        raise UserError("--flex_start and --spot are two scheduling strategies: choose one.")
    gpu, _ = accelerator(options)
    if gpu not in FLEX_START_GPUS:
        raise UserError(
            f"--flex_start needs L4, A100, H100 or H200 GPUs; {options.machine_type} has {gpu}."
        )
    if options.timeout_hours > FLEX_START_MAX_TIMEOUT_HOURS:
        raise UserError(
            f"--flex_start jobs may run at most {FLEX_START_MAX_TIMEOUT_HOURS} hours; lower "
            f"--timeout_hours {options.timeout_hours}."
        )


def check_image_is_pinned(image: str) -> None:
    """A job must name an immutable image: a restart pulls it again, and a tag that moved
    in between (a build pushed mid-run) would resume the job on other code."""
    if "@sha256:" in image:
        return
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag or tag in MUTABLE_TAGS:
        raise UserError(
            f"--image {image} is not pinned: name the commit tag cloudbuild.yaml pushed "
            "(...:$(git rev-parse --short HEAD)) or a digest (...@sha256:...), so a restarted "
            "job runs the same code."
        )


def node_env(options: JobSpecArguments, gpus: int) -> dict[str, str]:
    """What Vertex AI and the spec give the chief's container: the pools' addresses in
    CLUSTER_SPEC, the output locations under --base_output_dir, the spec's variables."""
    workers = [f"workerpool1-{index}:2222" for index in range(options.nodes - 1)]
    cluster = {"workerpool0": ["workerpool0-0:2222"], "workerpool1": workers}
    task = {"type": "workerpool0", "index": 0}
    base = options.base_output_dir.rstrip("/")
    return {
        **spec_env(options, gpus),
        "CLUSTER_SPEC": json.dumps({"cluster": cluster, "task": task}),
        "AIP_CHECKPOINT_DIR": f"{base}/checkpoints/",
        "AIP_MODEL_DIR": f"{base}/model/",
        "AIP_TENSORBOARD_LOG_DIR": f"{base}/logs/",
    }


def spec_env(options: JobSpecArguments, gpus: int) -> dict[str, str]:
    """Every pool's container env: the defaults, --env, and the GPUs it must have."""
    env = DEFAULT_ENV | dict(item.split("=", 1) for item in options.env)
    env[GPUS_PER_REPLICA_VARIABLE] = str(gpus)  # CLUSTER_SPEC does not say it
    return env


def accelerator(options: JobSpecArguments) -> tuple[str, int]:
    return resolve_accelerator(
        options.machine_type, options.accelerator_type, options.accelerator_count
    )


def container_args(options: JobSpecArguments, training_flags: list[str]) -> list[str]:
    args = [options.recipe, "--deepspeed", options.deepspeed, *training_flags]
    given = {flag.split("=", 1)[0] for flag in training_flags}
    if options.spot and "--save_interval_minutes" not in given:
        args += ["--save_interval_minutes", str(SPOT_SAVE_INTERVAL_MINUTES)]
    if "--register_model" in given and "--serving_image" not in given:
        args += ["--serving_image", serving_image_of(options.image)]
    return args


def serving_image_of(image: str) -> str:
    """The serving image cloudbuild.yaml pushes beside `image`, from the same commit:
    IMAGE-serve:TAG. A digest names one image only: UserError, asking for --serving_image."""
    name, colon, tag = image.rpartition(":")
    if "@" in image or not colon or "/" in tag:
        raise UserError(
            f"--register_model: --image {image} does not name its serving image by a tag: "
            "pass --serving_image (IMAGE-serve:COMMIT, pushed by cloudbuild.yaml)"
        )
    return f"{name}-serve:{tag}"


def custom_job_spec(
    options: JobSpecArguments, training_flags: list[str], package_uri: str | None = None
) -> dict:
    """A CustomJobSpec (REST names): workerpool0 = chief, workerpool1 = the others, all running
    the image with the same args and env, or, given `package_uri`, as that sdist's executor."""
    gpu, count = accelerator(options)
    env = spec_env(options, count)

    def code() -> dict:
        """The pool's program: new objects for each pool (YAML would print shared ones as
        anchors and aliases)."""
        run = {
            "args": container_args(options, training_flags),
            "env": [{"name": name, "value": value} for name, value in env.items()],
        }
        if package_uri is None:
            return {"containerSpec": {"imageUri": options.image, **run}}
        if options.python_package_command:
            command = installing_command(package_uri)
            return {"containerSpec": {"imageUri": options.image, "command": command, **run}}
        return {
            "pythonPackageSpec": {
                "executorImageUri": options.image,
                "packageUris": [package_uri],
                "pythonModule": PACKAGE_MODULE,
                **run,
            }
        }

    def pool(replicas: int) -> dict:
        machine = dict(
            machineType=options.machine_type, acceleratorType=gpu, acceleratorCount=count
        )
        if options.reservation:
            machine["reservationAffinity"] = reservation_affinity(options.reservation)
        return {
            "machineSpec": machine,
            "replicaCount": replicas,
            "diskSpec": {"bootDiskSizeGb": options.boot_disk_size_gb},
            **code(),
        }

    scheduling = {
        "timeout": f"{options.timeout_hours * 3600}s",
        # Static rendezvous: one restarted node cannot rejoin the others' process group,
        # so the whole job restarts and resumes from the last complete checkpoint.
        "restartJobOnWorkerRestart": True,
        # true would stop Vertex AI's retries and override the line above to false.
        "disableRetries": False,
    }
    if options.spot:
        scheduling["strategy"] = "SPOT"
        if options.max_wait_hours is not None:
            scheduling["maxWaitDuration"] = f"{options.max_wait_hours * 3600}s"
    if options.flex_start:
        wait = DEFAULT_MAX_WAIT_HOURS if options.max_wait_hours is None else options.max_wait_hours
        scheduling["strategy"] = "FLEX_START"
        scheduling["maxWaitDuration"] = f"{wait * 3600}s"
    pools = [pool(1)] + ([pool(options.nodes - 1)] if options.nodes > 1 else [])
    return {
        "workerPoolSpecs": pools,
        "baseOutputDirectory": {"outputUriPrefix": options.base_output_dir},
        "scheduling": scheduling,
        **placement_fields(options),
    }


PACKAGE_MODULE = "trainer"
"""What a `pythonPackageSpec` runs from the installed sdist: `python -m trainer`, the
launcher, as the image's entrypoint does."""

PLACEHOLDER_BUCKET = "BUCKET"


def installing_command(package_uri: str) -> list[str]:
    """A container command installing the sdist at `package_uri` (via the /gcs/ mount) over the
    image's copy (its user site, docker/Dockerfile), then running the launcher with the pool's
    args. No build isolation: a node without PyPI installs on the image's setuptools. `exec`: a
    Spot notice's SIGTERM reaches the launcher, not a shell that would keep it."""
    local = "/gcs/" + package_uri.removeprefix("gs://")
    install = f"python -m pip install --quiet --user --no-build-isolation {shlex.quote(local)}"
    return ["sh", "-c", f'{install} && exec python -m {PACKAGE_MODULE} "$@"', PACKAGE_MODULE]


def check_package_bucket(options: JobSpecArguments) -> None:
    """--python_package uploads to the job's bucket, which must be a real one: found out
    here, before the sdist is built, not by a failed upload."""
    if options.python_package_command and not options.python_package:
        raise UserError("--python_package_command says how to run --python_package: give both.")
    bucket = options.base_output_dir.removeprefix("gs://").split("/")[0]
    if options.python_package and bucket == PLACEHOLDER_BUCKET:
        raise UserError(
            "--python_package uploads the sdist next to the job's outputs, and no bucket is "
            f"known: give --base_output_dir gs://YOUR_BUCKET/..., not {options.base_output_dir}."
        )
