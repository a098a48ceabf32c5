"""The start deadline: a node whose training processes never start gives up, one whose do
is left alone (on a fake clock; which child processes count:
tests/processes/test_start_deadline_runs.py; the wedged-chief run in
tests/processes/test_resume.py shows it end to end)."""

from __future__ import annotations

from trainer.launcher.start_deadline import StartDeadline


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
