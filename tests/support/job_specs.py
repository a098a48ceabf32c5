"""The job specs `python -m trainer.jobspec` writes, rendered in-process and read as YAML
(tests/unit/test_jobspec.py and tests/processes/test_jobspec_runs.py)."""

from __future__ import annotations

import yaml

from trainer.jobspec import __main__ as jobspec


def rendered(*argv: str) -> dict[str, dict]:
    return {name: yaml.safe_load(text) for name, text in jobspec.render(list(argv)).items()}
