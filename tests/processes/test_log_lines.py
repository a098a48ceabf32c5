"""Lines printed at the same time by several processes of a node reach the log whole."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support.helpers import REPO_ROOT

LINES = 5000
PRINTER = f"""
import os
from trainer.common.log_lines import write_whole_lines
write_whole_lines()
for i in range({LINES}):
    print(f"rank {{os.getpid()}} line {{i}} fingerprint 67fb1eae2cce", flush=True)
"""


def test_two_unbuffered_processes_printing_at_once_do_not_split_each_others_lines(tmp_path):
    """As the training processes run: PYTHONUNBUFFERED=1 (set by the launcher), one shared
    file for stdout. Without write_whole_lines, most lines here come out split."""
    log = tmp_path / "node.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT)}
    with log.open("w") as shared:
        printers = [
            subprocess.Popen([sys.executable, "-c", PRINTER], stdout=shared, env=env)
            for _ in range(2)
        ]
        assert [printer.wait(timeout=120) for printer in printers] == [0, 0]
    lines = log.read_text().splitlines()
    whole = re.compile(r"rank \d+ line \d+ fingerprint 67fb1eae2cce")
    assert len(lines) == 2 * LINES
    assert [line for line in lines if not whole.fullmatch(line)] == []
