"""The sdist that `python -m trainer.jobspec --python_package` ships, installed into a fresh
virtual environment (as an executor's installer would, beside dependencies already there)
and run from an empty folder: the demo trains, and its code, recipe and DeepSpeed preset
all come from the installed package, none from this checkout.

The plan (`--dry-run`) is made with the ZeRO-2 preset, which must resolve to the installed
package's file. The one training step runs on two processes without DeepSpeed (DDP): in
this venv (its dependencies linked from the test environment's) DeepSpeed would compile its
CPU op again, a minute or two, into the extensions folder that every other test run shares,
and the next run in the test environment would compile it back. (One process without
DeepSpeed does not start: accelerate then launches no torchrun.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.helpers import (
    free_port,
    module_origin,
    pip_in,
    trainer_env,
    venv_with_dependencies,
)

SHORTEST_DEMO = ["--max_steps", "1", "--per_device_train_batch_size", "2",
                 "--eval_strategy", "no", "--eval_on_start", "false",
                 "--output_dir", "out"]  # fmt: skip


@pytest.mark.slow
def test_the_demo_runs_from_the_sdist_installed_in_a_fresh_venv(
    tmp_path, checkout_sdist, demo_cache
):
    venv = tmp_path / "venv"
    python = venv_with_dependencies(venv)
    installed = pip_in(python, "install", "--no-deps", "--no-build-isolation", str(checkout_sdist))
    assert installed.returncode == 0, installed.stderr
    run = tmp_path / "run"
    run.mkdir()
    env = {name: value for name, value in trainer_env(demo_cache).items() if name != "PYTHONPATH"}
    site_packages = module_origin(python, "trainer", env, run).parent.parent
    assert site_packages.is_relative_to(venv) and site_packages.name == "site-packages"

    plan = subprocess.run([python, "-m", "trainer", *SHORTEST_DEMO, "--nproc_per_node", "1",
                           "--deepspeed", "zero2", "--dry-run"], cwd=run, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    command = json.loads(plan.stdout)["command"]
    preset = command[command.index("--deepspeed_config_file") + 1]
    assert preset == str(site_packages / "trainer" / "presets" / "zero2.json")
    assert json.loads(Path(preset).read_text())["zero_optimization"]["stage"] == 2

    trained = subprocess.run([python, "-m", "trainer", *SHORTEST_DEMO, "--nproc_per_node", "2",
                              "--deepspeed", "none", "--master_port", str(free_port())],
                             cwd=run, env=env, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    output = trained.stdout + trained.stderr
    assert trained.returncode == 0, output[-3000:]
    assert "training done in" in output
    assert "final model and processor saved to out/model" in output
    assert json.loads((run / "out" / "model" / "config.json").read_text())["model_type"] == (
        "whisper"
    )
