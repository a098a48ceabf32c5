"""Progress lines: the data-wait share is measured where the Trainer pulls batches."""

from __future__ import annotations

import re
import time

import torch
from transformers import Trainer, TrainingArguments

from trainer.progress import DataWaitClock, ProgressLogCallback

LOADER_DELAY = 0.2


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, inputs, labels):
        return {"loss": ((self.linear(inputs).squeeze(-1) - labels) ** 2).mean()}


def slow_collator(examples):
    time.sleep(LOADER_DELAY)  # stands in for decoding audio in the training process
    return {
        "inputs": torch.tensor([example["inputs"] for example in examples]),
        "labels": torch.tensor([example["labels"] for example in examples]),
    }


def test_data_wait_counts_the_loader_time_of_every_step(tmp_path, capsys):
    rows = [{"inputs": [float(i), 1.0], "labels": float(i)} for i in range(16)]
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=3, logging_steps=1, per_device_train_batch_size=2,
        report_to=[], disable_tqdm=True, use_cpu=True, save_strategy="no",
    )  # fmt: skip
    trainer = Trainer(
        model=Regression(), args=args, train_dataset=rows, data_collator=slow_collator
    )
    clock = DataWaitClock()
    clock.attach(trainer)
    trainer.add_callback(ProgressLogCallback(clock))

    started = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - started

    assert 3 * LOADER_DELAY <= clock.seconds < elapsed
    shares = [int(s) for s in re.findall(r"data wait (\d+)%", capsys.readouterr().out)]
    assert len(shares) == 3 and all(share > 0 for share in shares)
