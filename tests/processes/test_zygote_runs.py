"""The zygote (trainer/launcher/zygote.py): when it is not safe to fork from, the training
processes start as fresh interpreters and the run goes on, with a line that says why; a
launcher that refuses ends it at once. Forked training processes are what every other run of
the suite uses (their environment: tests/processes/test_secrets_runs.py; their stops and
failures: test_preemption_runs.py, test_failure_report_runs.py)."""

from __future__ import annotations

import time

import psutil

from tests.support.helpers import (
    TEXT_COLUMNS,
    start_trainer,
    trainer_env,
    with_start_hook,
    zygotes_of,
)

CUDA_TOUCHED_IN_THE_ZYGOTE = """
# sitecustomize: in the zygote, torch says CUDA was initialised (as an import that asked a
# GPU's properties would leave it on a GPU node): processes forked from it could not use CUDA.
from pathlib import Path

if "multiprocessing.forkserver" in Path("/proc/self/cmdline").read_text():
    import torch

    torch.cuda.is_initialized = lambda: True
"""


def text_run(text_assets) -> list[str]:
    model_dir, dataset_dir = text_assets
    return ["--task", "text-classification", "--model_name_or_path", str(model_dir),
            "--dataset_name", str(dataset_dir), *TEXT_COLUMNS, "--max_seq_length", "16",
            "--max_steps", "1", "--save_strategy", "no", "--eval_strategy", "no",
            "--output_dir", "out"]  # fmt: skip


def test_a_zygote_that_touched_cuda_is_not_forked_from_and_the_run_goes_on(tmp_path, text_assets):
    env = with_start_hook(trainer_env(tmp_path / "cache"), tmp_path / "hooks",
                          CUDA_TOUCHED_IN_THE_ZYGOTE)  # fmt: skip
    run = start_trainer([*text_run(text_assets), "--deepspeed", "zero2"], tmp_path, env)
    code, output = run.finish(300)
    assert code == 0, output[-3000:]
    assert ("the training processes start as fresh interpreters: in the zygote, an import "
            "initialised CUDA") in output.splitlines()  # fmt: skip
    assert "step 1/1 " in output and (tmp_path / "out" / "model" / "config.json").is_file()


def test_a_refusing_launcher_ends_its_zygote(tmp_path, text_assets):
    """The zygote starts before the checks; a refusal ends it at once, not after the seconds
    of imports it would finish alone."""
    args = [*text_run(text_assets), "--label_column_name", "no_such_column"]
    run = start_trainer(args, tmp_path, trainer_env(tmp_path / "cache"))
    launcher = psutil.Process(run.process.pid)
    zygotes: set[psutil.Process] = set()
    while run.process.poll() is None:
        try:
            zygotes |= set(zygotes_of(launcher))
        except psutil.Error:  # the launcher ended meanwhile
            break
        time.sleep(0.02)
    code, output = run.finish(60)
    assert code == 2 and output.splitlines()[-1].startswith("error: "), output[-3000:]
    assert zygotes, "the launcher started no zygote"
    for zygote in zygotes:
        assert not zygote.is_running() or zygote.status() == psutil.STATUS_ZOMBIE
