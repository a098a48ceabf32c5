"""What counts as noise in a run's output: warnings, deprecations and progress bars
(tests/unit/test_quiet_logs.py checks the detector, tests/processes/test_demo_run.py a
real run's output with it)."""

from __future__ import annotations

import re

LOOKS_LIKE_NOISE = re.compile(
    r"warn|deprecat|\d+%\|"  # warnings, deprecations, tqdm bars (`50%|#####`)
    r"|\d+(?:\.\d+)?\s?(?:it|examples|files)/s\]",  # tqdm's rate at the end of a bar
    re.IGNORECASE,
)


def noise_lines(output: str) -> list[str]:
    """Lines (and tqdm redraws, which end in carriage returns) that look like noise."""
    lines = re.split(r"[\r\n]+", output)
    return [line for line in lines if LOOKS_LIKE_NOISE.search(line)]
