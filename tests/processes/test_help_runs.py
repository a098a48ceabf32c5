"""`python -m trainer RECIPE --help` as a subprocess: the entry point shows the recipe's
task (the help text in-process: tests/unit/test_help.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.help_text import IMAGE_FLAGS, WHISPER_FLAGS, listed
from tests.support.helpers import REPO_ROOT, trainer_env


def test_the_entry_point_shows_a_recipes_task(demo_cache):
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "vit-beans.yaml", "--help"],
        cwd=REPO_ROOT,
        env=trainer_env(demo_cache),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "3. image-classification flags:" in result.stdout
    assert set(IMAGE_FLAGS) <= set(listed(result.stdout))
    assert not set(WHISPER_FLAGS) & set(listed(result.stdout))
