"""Reading a run's configuration is cheap: what a process that only reports a failure (the
launcher of a killed rank) imports to read it, in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys


def test_reading_the_run_configuration_loads_no_ml_library(tmp_path):
    """What a process that only reports a failure reads (the launcher of a killed rank):
    no torch, no transformers, no task."""
    code = (
        "import json, sys; from trainer.settings.run_config import RunConfig; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'datasets', 'deepspeed') or m.startswith('trainer.tasks'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=tmp_path)  # fmt: skip
    assert json.loads(loaded.stdout) == []
