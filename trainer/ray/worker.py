"""What each Ray Train worker runs: the one training core, with the configuration the entry
resolved and checked. Ray Train has already made the process group (gloo on CPU, NCCL on
GPU) and set RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and NODE_RANK, which the core
reads as it reads torchrun's (trainer/training/distributed.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import ray.train

from trainer.common.quiet import silence_known_noise
from trainer.node.training_env import prepare_node
from trainer.settings.run_config import RunConfig


def train_on_worker(loop_config: dict) -> None:
    """Train (resuming from the last complete checkpoint, as after any restart), then hand
    the final metrics to Ray. A worker Ray starts again after a failure runs this again."""
    os.environ.update(loop_config["env"])  # as the launch plan sets for its processes
    silence_known_noise()
    # Imported after the noise filters, as in trainer/training/rank.py.
    from trainer.training.run import train

    config = RunConfig.from_json(loop_config["run_config"])
    # The secrets are read here, not handed over: Ray stores the loop's arguments. The
    # demo's assets are this node's copy (nodes share no disk), built once.
    os.environ.update(prepare_node(config, os.environ))
    train(config, loop_config["launched_at"])
    context = ray.train.get_context()
    ray.train.report(final_metrics(config) if context.get_world_rank() == 0 else {})


def final_metrics(config: RunConfig) -> dict:
    """The metrics the Trainer saved at the end (all_results.json), with where the run's
    checkpoints, best checkpoint and model are: what `fit()`'s Result carries."""
    output_dir = Path(config.training.output_dir)
    locations = config.locations
    results = output_dir / "all_results.json"
    metrics = json.loads(results.read_text()) if results.exists() else {}
    metrics |= {"checkpoint_dir": locations.checkpoints, "model_dir": locations.model}
    best = best_checkpoint(output_dir)
    if best is not None:
        metrics["best_checkpoint"] = f"{locations.checkpoints.rstrip('/')}/{best}"
    return metrics


def best_checkpoint(output_dir: Path) -> str | None:
    """The best checkpoint's name, as the newest local checkpoint's trainer state records it
    (set when --metric_for_best_model is)."""
    states = sorted(
        output_dir.glob("checkpoint-*/trainer_state.json"),
        key=lambda path: int(path.parent.name.split("-")[1]),
    )
    if not states:
        return None
    best = json.loads(states[-1].read_text()).get("best_model_checkpoint")
    return best and Path(best).name
