"""What the per-step stop/save agreement costs (trainer/training/preemption.py `agree`).

Every optimizer step, every rank joins one all-reduce (MAX) of two numbers so that a SIGTERM
on any node, or rank 0's save clock, stops or saves every rank at the same step. This runs
two real ranks on 127.0.0.1 (gloo, the CPU backend the tests use) training the demo's tiny
Whisper under DDP (a gradient all-reduce per step, as in training), and measures, side by
side in one run:

1. the step alone vs the step followed by `agree` (interleaved, step by step, so both
   see the same machine load): median step times and their ratio;
2. `agree` alone, called back to back: microseconds per call, and its share of a step.

With `--accumulation N` a step is N micro-batches of gradient accumulation (DDP's `no_sync`
for all but the last) and the optimizer step, and what is compared is the step with the
one-number agreement the ranks make after each micro-batch but the last (so that a stop
loses at most the step in flight: trainer/training/callbacks.py `on_substep_end`) against
the step without it; both end with the per-step agreement. It also makes the ranks wait for
each other at every micro-batch, which costs more than the all-reduce itself where their
micro-batches take unequal times.

On GPUs the same all-reduce goes over NCCL and `.tolist()` makes the CPU wait for the
step's queued kernels; that is not measured here (no GPU).

    python bench/stop_flag.py [--steps 60] [--calls 2000] [--batch-size 4] [--accumulation 1]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_main(rank: int, port: int, options: argparse.Namespace, results) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    import torch
    from accelerate import PartialState
    from torch.nn.parallel import DistributedDataParallel
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    from trainer.tasks.speech_recognition.demo import TINY_DIMENSIONS
    from trainer.training.preemption import agree

    torch.set_num_threads(1)
    PartialState(backend="gloo")  # as trainer/training/rank.py sets up CPU ranks
    chunk_seconds = 6  # the demo model's window (trainer/tasks/speech_recognition/demo.py)
    config = WhisperConfig(vocab_size=51865, num_mel_bins=80, **TINY_DIMENSIONS,
                           max_source_positions=chunk_seconds * 50)  # fmt: skip
    torch.manual_seed(0)
    model = DistributedDataParallel(WhisperForConditionalGeneration(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    features = torch.randn(options.batch_size, 80, chunk_seconds * 100)
    labels = torch.randint(0, 51865, (options.batch_size, 24))

    def step(each_micro_batch=lambda: None) -> None:
        for _ in range(options.accumulation - 1):
            with model.no_sync():
                model(input_features=features, labels=labels).loss.backward()
            each_micro_batch()
        loss = model(input_features=features, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(3):  # warm-up
        step()
    plain, flagged = [], []
    accumulating = options.accumulation > 1
    for i in range(options.steps * 2):
        started = time.perf_counter()
        if accumulating:  # both agree per step; the flagged one per micro-batch too
            step((lambda: agree([0.0])) if i % 2 else (lambda: None))
            agree([0.0, 0.0])
        else:  # the flagged one agrees per step, the plain one not at all
            step()
            if i % 2:
                agree([0.0, 0.0])
        (flagged if i % 2 else plain).append(time.perf_counter() - started)
    agree([0.0, 0.0])
    started = time.perf_counter()
    for _ in range(options.calls):
        agree([0.0, float(rank == 0)])
    per_call = (time.perf_counter() - started) / options.calls
    if rank == 0:
        results.put((statistics.median(plain), statistics.median(flagged), per_call))


def main() -> None:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="steps of each kind")
    parser.add_argument("--calls", type=int, default=2000, help="back-to-back agree() calls")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=1,
                        help="micro-batches per step; above 1, the per-micro-batch agreement "
                             "is what is measured")  # fmt: skip
    options = parser.parse_args()

    context = mp.get_context("spawn")
    results = context.Queue()
    mp.spawn(rank_main, args=(free_port(), options, results), nprocs=2)
    plain, flagged, per_call = results.get()
    print(f"2 ranks, gloo on 127.0.0.1, demo tiny Whisper (3.6 M parameters), DDP, batch "
          f"{options.batch_size}, {options.accumulation} micro-batch(es) a step, "
          f"{options.steps} steps of each kind, interleaved")  # fmt: skip
    agreed = "agree per micro-batch" if options.accumulation > 1 else "agree"
    print("| | median step | ratio to the plain step |")
    print("|---|---|---|")
    print(f"| step | {plain * 1e3:.1f} ms | 1.000 |")
    print(f"| step + {agreed} | {flagged * 1e3:.1f} ms | {flagged / plain:.3f} |")
    print(f"agree() alone: {per_call * 1e6:.0f} us per call ({options.calls} calls), "
          f"{per_call / plain:.2%} of a plain step")  # fmt: skip


if __name__ == "__main__":
    main()
