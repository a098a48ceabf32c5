"""Exit codes with a meaning of their own, shared by the launcher and the training processes."""

PREEMPTED_EXIT_CODE = 75
"""EX_TEMPFAIL (sysexits.h): "try again later". Not 0, so neither the job nor a tuning
trial counts as done; the launcher passes it on without a second report."""
