"""Exit codes with a meaning of their own, shared by the launcher and the training processes.

Documented for users in docs/launching.md ("Exit codes"); keep the two in step. 1 is
anything else (a bug, a crash, a failed collective, a process killed by a signal).
"""

CONFIG_ERROR_EXIT_CODE = 2
"""Bad input found by `python -m trainer` (or `trainer.jobspec`, `trainer.shards`) before
anything starts: one `error:` line, no process group, no GPU touched, nothing written."""

CONFIG_ERROR_IN_TRAINING_EXIT_CODE = 78
"""EX_CONFIG (sysexits.h): bad input only the training processes could find, once they load the
model or data (a `UserError` there), after the nodes started: unlike 2, GPU time was spent. The
launcher passes it on without a second report."""

PREEMPTED_EXIT_CODE = 75
"""EX_TEMPFAIL (sysexits.h): "try again later". Not 0, so neither the job nor a tuning
trial counts as done; the launcher passes it on without a second report."""
