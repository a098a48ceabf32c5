"""Progress lines: the data-wait share is measured where the Trainer pulls batches, and
without --logging_steps lines come by time (a fake clock stands in for slow steps). That
two real ranks agree on when to log is tests/processes/test_two_process_speech_run.py's."""

from __future__ import annotations

import re
import time
from itertools import pairwise

import pytest
import torch
from transformers import PrinterCallback, Trainer, TrainerCallback

from tests.support.tiny_regression import Regression, regression_arguments, regression_rows
from trainer.training.progress import (
    DataWaitClock,
    ProgressLogCallback,
    TimedLogSchedule,
    before_after_line,
    evaluation_logged_at,
)

LOADER_DELAY = 0.2


def slow_collator(examples):
    time.sleep(LOADER_DELAY)  # stands in for decoding audio in the training process
    return {
        "inputs": torch.tensor([example["inputs"] for example in examples]),
        "labels": torch.tensor([example["labels"] for example in examples]),
    }


def test_data_wait_counts_the_loader_time_of_every_step(tmp_path, capsys):
    args = regression_arguments(tmp_path, max_steps=3, logging_steps=1)
    trainer = Trainer(
        model=Regression(), args=args, train_dataset=regression_rows(16),
        data_collator=slow_collator,
    )  # fmt: skip
    clock = DataWaitClock()
    clock.attach(trainer)
    trainer.add_callback(ProgressLogCallback(clock))

    started = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - started

    assert 3 * LOADER_DELAY <= clock.seconds < elapsed
    shares = [int(s) for s in re.findall(r"data wait (\d+)%", capsys.readouterr().out)]
    assert len(shares) == 3 and all(share > 0 for share in shares)


class FakeClock:
    """Seconds that pass only when a test says so: each batch 'takes' `step_seconds`."""

    def __init__(self, step_seconds: float) -> None:
        self.now = 1000.0
        self.step_seconds = step_seconds

    def __call__(self) -> float:
        return self.now


class LineTimes(TrainerCallback):
    """The fake time and step of every progress line (the Trainer's `loss` logs)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.lines: list[tuple[int, float]] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.clock.now += self.clock.step_seconds

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.lines.append((state.global_step, self.clock.now))


def train_with_fake_clock(
    tmp_path, step_seconds: float, max_steps: int, timed: bool, agree=lambda s: s, **extra
):
    """A real Trainer on a tiny model; returns the progress lines' (step, fake time)."""
    args = regression_arguments(tmp_path, max_steps, **extra)
    trainer = Trainer(model=Regression(), args=args, train_dataset=regression_rows(8))
    trainer.remove_callback(PrinterCallback)
    clock = FakeClock(step_seconds)
    recorder = LineTimes(clock)
    trainer.add_callback(recorder)
    trainer.add_callback(
        ProgressLogCallback(DataWaitClock(), timed=timed, clock=clock, agree=agree)
    )
    start = clock.now
    trainer.train()
    return start, recorder.lines


