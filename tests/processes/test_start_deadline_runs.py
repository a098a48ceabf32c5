"""The start deadline's test of a start: only a descendant running the training program counts
(the deadline itself on a fake clock: tests/unit/test_start_deadline.py). Each test asks from a
process of its own, as the launcher does: this one may have descendants other tests started."""

from __future__ import annotations

import subprocess
import sys

from tests.support.helpers import REPO_ROOT

CHILDREN = """
import subprocess, sys
from trainer.launcher.start_deadline import training_process_started

sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
seen = [training_process_started()]
other = subprocess.Popen([*sleeper, "ninja"])
seen.append(training_process_started())
training = subprocess.Popen([*sleeper, "-m", "trainer.training.rank"])
seen.append(training_process_started())
for child in (other, training):
    child.kill()
    child.wait()
print(seen)
"""

NAMED_GRANDCHILD = """
import subprocess, sys, time
import psutil
from trainer.launcher.start_deadline import training_process_started

forked = (
    "import setproctitle, time; setproctitle.setproctitle('python -m trainer.training.rank'); "
    "time.sleep(60)"
)
seen = [training_process_started()]
fork = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {forked!r}])"
zygote = subprocess.Popen([sys.executable, "-c", fork])
deadline = time.monotonic() + 30
while not training_process_started() and time.monotonic() < deadline:
    time.sleep(0.1)
seen.append(training_process_started())
for process in [*psutil.Process(zygote.pid).children(recursive=True), zygote]:
    process.kill()
print(seen)
"""


def seen_by_a_launcher(script: str) -> list[str]:
    """What `script`, run as a process of its own, printed: its list of observations."""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    return done.stdout.split()


def test_only_a_child_running_the_training_program_counts():
    assert seen_by_a_launcher(CHILDREN) == ["[False,", "False,", "True]"]


def test_a_grandchild_named_as_the_training_program_counts():
    """A training process forked from the zygote is the zygote's child, and names itself
    (setproctitle: one string in place of the command line)."""
    assert seen_by_a_launcher(NAMED_GRANDCHILD) == ["[False,", "True]"]
