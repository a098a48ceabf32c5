"""From SIGTERM to a complete checkpoint, by checkpoint size: does a stop fit the grace?

A stop on SIGTERM (a Spot preemption) costs: the step in flight, one all-reduce to agree
on the stop (bench/stop_flag.py: well under a millisecond), the local save of the step,
and the upload of the node's part ending with the manifest (docs/restarts.md). This bench
measures the last two with the project's own code, for checkpoints of several sizes:

- a node process holds a checkpoint's tensors in memory (the training state), laid out as
  a ZeRO-2 checkpoint is on the chief: `model.safetensors` and DeepSpeed's
  `mp_rank_00_model_states.pt` (the bf16 weights, each a fifth of the total) and an
  optimizer shard (fp32 master weights and Adam's moments, the other three fifths);
- the bench sends it SIGTERM; it writes them with `torch.save`/safetensors (the save),
  then uploads them with `trainer.storage.checkpoints.CheckpointUploader` (8 parallel
  streams, verified, manifest last) to the GCS emulator;
- the bench polls the store every 50 ms and times SIGTERM -> `manifest.json` present.

What this does and does not tell: the emulator is a pure-Python server on loopback, its
objects in memory, sharing this machine's CPUs with the node. Its MB/s measure this code
path's own overhead (hashing, verification, the client), not Cloud Storage or a VM's
network. So the output gives the save time and the fixed costs; for a real node, use
stop time ~ save time + size / upload throughput with the throughput of the VM to Cloud
Storage (docs/restarts.md, "From SIGTERM to a complete checkpoint", for the assumption
and the table of model sizes).

    python bench/stop_checkpoint.py [--sizes-mb 64 256 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.gcs_emulator import BUCKET, running_emulator  # noqa: E402
from trainer.storage.store import open_store  # noqa: E402

CHECKPOINT = "checkpoint-1"


def node(size_mb: int, checkpoints: str, out: Path, step_on: str | None = None) -> None:
    """One node: hold the state, wait for SIGTERM, save, upload, report timings as JSON.
    `step_on` a device: the state lives there and steps (matmuls) run until SIGTERM, which
    comes mid-step; the step in flight ends before the save (bench/gpu_check.py)."""
    import torch
    from safetensors.torch import save_file

    from trainer.storage.checkpoints import CheckpointUploader

    device = step_on or "cpu"
    weights = torch.randn((size_mb << 20) // 5 // 2, dtype=torch.bfloat16, device=device)
    optimizer = torch.randn((size_mb << 20) * 3 // 5 // 4, dtype=torch.float32, device=device)
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(time.monotonic()))
    print("ready", flush=True)
    while not stopped:
        if step_on:
            step(weights)
        else:
            time.sleep(0.005)
    folder = out / CHECKPOINT
    folder.mkdir(parents=True)
    save_file({"weights": weights.cpu()}, folder / "model.safetensors")
    torch.save({"module": weights}, folder / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": optimizer},
               folder / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")  # fmt: skip
    saved = time.monotonic()
    uploader = CheckpointUploader(
        store=open_store(checkpoints), staging_root=out / ".staging", node_rank=0,
        num_nodes=1, is_global_main=True, keep=None, peer_timeout=60,
    )  # fmt: skip
    uploader.submit(folder)
    assert uploader.close() and not uploader.failures, uploader.errors
    total = sum(f.stat().st_size for f in folder.iterdir())
    print(json.dumps({"bytes": total, "save_s": saved - stopped[0],
                      "upload_s": time.monotonic() - saved}), flush=True)  # fmt: skip


def step(weights) -> None:
    """A training step's stand-in: a few matmuls on the state's device, synchronised."""
    import torch

    side = 1024 if weights.is_cuda else 128
    block = weights[: side * side].view(side, side)
    for _ in range(8):
        block @ block
    if weights.is_cuda:
        torch.cuda.synchronize()


def measure(size_mb: int, scratch: Path, env: dict[str, str], step_on: str | None = None) -> dict:
    checkpoints = f"gs://{BUCKET}/stop-{uuid.uuid4().hex}"
    manifest_store = open_store(checkpoints).child(CHECKPOINT)
    stepping = ["--step-on", step_on] if step_on else []
    process = subprocess.Popen(
        [sys.executable, __file__, "--node", str(size_mb), checkpoints, str(scratch), *stepping],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    while manifest_store.read_text("manifest.json") is None:
        assert process.poll() is None or process.returncode == 0, "the node failed"
        time.sleep(0.05)
    complete = time.monotonic() - signalled
    report = json.loads(process.stdout.readline())
    process.wait()
    return report | {"sigterm_to_manifest_s": complete}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--node", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--step-on", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.node:
        size, checkpoints, scratch = options.node
        node(int(size), checkpoints, Path(scratch) / f"node-{uuid.uuid4().hex}", options.step_on)
        return

    with running_emulator() as emulator, tempfile.TemporaryDirectory() as scratch:
        os.environ["STORAGE_EMULATOR_HOST"] = emulator
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        rows = [measure(size, Path(scratch), env) for size in options.sizes_mb]

    print(f"command: python bench/stop_checkpoint.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"date: {time.strftime('%Y-%m-%d')}, CPUs: {os.cpu_count()}, GCS emulator on loopback")
    print(f"{'checkpoint':>11} {'save':>7} {'save MB/s':>9} {'upload':>7} {'upload MB/s':>11} "
          f"{'SIGTERM->manifest':>17}")  # fmt: skip
    for row in rows:
        megabytes = row["bytes"] / 1e6
        print(f"{megabytes:8.0f} MB {row['save_s']:6.2f}s {megabytes / row['save_s']:9.0f} "
              f"{row['upload_s']:6.2f}s {megabytes / row['upload_s']:11.0f} "
              f"{row['sigterm_to_manifest_s']:16.2f}s")  # fmt: skip


if __name__ == "__main__":
    main()
