"""bench/gpu_check.py's table and its parts' time limits (the runner's processes:
tests/processes/test_gpu_check_runs.py)."""

from __future__ import annotations

import json
import signal

from bench import gpu_check
from bench.gpu_check import COLUMNS, GPU_BUDGET_S, PARTS, outcome, partial_of, write_table

HEADER = {"mode": "GPU", "device": "1 x NVIDIA H100 80GB HBM3", "date": "2026-12-05 01:00 UTC",
          "commit": "abc1234", "wall_s": 412.0}  # fmt: skip


def test_the_parts_limits_on_a_gpu_add_up_to_under_eight_minutes():
    assert sum(part.limit_s for part in PARTS) < GPU_BUDGET_S == 480
    assert all(part.limit_s > 0 and part.cpu_limit_s > 0 for part in PARTS)


def test_every_part_is_named_once_and_has_a_claim_and_a_function():
    names = [part.name for part in PARTS]
    assert len(names) == len(set(names))
    assert all(part.claim for part in PARTS)
    assert all(callable(getattr(gpu_check, part.function)) for part in PARTS)


def test_the_table_has_a_row_per_part_with_every_column(tmp_path):
    rows = [
        {"part": "zygote", "status": "ok", "measured": "1 process(es): forked", "reason": "",
         "claim": "no 'fresh interpreters' line", "seconds": 21.3, "limit_s": 45},
        {"part": "chat-qlora", "status": "skipped", "measured": "-",
         "reason": "bitsandbytes is not installed", "claim": "fits | an L4", "seconds": 0.4,
         "limit_s": 55},
    ]  # fmt: skip
    write_table(tmp_path, HEADER, rows)

    written = json.loads((tmp_path / "gpu_check.json").read_text())
    assert written == HEADER | {"rows": rows}
    assert all(set(COLUMNS) <= set(row) for row in written["rows"])
    lines = (tmp_path / "gpu_check.md").read_text().splitlines()
    assert lines[0] == ("GPU: 1 x NVIDIA H100 80GB HBM3; 2026-12-05 01:00 UTC, commit abc1234; "
                        "wall time 412 s")  # fmt: skip
    assert lines[2] == "| part | status | measured | claim checked | seconds (limit) |"
    assert lines[4:] == [
        "| zygote | ok | 1 process(es): forked | no 'fresh interpreters' line | 21 (45) |",
        "| chat-qlora | skipped: bitsandbytes is not installed | - | fits \\| an L4 | 0 (55) |",
    ]


def test_a_killed_part_timed_out_and_a_crashed_one_failed_with_its_last_line(tmp_path):
    log = tmp_path / "part.log"
    log.write_text("Traceback (most recent call last):\n  ...\nValueError: no such GPU\n\n")
    missing = tmp_path / "result.json"

    assert outcome(-signal.SIGKILL, missing, log, 45) == {
        "status": "timed out", "reason": "past its 45 s limit"}  # fmt: skip
    partial_of(missing).write_text(json.dumps({"measured": "engine 900 tokens/s"}))
    assert outcome(-signal.SIGKILL, missing, log, 45) == {"measured": "engine 900 tokens/s",
        "status": "timed out", "reason": "past its 45 s limit"}  # fmt: skip
    assert outcome(1, missing, log, 45) == {"status": "failed", "reason": "ValueError: no such GPU"}
    assert outcome(0, missing, log, 45)["status"] == "failed"  # it exited without its row
    missing.write_text(json.dumps({"status": "ok", "reason": "", "measured": "3 tokens/s"}))
    assert outcome(0, missing, log, 45)["measured"] == "3 tokens/s"
