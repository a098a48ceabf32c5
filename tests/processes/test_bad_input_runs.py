"""Bad input through the real command line: `python -m trainer` in a subprocess fails
fast with one clear line and exit code 2 (the cases in-process, with the launch replaced by
a tripwire: tests/unit/test_bad_input.py).
"""

from __future__ import annotations

import subprocess
import sys


def test_real_command_line_fails_fast_with_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "--deepspeed", "zero9"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        'error: Unknown DeepSpeed preset "zero9": choose one of zero2, zero3, zero3-offload, '
        "none, or give the path of a DeepSpeed JSON config."
    ]
