"""Saving by time and on SIGTERM, in a real Trainer (one process; time is driven by a fake
clock, the signal is real). SIGTERM outside training, in a fresh process:
tests/processes/test_preemption_runs.py; the multi-node behaviour:
tests/processes/test_resume.py."""

from __future__ import annotations

import os
import signal

from transformers import PrinterCallback, Trainer, TrainerCallback

from tests.support.tiny_regression import Regression, regression_arguments, regression_rows
from trainer.training.callbacks import SaveOnStopOrInterval, long_step_warning
from trainer.training.preemption import StopRequest


class Minutes:
    """A clock that moves `per_step` minutes at the start of every step."""

    def __init__(self, per_step: float) -> None:
        self.now, self.per_step = 0.0, per_step

    def __call__(self) -> float:
        return self.now


class Tick(TrainerCallback):
    def __init__(self, clock: Minutes, signal_at_step: int | None = None) -> None:
        self.clock, self.signal_at_step = clock, signal_at_step

    def on_step_begin(self, args, state, control, **kwargs):
        self.clock.now += self.clock.per_step * 60
        if state.global_step + 1 == self.signal_at_step:  # mid-step, as a preemption comes
            os.kill(os.getpid(), signal.SIGTERM)


def train(tmp_path, saver_for, max_steps=12, signal_at_step=None, **extra) -> list[int]:
    """Train a tiny model; return the steps of the checkpoints the Trainer wrote."""
    args = regression_arguments(tmp_path, max_steps, **extra)
    trainer = Trainer(model=Regression(), args=args, train_dataset=regression_rows(8))
    trainer.remove_callback(PrinterCallback)
    clock = Minutes(per_step=4)
    trainer.add_callback(Tick(clock, signal_at_step))
    trainer.add_callback(saver_for(clock))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        trainer.train()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("checkpoint-*"))


def test_a_checkpoint_whenever_the_interval_has_passed(tmp_path):
    """4-minute steps, a 10-minute interval: saves after steps 3, 6, 9, 12."""
    saved = train(tmp_path, lambda clock: SaveOnStopOrInterval(StopRequest(), 10, clock=clock))
    assert saved == [3, 6, 9, 12]


def test_step_based_saves_restart_the_interval(tmp_path):
    """Saves every 5 steps (20 minutes) as well: the interval counts from any save."""
    saved = train(
        tmp_path,
        lambda clock: SaveOnStopOrInterval(StopRequest(), 10, clock=clock),
        save_strategy="steps",
        save_steps=5,
    )
    assert saved == [3, 5, 8, 10, 12]


def test_rank_zero_decides_for_every_rank(tmp_path):
    """A rank other than 0 saves when rank 0 says the time has come, never on its own
    clock. `agree` stands in for the all-reduce of the other ranks' values."""
    rank0_says_due_at = {5, 9}

    def saver(clock):
        steps = iter(range(1, 100))

        def with_rank0(values):
            step = next(steps)
            return [values[0], max(values[1], float(step in rank0_says_due_at))]

        return SaveOnStopOrInterval(StopRequest(), 1, clock=clock, agree=with_rank0)

    class NotRankZero(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            state.is_world_process_zero = False

    args = regression_arguments(tmp_path, max_steps=10)
    trainer = Trainer(model=Regression(), args=args, train_dataset=regression_rows(8))
    trainer.remove_callback(PrinterCallback)
    clock = Minutes(per_step=4)  # this rank's own clock says "due" after every step
    trainer.add_callback(Tick(clock))
    trainer.add_callback(NotRankZero())
    trainer.add_callback(saver(clock))
    trainer.train()
    saved = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("checkpoint-*"))
    assert saved == [5, 9]


def test_sigterm_finishes_the_step_saves_it_and_stops(tmp_path):
    stop = StopRequest()
    savers = []

    def saver(clock):
        savers.append(SaveOnStopOrInterval(stop, None, clock=clock))
        return savers[0]

    stop.install()
    saved = train(tmp_path, saver, max_steps=12, signal_at_step=7)
    assert saved == [7], "the step in flight finishes, is saved, and training stops"
    assert savers[0].stopped_at_step == 7 and savers[0].stop_origin_node == 0
    assert stop.requested


class Seconds:
    """A clock that moves `per_call` seconds each time it is read."""

    def __init__(self, per_call: float) -> None:
        self.now, self.per_call = 0.0, per_call

    def __call__(self) -> float:
        self.now += self.per_call
        return self.now


def test_a_step_longer_than_the_grace_is_one_warning_after_the_first_steps(tmp_path, capsys):
    """A stop is agreed between steps (or micro-batches): when more time passes between two
    such points than --stop_grace_seconds, one `warning:` says what a preemption would lose;
    steps within the grace say nothing."""
    saver = SaveOnStopOrInterval(StopRequest(), None, clock=Seconds(12), stop_grace=8)
    args = regression_arguments(tmp_path, 6)
    trainer = Trainer(model=Regression(), args=args, train_dataset=regression_rows(8))
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(saver)
    trainer.train()
    warnings = [line for line in capsys.readouterr().out.splitlines() if "warning:" in line]
    assert warnings == [long_step_warning(12, 8)]
    assert warnings[0].startswith("warning: a stop can be agreed only every 12 s here (a "
                                  "training step, or a micro-batch under gradient accumulation)"
                                  ", longer than --stop_grace_seconds 8")  # fmt: skip

    quick = SaveOnStopOrInterval(StopRequest(), None, clock=Seconds(3), stop_grace=8)
    trainer = Trainer(model=Regression(), args=regression_arguments(tmp_path / "quick", 6),
                      train_dataset=regression_rows(8))  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(quick)
    trainer.train()
    assert "warning:" not in capsys.readouterr().out
