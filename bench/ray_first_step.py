"""Time to the first training step: the same short run through `python -m trainer` (torchrun,
as on a CustomJob node) and `python -m trainer.ray` (Ray Train workers on a local two-node
Ray cluster), side by side in one run.

Both print `time to first step: X s (...)`, measured from the command's own start: the
launcher's checks, starting the processes (torchrun's, or Ray's worker actors), imports,
the process group, the model and the data. The Ray cluster itself is started before either
command (on Vertex AI it is long-lived), so its start-up is not counted. Runs alternate
(CustomJob, Ray, CustomJob, ...); the median of each is compared. This is a 2-core CPU
machine with a tiny model: the figures say what each way in adds, not how long a GPU job
takes to start.

    python bench/ray_first_step.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.ray_cluster import start_ray_cluster  # noqa: E402

FIRST_STEP = re.compile(r"time to first step: ([0-9.]+) s")
RUN = ["--max_steps", "2", "--eval_strategy", "no", "--logging_steps", "1", "--report_to",
       "none", "--save_strategy", "no"]  # fmt: skip


def first_step_seconds(module: str, args: list[str], cwd: Path, env: dict) -> float:
    cwd.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", module, *args, *RUN, "--output_dir",
                           str(cwd / "out")], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    found = FIRST_STEP.search(done.stdout + done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(
            f"{module} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
        )
    return float(found[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        cluster = start_ray_cluster(root / "ray", root / "cache")
        # the demo's assets are built once per machine, by whichever command runs first
        subprocess.run([sys.executable, "-m", "trainer", "--dry-run"], cwd=root,
                       env=cluster.env, capture_output=True, check=True)  # fmt: skip
        try:
            times: dict[str, list[float]] = {"custom job (torchrun)": [], "ray": []}
            for repeat in range(options.repeats):
                times["custom job (torchrun)"].append(first_step_seconds(
                    "trainer", ["--nproc_per_node", "2"], root / f"torchrun-{repeat}",
                    cluster.env))  # fmt: skip
                times["ray"].append(first_step_seconds(
                    "trainer.ray", ["--address", cluster.address, "--num_workers", "2"],
                    root / f"ray-{repeat}", cluster.env))  # fmt: skip
        finally:
            cluster.stop()
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        print(f"{name}: time to first step {medians[name]:.1f} s (runs: "
              f"{', '.join(f'{v:.1f}' for v in values)})")  # fmt: skip
    ratio = medians["ray"] / medians["custom job (torchrun)"]
    print(f"ray / custom job: {ratio:.2f}")


if __name__ == "__main__":
    main()
