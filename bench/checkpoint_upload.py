"""What checkpoint uploads cost: training slowdown, and small-file vs large-file throughput.

1. Training slowdown. The same short demo fine-tune (tiny Whisper, 2 processes, ZeRO-2,
   a checkpoint every few steps) runs through the real entrypoint twice per repeat: once
   with checkpoints uploaded to a GCS emulator in the background (`--checkpoint_dir
   gs://...`), once with the same saves kept local (no upload). Runs alternate; the
   Trainer's own `train_runtime` is compared. The local save itself is in both runs, so
   the ratio isolates what the background upload adds.
2. Upload throughput through `trainer.storage.store` against the emulator: one large file vs
   many small files of the same total size. The emulator is a pure-Python server on
   loopback, so absolute MB/s say little about Cloud Storage; the ratio shows what
   per-request overhead costs, which is what the transfer manager's parallelism is for.

Usage: python bench/checkpoint_upload.py [--repeats 2] [--steps 24] [--save-steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.gcs_emulator import BUCKET, running_emulator  # noqa: E402
from trainer.storage import store as storage  # noqa: E402


def train_runtime(workdir: Path, steps: int, save_steps: int, checkpoint_dir: str | None,
                  env: dict[str, str]) -> float:  # fmt: skip
    workdir.mkdir(parents=True)
    args = [sys.executable, "-m", "trainer", "--nproc_per_node", "2", "--max_steps", str(steps),
            "--save_steps", str(save_steps), "--save_total_limit", "2", "--eval_strategy", "no",
            "--logging_steps", str(steps), "--output_dir", "out"]  # fmt: skip
    if checkpoint_dir:
        args += ["--checkpoint_dir", checkpoint_dir]
    with (workdir / "log.txt").open("w") as log:
        subprocess.run(args, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                       check=True)  # fmt: skip
    return json.loads((workdir / "out" / "train_results.json").read_text())["train_runtime"]


def upload_seconds(files: dict[str, int], root: Path) -> float:
    for name, size in files.items():
        (root / name).write_bytes(os.urandom(size))
    store = storage.open_store(f"gs://{BUCKET}/bench-{uuid.uuid4().hex}")
    started = time.perf_counter()
    store.upload(root)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--save-steps", type=int, default=4)
    parser.add_argument("--total-mb", type=int, default=64)
    parser.add_argument("--small-files", type=int, default=512)
    options = parser.parse_args()

    with running_emulator() as emulator, tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        os.environ["STORAGE_EMULATOR_HOST"] = emulator
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with_upload, without = [], []
        for repeat in range(options.repeats):
            without.append(train_runtime(scratch / f"local-{repeat}", options.steps,
                                         options.save_steps, None, env))  # fmt: skip
            with_upload.append(train_runtime(scratch / f"gcs-{repeat}", options.steps,
                                             options.save_steps,
                                             f"gs://{BUCKET}/run-{repeat}", env))  # fmt: skip

        total = options.total_mb << 20
        large_dir, small_dir = scratch / "large", scratch / "small"
        large_dir.mkdir(), small_dir.mkdir()
        large = upload_seconds({"shard.pt": total}, large_dir)
        small = upload_seconds(
            {f"f{i:05d}.bin": total // options.small_files for i in range(options.small_files)},
            small_dir,
        )

    print(f"command: python bench/checkpoint_upload.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"date: {time.strftime('%Y-%m-%d')}, CPUs: {os.cpu_count()}")
    print(f"\ntraining ({options.steps} steps, a checkpoint every {options.save_steps}), "
          f"train_runtime in s over {options.repeats} repeats:")  # fmt: skip
    print(f"  saves kept local (no upload)    median {statistics.median(without):6.1f}  "
          f"all {[round(t, 1) for t in without]}")  # fmt: skip
    print(f"  background upload to GCS        median {statistics.median(with_upload):6.1f}  "
          f"all {[round(t, 1) for t in with_upload]}")  # fmt: skip
    slowdown = statistics.median(with_upload) / statistics.median(without)
    print(f"  slowdown (upload / no upload)   {slowdown:.2f}x")
    print(f"\nupload of {options.total_mb} MiB to the emulator:")
    print(f"  one file                  {large:6.2f} s  {options.total_mb / large:7.1f} MiB/s")
    print(f"  {options.small_files} files               {small:6.2f} s  "
          f"{options.total_mb / small:7.1f} MiB/s")  # fmt: skip
    print(f"  many small / one large    {small / large:.2f}x the time")


if __name__ == "__main__":
    main()
