"""bench/gpu_check.py's runner: each part in a process of its own with its own time limit, so
a part that fails or runs past its limit leaves its row and the others theirs (parts planted
through the runner's own registry of parts: tests/support/planted_parts.py); and, in the slow
tier, `--cpu` end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from bench.gpu_check import COLUMNS, PARTS, STATUSES, Part, header_of, run_all
from tests.support.helpers import REPO_ROOT

PLANTED = REPO_ROOT / "tests" / "support" / "planted_parts.py"


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def planted(name: str, function: str, limit: float = 60) -> Part:
    return Part(name, function, f"the claim of {name}", limit, limit, source=PLANTED)


def test_a_part_past_its_limit_times_out_and_the_others_still_give_their_rows(tmp_path):
    parts = [planted("sleeper", "sleeps_past_its_limit", limit=3), planted("fine", "measures"),
             planted("broken", "breaks"), planted("absent", "skips")]  # fmt: skip
    started = time.monotonic()
    rows = run_all(parts, tmp_path, cpu=True, header=header_of(cpu=True))
    assert time.monotonic() - started < 120  # the sleeper was ended, not waited for

    by_part = {row["part"]: row for row in rows}
    assert list(by_part) == ["sleeper", "fine", "broken", "absent"]
    assert by_part["sleeper"]["status"] == "timed out"
    assert by_part["sleeper"]["reason"] == "past its 3 s limit"
    assert by_part["sleeper"]["seconds"] < 60
    assert by_part["sleeper"]["measured"] == "3 widgets/s so far"  # what it noted before
    grandchild = int((tmp_path / "scratch" / "grandchild.pid").read_text())
    assert not running(grandchild)  # ended with the part, though in a session of its own
    assert by_part["fine"] | {"seconds": 0} == {
        "part": "fine", "status": "ok", "reason": "", "measured": "42 widgets/s on cpu",
        "claim": "the claim of fine", "limit_s": 60, "seconds": 0,
    }  # fmt: skip
    assert by_part["broken"]["status"] == "failed"
    assert by_part["broken"]["reason"] == "RuntimeError: a planted failure"
    assert by_part["absent"]["status"] == "skipped"
    assert by_part["absent"]["reason"] == "a planted library is not installed"

    written = json.loads((tmp_path / "gpu_check.json").read_text())
    assert written["rows"] == rows
    assert written["mode"].startswith("CPU")
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| sleeper | timed out: past its 3 s limit | 3 widgets/s so far |" in table
    assert "| broken | failed: RuntimeError: a planted failure | - |" in table


CPU_PARTS = ["cuda-stack", "zygote", "chat-lora-sdpa", "chat-lora-flash-attn", "chat-qlora",
             "chat-liger", "serving-chat", "generation", "preemption"]  # fmt: skip
"""What the slow test runs with --cpu (on a shared 2-core machine: 100 s at a load average of 5,
204 s at 10; with task-steps too, 262 s at 9, so not it): every part but task-steps (bench/
step_time.py's passes: only the whole --cpu run, on demand, runs it) and the Whisper and BERT
servers, whose code is serving-chat's (bench/serve.py's server, 1 and 2 workers, 1, 4 and 16
clients). The whole --cpu run: docs/benchmarks.md, "The GPU check". The parts CUDA needs skip
with their reason."""


@pytest.mark.slow
def test_the_cpu_mode_gives_every_part_its_row(tmp_path):
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--cpu", "--out", str(tmp_path),
         "--parts", *CPU_PARTS],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
    assert [row["part"] for row in rows] == CPU_PARTS
    assert all(set(COLUMNS) <= set(row) for row in rows)
    statuses = {row["part"]: row["status"] for row in rows}
    skipped = {"chat-lora-flash-attn", "chat-qlora", "chat-liger"}  # CUDA-only libraries
    assert statuses == {part: "skipped" if part in skipped else "ok" for part in CPU_PARTS}, rows
    assert all(row["status"] in STATUSES for row in rows)
    assert {part.name for part in PARTS} >= set(CPU_PARTS)