@pytest.mark.parametrize("step_seconds", [0.001, 0.5, 7.0, 45.0])
def test_without_logging_steps_a_line_comes_every_minute_and_every_5_percent(
    tmp_path, capsys, step_seconds
):
    max_steps = 60
    start, lines = train_with_fake_clock(tmp_path, step_seconds, max_steps, timed=True)

    steps = [step for step, _ in lines]
    assert steps[0] == 1, "the first line comes right after the first step"
    times = [start] + [when for _, when in lines]
    steps = [0] + steps
    assert all(later - earlier <= 60 for earlier, later in pairwise(times)), lines
    assert all(later - earlier <= max_steps // 20 for earlier, later in pairwise(steps))
    assert steps[-1] >= max_steps - max_steps // 20
    printed = re.findall(
        r"step (\d+)/60 \(\d+%\) \| .*loss .* samples/s .* eta ", capsys.readouterr().out
    )
    assert [int(step) for step in printed] == steps[1:]


def test_slow_steps_print_a_line_after_every_step(tmp_path):
    start, lines = train_with_fake_clock(tmp_path, step_seconds=200.0, max_steps=5, timed=True)
    assert [step for step, _ in lines] == [1, 2, 3, 4, 5]


def test_fast_steps_are_not_logged_every_step(tmp_path):
    """The schedule does not simply log every step: 1 ms steps over 200 steps log every 5%."""
    _, lines = train_with_fake_clock(tmp_path, step_seconds=0.001, max_steps=200, timed=True)
    assert [step for step, _ in lines] == [1, *range(11, 201, 10)]


def test_the_users_logging_steps_win(tmp_path):
    _, lines = train_with_fake_clock(
        tmp_path, step_seconds=45.0, max_steps=12, timed=False, logging_steps=5
    )
    assert [step for step, _ in lines] == [5, 10]


def test_every_rank_follows_the_slowest_ranks_step_time(tmp_path):
    """Ranks must log at the same steps (logging gathers the loss): the agreed step time,
    not this rank's own, plans the next line."""
    measured = []

    def slow_peer(seconds: float) -> float:
        measured.append(seconds)
        return 200.0  # another rank's steps take 200 s

    _, lines = train_with_fake_clock(
        tmp_path, step_seconds=0.001, max_steps=5, timed=True, agree=slow_peer
    )
    assert [step for step, _ in lines] == [1, 2, 3, 4, 5]
    assert measured and all(seconds < 1 for seconds in measured)


def test_the_schedule_plans_by_time_within_5_percent_of_the_run():
    schedule = TimedLogSchedule(total_steps=1000, start_step=0)
    assert schedule.next_step == 1
    assert schedule.plan_after(1, seconds_per_step=10.0) == 1 + 3
    assert schedule.plan_after(4, seconds_per_step=0.0) == 4 + 50
    resumed = TimedLogSchedule(total_steps=1000, start_step=400)
    assert resumed.next_step == 401


def test_train_uses_time_unless_a_logging_interval_is_given():
    from trainer.training.progress import progress_by_time

    assert progress_by_time(("--max_steps",))
    assert not progress_by_time(("--logging_steps", "--max_steps"))
    assert not progress_by_time(("--logging_strategy",))


def test_result_line_reads_before_and_after_the_headline_metric():
    before = {"eval_loss": 10.9, "eval_wer": 112.04, "eval_runtime": 2.0}
    after = {"eval_loss": 0.17, "eval_wer": 5.5556, "eval_runtime": 1.9, "epoch": 9.3}
    assert before_after_line(before, after, 280, 24, "outputs/demo/model") == (
        "result: WER 112.0 before training -> 5.6 after 280 steps on 24 eval examples; "
        "model in outputs/demo/model"
    )


def test_result_line_without_an_evaluation_at_step_0_has_only_the_after():
    """No --eval_on_start: no extra evaluation is paid for, and none is invented."""
    after = {"eval_loss": 0.31, "eval_accuracy": 0.912, "eval_f1": 0.9}
    assert before_after_line(None, after, 500, 872, "gs://b/model") == (
        "result: accuracy 0.912 after 500 steps on 872 eval examples; model in gs://b/model"
    )
    assert before_after_line(None, after, 500, 872, "m", "f1").startswith("result: f1 0.9 after")


def test_the_evaluation_logged_at_a_step_is_found_in_the_trainers_history():
    history = [
        {"eval_loss": 10.9, "eval_wer": 100.0, "epoch": 0, "step": 0},
        {"loss": 3.2, "learning_rate": 1e-3, "epoch": 1.0, "step": 20},
        {"eval_loss": 0.2, "eval_wer": 5.6, "epoch": 1.0, "step": 20},
        {"train_runtime": 9.0, "epoch": 1.0, "step": 20},
    ]
    assert evaluation_logged_at(history, 20) == {"eval_loss": 0.2, "eval_wer": 5.6, "epoch": 1.0}
    assert evaluation_logged_at(history, 0)["eval_wer"] == 100.0
    assert evaluation_logged_at(history, 10) is None
    assert evaluation_logged_at(history[1:], 0) is None
