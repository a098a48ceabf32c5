"""What the launcher's failure path costs before it can print its line: a training process
killed by a signal (the OOM killer's SIGKILL) cannot report itself, so its node's
`accelerate launch` wrapper (trainer/launcher/accelerate_launch.py `what_is_kept`) reads
the run's configuration from the environment and says where the newest complete
checkpoint is. Measured in fresh processes, side by side with another checkout's (the
commit before the typed run configuration, say) when `--baseline` names one, alternating
run by run so both see the same machine load:

1. the modules imported (`python -X importtime`), and whether torch or transformers are;
2. the wall time of the whole process, median of `--runs`.

    python bench/failure_path_imports.py [--runs 5] [--baseline OTHER_CHECKOUT]

Each checkout runs its own code (bench/checkouts.py); its run configuration is made by its
own resolver, for the same command line.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkouts import add_baseline_flag, compared, environment, python  # noqa: E402

FAILURE_PATH = "from trainer.launcher.accelerate_launch import what_is_kept; print(what_is_kept())"
COMMAND_LINE = ["--nproc_per_node", "1", "--deepspeed", "none"]
CONFIG_OF = """
import os, sys
try:
    from trainer.settings.run_config import Hardware
except ImportError:  # a checkout from before trainer/settings
    from trainer.config.hardware import Hardware
from trainer.config.resolve import resolve_run
cpu = Hardware(gpu_count=0, gpu_name=None, compute_capability=None, cpu_count=2)
argv = sys.argv[1:] + ["--output_dir", os.environ["OUTPUT"]]
print(resolve_run(argv, dict(os.environ), cpu).without_secrets()[0].to_json())
"""


def run_config(checkout: Path, output: str) -> str:
    """The handed-over configuration, as `checkout`'s own resolver makes it."""
    env = environment(checkout, OUTPUT=output, OMP_NUM_THREADS="1")
    made = subprocess.run([python(checkout), "-c", CONFIG_OF, *COMMAND_LINE], env=env, check=True,
                          capture_output=True, text=True, cwd=tempfile.gettempdir())  # fmt: skip
    return made.stdout.strip()


def imports(checkout: Path, config: str) -> tuple[int, bool]:
    """(modules imported, whether torch or transformers is among them)."""
    env = environment(checkout, TRAINER_RUN_CONFIG=config)
    done = subprocess.run([python(checkout), "-X", "importtime", "-c", FAILURE_PATH], env=env,
                          check=True,
                          capture_output=True, text=True, cwd=tempfile.gettempdir())  # fmt: skip
    modules = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
               if line.startswith("import time:") and "imported package" not in line]  # fmt: skip
    return len(modules), bool({"torch", "transformers"} & set(modules))


def wall_time(checkout: Path, config: str) -> float:
    env = environment(checkout, TRAINER_RUN_CONFIG=config)
    started = time.perf_counter()
    subprocess.run([python(checkout), "-c", FAILURE_PATH], env=env, check=True, capture_output=True,
                   cwd=tempfile.gettempdir())  # fmt: skip
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    add_baseline_flag(parser)
    options = parser.parse_args()
    checkouts = compared(options)
    with tempfile.TemporaryDirectory() as output:
        configs = {name: run_config(path, output) for name, path in checkouts.items()}
        times: dict[str, list[float]] = {name: [] for name in checkouts}
        for _ in range(options.runs):
            for name, path in checkouts.items():
                times[name].append(wall_time(path, configs[name]))
        for name, path in checkouts.items():
            count, heavy = imports(path, configs[name])
            print(f"{name}: {count} modules imported ({'with' if heavy else 'no'} torch or "
                  f"transformers), median {statistics.median(times[name]):.2f} s "
                  f"over {options.runs} runs")  # fmt: skip
    if options.baseline:
        ratio = statistics.median(times["baseline"]) / statistics.median(times["this checkout"])
        print(f"the baseline takes {ratio:.0f}x as long")


if __name__ == "__main__":
    main()
