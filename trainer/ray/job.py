"""The Ray Train job: one worker's hardware, asked of the cluster; the TorchTrainer."""

from __future__ import annotations

import os

import ray
from ray.train import CheckpointConfig, FailureConfig, ScalingConfig
from ray.train import RunConfig as RayRunConfig
from ray.train.torch import TorchConfig, TorchTrainer
from ray.train.torch.config import _shutdown_torch, _TorchBackend

from trainer.node import machine
from trainer.ray.ray_cluster import Workers
from trainer.ray.ray_flags import RayArguments
from trainer.ray.worker import train_on_worker
from trainer.settings.run_config import Hardware, RunConfig


def worker_hardware(workers: Workers) -> Hardware:
    """What one worker sees (GPUs, CPUs, /dev/shm), from a task with a worker's resources: flags
    are resolved for the workers' machines, not this entry's node (Ray on Vertex AI's head has
    no GPU). GPUs torch cannot use are refused there, as the launcher does on its node."""
    probe = ray.remote(num_cpus=workers.cpus, num_gpus=workers.gpus)(_detect_hardware)
    return ray.get(probe.remote(int(workers.gpus) if workers.use_gpu else None))


def _detect_hardware(requested_gpus: int | None) -> Hardware:
    hardware = machine.detect_hardware()
    machine.check_gpus_usable(
        hardware.gpu_count, requested_gpus, machine.gpu_evidence(), os.environ
    )
    return hardware


def build_trainer(
    config: RunConfig,
    handed_over: str,
    workers: Workers,
    asked: RayArguments,
    env: dict,
    launched_at: float,
) -> TorchTrainer:
    """Each worker trains with `handed_over` (`config` as JSON, no secret values: Ray stores the
    loop's arguments); a failed worker makes Ray restart all (up to --max_failures), resuming
    the run's last complete checkpoint: the project's (manifest last, in --checkpoint_dir), as
    Ray keeps none of its own (docs/ray.md)."""
    return TorchTrainer(
        train_on_worker,
        train_loop_config={
            "run_config": handed_over,
            "launched_at": launched_at,
            "env": env,
        },  # fmt: skip
        torch_config=CoreReleasedTorchConfig(
            backend="nccl" if workers.use_gpu else "gloo", timeout_s=config.training.ddp_timeout
        ),
        scaling_config=ScalingConfig(
            num_workers=workers.count,
            use_gpu=workers.use_gpu,
            resources_per_worker=workers.resources(),
            trainer_resources={"CPU": 0},  # the coordinating actor only waits
        ),
        run_config=RayRunConfig(
            storage_path=asked.ray_storage_path,
            failure_config=FailureConfig(max_failures=asked.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=1),
        ),
    )


class CoreReleasedTorchConfig(TorchConfig):
    """Ray's torch setup but for the end: the core destroys the process group after a successful
    run (training/distributed.py); Ray 2.47 doing it again fails the run."""

    @property
    def backend_cls(self):
        return CoreReleasedTorchBackend


class CoreReleasedTorchBackend(_TorchBackend):
    def on_shutdown(self, worker_group, backend_config) -> None:
        worker_group.execute(_shutdown_torch, destroy_process_group=False)
