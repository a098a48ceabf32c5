"""A micro-batch's time on one GPU against `--stop_grace_seconds`, before launch.

On SIGTERM the ranks finish the micro-batch in flight before they can agree on the stop and
save it (trainer/training/callbacks.py); a micro-batch longer than the grace leaves no time to
save, and a preemption loses the work since the newest complete checkpoint. The training
processes warn once they have timed it; the plan estimates it from the model's FLOPs and the
GPU's peak (trainer/common/step_time.py) so that `python -m trainer.jobspec --spot` and a GPU
node's `--dry-run` say it before a GPU is rented.
"""

from __future__ import annotations

from trainer.common.step_time import (
    ASSUMED_UTILISATION,
    examples,
    micro_batch_seconds,
    peak_flops,
    stop_advice,
)
from trainer.settings.run_config import RunConfig
from trainer.tasks.base import Task

MICRO_BATCH_TIME = "micro_batch_time_per_gpu"
"""The plan's entry (beside `memory_per_gpu`): the estimate and what it is made of, or
`not_estimated` and why."""


def precision_of(config: RunConfig) -> str:
    """The matmuls' precision, as `PEAK_TFLOPS` tells peaks apart: 16-bit under bf16/fp16,
    else TF32 where `--tf32` turns it on, else FP32."""
    if config.mixed_precision in ("bf16", "fp16"):
        return "16-bit"
    return "tf32" if config.training.values.get("tf32") else "fp32"


def micro_batch_time(config: RunConfig, task: Task, model, checkpointing: bool) -> dict:
    """The plan's estimate of one micro-batch (`--per_device_train_batch_size` examples,
    forward and backward, with `checkpointing` as planned) on one of the node's GPUs."""
    hardware = config.hardware
    if hardware.gpu_count == 0:
        return {"not_estimated": "a CPU-only node: the estimate is made from a GPU's peak"}
    precision = precision_of(config)
    peak = peak_flops(hardware.gpu_name, precision)
    if peak is None:
        return {
            "not_estimated": f"no peak known for {hardware.gpu_name} (PEAK_TFLOPS in "
            "trainer/common/step_time.py)"
        }
    forward = task.forward_flops_per_sample(model)
    if forward is None:
        return {"not_estimated": f"the {config.task} task counts no FLOPs"}
    per_example = forward.training(checkpointing)
    batch = config.training.per_device_train_batch_size
    return {
        "seconds_estimate": significant(micro_batch_seconds(per_example, batch, peak)),
        "batch_size": batch,
        "training_tflop_per_example": significant(per_example / 1e12),
        "gpu": hardware.gpu_name,
        "precision": precision,
        "peak_tflops": peak / 1e12,
        "assumed_utilisation": ASSUMED_UTILISATION,
        "gradient_checkpointing": checkpointing,
    }


def significant(value: float) -> float:
    """Four significant digits: a tiny model's micro-batch takes microseconds."""
    return float(f"{value:.4g}")


def stop_grace_warning(config: RunConfig, plan: dict | None) -> str | None:
    """One `warning:` line when the plan's micro-batch estimate exceeds `--stop_grace_seconds`:
    what a preemption would lose and what to change (the runtime warning's advice); None when
    it fits or was not estimated. A warning, not a refusal: the estimate is a model, and a
    run that cannot save on a stop still saves on its schedule."""
    estimate = (plan or {}).get(MICRO_BATCH_TIME) or {}
    seconds = estimate.get("seconds_estimate")
    grace = config.outputs.stop_grace_seconds
    if seconds is None or seconds <= grace:
        return None
    batch = estimate["batch_size"]
    interval = config.outputs.save_interval_minutes
    bound = f" (at most about {interval:g} minutes: --save_interval_minutes)" if interval else ""
    return (
        f"warning: a micro-batch of {examples(batch)} is estimated at about {seconds:.0f} s "
        f"on one {estimate['gpu']} ({estimate['training_tflop_per_example'] * batch:.0f} TFLOP "
        f"at {estimate['assumed_utilisation']:.0%} of its {estimate['peak_tflops']:g} TFLOP/s "
        f"peak), longer than --stop_grace_seconds {grace:g}: the ranks can agree on a stop only "
        "between micro-batches, so a preemption would lose the work since the newest complete "
        f"checkpoint{bound}. " + stop_advice(int(grace * batch // seconds))
    )
