"""The start deadline: a node whose training processes never start gives up, one whose do
is left alone (the wedged-chief run in tests/test_resume.py shows it end to end)."""

from __future__ import annotations

import subprocess
import sys

from trainer.launcher.start_deadline import StartDeadline, training_process_started


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def watch(seconds: float, started_at: float | None) -> tuple[list[float], float]:
    """Run a deadline whose training processes start at `started_at` (None: never); return
    when it expired (empty if it did not) and when it stopped watching."""
    clock = FakeClock()
    expired: list[float] = []
    deadline = StartDeadline(
        seconds,
        started=lambda: started_at is not None and clock.now >= started_at,
        expire=lambda: expired.append(clock.now),
        clock=clock,
        sleep=clock.sleep,
    )
    deadline.watch()
    return expired, clock.now


def test_a_node_whose_training_never_starts_expires_at_the_deadline():
    assert watch(35, None) == ([35.0], 35.0)


def test_a_node_whose_training_starts_in_time_is_left_alone():
    expired, stopped = watch(35, started_at=12)
    assert expired == [] and stopped == 12


def test_only_a_child_running_the_training_program_counts():
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    assert not training_process_started()
    other = subprocess.Popen([*sleeper, "ninja"])
    try:
        assert not training_process_started()
        training = subprocess.Popen([*sleeper, "-m", "trainer.training.rank"])
        try:
            assert training_process_started()
        finally:
            training.kill()
            training.wait()
    finally:
        other.kill()
        other.wait()
