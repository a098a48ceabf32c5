"""The Ray entry's own flags: how many Ray Train workers, with what resources, on which
cluster. Read once by `python -m trainer.ray`; every other flag is a training flag."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.command_line.parser import FlagParser
from trainer.common.errors import UserError
from trainer.common.flag_fields import flag


@dataclass
class RayArguments:
    address: str = flag(
        "auto",
        "The Ray cluster: host:port of its head (GCS), ray://host:10001, or auto "
        "(this node's cluster, or $RAY_ADDRESS, as inside a submitted job).",
    )
    num_workers: int | None = flag(
        None,
        "Ray Train workers, one training process each (default: one per GPU of "
        "the cluster with --use_gpu, else one per node that has CPUs).",
    )
    use_gpu: bool | None = flag(
        None, "Give each worker GPUs (default: true when the cluster has GPUs)."
    )
    cpus_per_worker: float = flag(1, "CPUs Ray reserves for each worker.")
    gpus_per_worker: float = flag(1, "GPUs Ray reserves for each worker, with --use_gpu.")
    max_failures: int = flag(
        3,
        "How often Ray restarts the workers after one fails (FailureConfig); the "
        "run resumes from the last complete checkpoint each time. -1: without limit.",
    )
    ray_storage_path: str | None = flag(
        None,
        "Ray Train's own run state and results (RunConfig.storage_path; default: "
        "~/ray_results on the node running this). Checkpoints and the model go to "
        "--checkpoint_dir and --model_dir, as in a CustomJob.",
    )

    def __post_init__(self) -> None:
        if self.num_workers is not None and self.num_workers < 1:
            raise UserError("--num_workers must be 1 or more.")
        if self.cpus_per_worker <= 0 or self.gpus_per_worker <= 0:
            raise UserError("--cpus_per_worker and --gpus_per_worker must be above 0.")


def split_ray_flags(argv: list[str]) -> tuple[RayArguments, list[str]]:
    """The Ray entry's flags, and the training flags (with a leading recipe) that remain."""
    options, rest = FlagParser([RayArguments], add_help=False).parse_known_args(argv)
    return RayArguments(**vars(options)), rest
