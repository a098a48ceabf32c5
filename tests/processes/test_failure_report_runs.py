"""A training process fails in a real run: one `error:` line naming its rank, node and
exception, after a line naming the file its traceback was kept in; not a traceback per rank
plus torchrun's ChildFailedError box. The peers that only see their collective break say where
the cause is, once per node; a process killed by a signal gets its node's line. (The reports
themselves, in this process: tests/unit/test_failure_report.py.)"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    REPO_ROOT,
    SLOW_STEPS,
    TEXT_COLUMNS,
    complete_from,
    start_nodes,
    start_trainer,
    trainer_env,
    wait_while_running,
    with_start_hook,
)
from trainer.storage.checkpoints import complete_checkpoints
from trainer.storage.store import open_store

pytestmark = pytest.mark.slow

RANK_ONE_FAILS = """
import os

from trainer.tasks.speech_recognition import training as speech

_collator = speech.SpeechRecognitionTask.data_collator


def _failing_collator(self, processor):
    collate = _collator(self, processor)

    def collate_or_fail(examples):
        if os.environ.get("RANK") == "1":
            raise ValueError("a corrupt clip on rank one")
        return collate(examples)

    return collate_or_fail


speech.SpeechRecognitionTask.data_collator = _failing_collator
"""


TRACEBACK_LINE = "the traceback of the error below is in "


def error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("error:")]


def test_a_failing_rank_is_reported_once_and_the_other_node_says_where_the_cause_is(
    tmp_path, demo_assets
):
    """Two nodes of two processes; rank 1 (node 0, local rank 1) fails. Node 0's log has
    that rank's one line and where its traceback is, nothing from its local rank 0 (torchrun stops
    it) and no ChildFailedError box. Node 1's processes only see their collective break:
    its log has one line, from the first of them to end its wait (its local main process may
    be waiting in a collective on the other), pointing to the other node's log, and no
    traceback."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(RANK_ONE_FAILS)
    nodes = start_nodes(tmp_path / "nodes", demo_assets.model_dir, demo_assets.dataset_dir,
                        [*DEMO_SPEECH_FLAGS, "--nproc_per_node", "2", "--max_steps", "2",
                         "--eval_strategy", "no", "--save_strategy", "no",
                         "--per_device_train_batch_size", "2", "--output_dir", "out"],
                        PYTHONPATH=f"{hooks}{os.pathsep}{REPO_ROOT}")  # fmt: skip
    try:
        (code0, log0), (code1, log1) = (node.finish(timeout=420) for node in nodes)
    finally:  # a node that hung or outlived a failed one would slow every later test
        for node in nodes:
            node.kill_node()
            node.process.wait()

    assert code0 == 1 and code1 == 1, (log0[-2000:], log1[-2000:])
    assert error_lines(log0) == [
        "error: rank 1 of 4 (node 0, local rank 1) failed: ValueError: a corrupt clip on rank "
        "one; there is no complete checkpoint in out"
    ], log0[-4000:]
    assert "Traceback" not in log0, log0[-4000:]  # it is in the file the line before names
    [kept] = [line.removeprefix(TRACEBACK_LINE) for line in log0.splitlines()
              if line.startswith(TRACEBACK_LINE)]  # fmt: skip
    assert kept == str(tmp_path / "nodes" / "node0" / "out" / "logs" / "traceback-rank1.txt")
    assert "a corrupt clip on rank one" in Path(kept).read_text()
    errors1 = error_lines(log1)
    assert len(errors1) == 1 and re.match(
        r"error: rank (2 of 4 \(node 1, local rank 0|3 of 4 \(node 1, local rank 1)\) stopped: "
        r"another node's process or machine failed",
        errors1[0],
    ), log1[-3000:]
    assert errors1[0].endswith("that node's log says why; there is no complete "
                               "checkpoint in out"), errors1  # fmt: skip
    assert "Traceback" not in log1, log1[-4000:]
    for log in (log0, log1):
        assert "ChildFailedError" not in log and "closing signal" not in log, log[-4000:]


def test_a_training_process_killed_by_the_oom_killer_leaves_a_line_naming_the_checkpoint(
    tmp_path, text_assets
):
    """SIGKILL to one training process (as the kernel's OOM killer sends it) once a
    checkpoint is complete: the node's one line names the process and the checkpoint a
    restart resumes from."""
    import psutil

    model_dir, dataset_dir = text_assets
    checkpoints = open_store(str(tmp_path / "checkpoints"))
    run = start_trainer(
        ["--task", "text-classification", "--model_name_or_path", str(model_dir),
         "--dataset_name", str(dataset_dir), *TEXT_COLUMNS, "--max_seq_length", "16",
         "--nproc_per_node", "2", "--max_steps", "200", "--save_steps", "2",
         "--eval_strategy", "no", "--output_dir", "out",
         "--checkpoint_dir", str(tmp_path / "checkpoints")],
        cwd=tmp_path,
        env=with_start_hook(trainer_env(tmp_path / "cache"), tmp_path / "hooks", SLOW_STEPS),
    )  # fmt: skip
    wait_while_running([run], lambda: complete_from(checkpoints, 2), 300,
                       "a complete checkpoint")  # fmt: skip
    launcher = psutil.Process(run.process.pid)
    training = [p for p in launcher.children(recursive=True)
                if "trainer.training.rank" in " ".join(p.cmdline())]  # fmt: skip
    assert len(training) == 2, [p.cmdline() for p in launcher.children(recursive=True)]
    training[1].kill()
    code, output = run.finish(timeout=300)

    assert code == 1, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output[-3000:]
    line = re.fullmatch(
        r"error: training process rank (\d) \(node 0, local rank \d\) was killed by SIGKILL "
        r"\(out of memory\? the kernel's OOM killer sends SIGKILL\); the newest complete "
        rf"checkpoint is {re.escape(str(tmp_path / 'checkpoints'))}/(checkpoint-\d+), where a "
        r"restart resumes",
        errors[0],
    )  # fmt: skip
    assert line, errors[0]
    assert line[2] in complete_checkpoints(checkpoints), "the line names a complete checkpoint"
