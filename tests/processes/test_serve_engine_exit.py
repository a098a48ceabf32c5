"""transformers' continuous batching engine (trainer/tasks/text_generation/continuous_batching.py)
in a process of its own that ends without stopping it: the process ends."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.chat_models import FAMILIES, save_family_model

EXITING = """
import sys, threading, time
from transformers import AutoModelForCausalLM
from trainer.tasks.text_generation.continuous_batching import ContinuousEngine

model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
ContinuousEngine(model)  # running when the main thread ends, never stopped by the caller


def late():  # as the server's model load that ends after it was told to stop
    while threading.main_thread().is_alive():
        time.sleep(0.05)
    ContinuousEngine(model)
    print("late engine started", flush=True)


threading.Thread(target=late).start()
"""


def test_an_engine_nothing_stopped_does_not_keep_the_process_alive(tmp_path):
    """transformers' engine thread is no daemon: one running at exit, or started by a load
    that ends while the interpreter exits (a server stopped while loading), would keep the
    process alive forever; both are stopped, and the process ends."""
    model = save_family_model(FAMILIES["llama"], tmp_path / "llama")
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", EXITING, str(model)], capture_output=True,
                          text=True, timeout=180, env=env)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "late engine started\n"), done.stderr[-2000:]
