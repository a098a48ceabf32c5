"""A two-weight regression model and its data: a real Trainer that runs in a second, for
tests of callbacks (progress lines, saves by time or on SIGTERM) rather than of a task."""

from __future__ import annotations

import torch
from transformers import TrainingArguments


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, inputs, labels):
        return {"loss": ((self.linear(inputs).squeeze(-1) - labels) ** 2).mean()}


def regression_rows(count: int) -> list[dict]:
    return [{"inputs": [float(i), 1.0], "labels": float(i)} for i in range(count)]


def regression_arguments(output_dir, max_steps: int, **extra) -> TrainingArguments:
    """Two rows per step on the CPU, no reporting, no saving unless `extra` says so."""
    return TrainingArguments(
        output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=2,
        report_to=[], disable_tqdm=True, use_cpu=True, **{"save_strategy": "no", **extra},
    )  # fmt: skip
