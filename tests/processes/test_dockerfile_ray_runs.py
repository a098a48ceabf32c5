"""docker/Dockerfile.ray linted by hadolint (what reading it shows:
tests/unit/test_dockerfile_ray.py)."""

from __future__ import annotations

import subprocess

from tests.support.helpers import hadolint
from tests.support.image_build import RAY_DOCKERFILE as DOCKERFILE


def test_hadolint_finds_nothing():
    result = subprocess.run([hadolint(), str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr
