"""LoRA against full fine-tuning, side by side in one run on this CPU: step time, peak
memory, checkpoint size, and the launcher's memory estimate next to the measured peak.

Each configuration runs in a fresh process (so that its peak RSS is its own): a randomly
initialised Whisper of a released size (`--model tiny|small|...`, from its published
dimensions, no download), with `--peft lora` adapters as the product makes them
(trainer/tasks/lora_adapters.py, Whisper's default targets) or every weight trained, AdamW as the
Trainer builds it, fp32 on CPU, one batch of 30 s log-mel features and
`generation_max_length` (225) label tokens: the sizes the estimate assumes.

- step time: median over `--steps` steps after one warm-up step (forward, backward,
  optimizer step).
- peak memory: the process's peak RSS (ru_maxrss) minus its RSS before the model was built:
  weights, gradients, optimizer state and activations, as the estimate counts them.
- estimate: `TrainingFootprint.step_bytes` (trainer/tasks/step_memory.py) for the same
  model, batch and checkpointing, as `python -m trainer --dry-run` reports it.
- checkpoint: what a Trainer checkpoint holds of the model and optimizer: the weights the
  model saves (the adapter alone under LoRA) plus the optimizer state (`optimizer.pt`).

    python bench/lora.py [--model small] [--batch-size 1] [--steps 2] [--checkpointing]
                         [--no-checkpoint-size]

`--no-checkpoint-size` skips writing the checkpoint that is measured (2.7 GB for
whisper-small): for a caller that reads only the memory figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import psutil
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from trainer.settings.model_flags import ModelArguments  # noqa: E402
from trainer.settings.task_flags import SpeechArguments  # noqa: E402
from trainer.tasks.lora_adapters import parameter_counts, with_lora  # noqa: E402
from trainer.tasks.speech import SpeechRecognitionTask  # noqa: E402
from trainer.tasks.step_memory import TrainingFootprint  # noqa: E402
from trainer.tasks.whisper_sizes import whisper_config  # noqa: E402

LABEL_TOKENS = 225
"""`generation_max_length`'s default: the label length the estimate assumes."""


def measure(
    size: str,
    peft: str,
    batch_size: int,
    steps: int,
    checkpointing: bool,
    checkpoint_size: bool = True,
) -> dict:
    """One configuration, in this process: its step time, peak memory and estimate, and
    (with `checkpoint_size`) the size of its checkpoint, written to a temporary folder after
    the peak is read."""
    from transformers import WhisperForConditionalGeneration

    torch.manual_seed(0)
    before = psutil.Process().memory_info().rss
    config = whisper_config(size, decoder_start_token_id=1, pad_token_id=0)
    model = WhisperForConditionalGeneration(config)
    if peft == "lora":
        model = with_lora(model, ModelArguments(peft="lora", lora_dropout=0.0))
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    batch = {
        "input_features": torch.randn(batch_size, config.num_mel_bins, 3000),
        "labels": torch.randint(2, config.vocab_size, (batch_size, LABEL_TOKENS)),
    }
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    task = SpeechRecognitionTask(
        None, None, SpeechArguments(), {"generation_max_length": LABEL_TOKENS}
    )
    full, recomputed = task.activation_values_per_sample(model)
    trained, total = parameter_counts(model)
    footprint = TrainingFootprint(
        parameters=total,
        trainable_parameters=trained,
        activation_values=full,
        checkpointed_activation_values=recomputed,
        batch_size=batch_size,
        mixed_precision=False,
        zero_stage=None,
        optimizer_offloaded=False,
        world_size=1,
    )
    checkpoint = checkpoint_bytes(model, optimizer) if checkpoint_size else None
    return {
        "model": f"whisper-{size}",
        "training": "LoRA" if peft == "lora" else "full",
        "trainable_parameters": trained,
        "total_parameters": total,
        "batch_size": batch_size,
        "gradient_checkpointing": checkpointing,
        "step_seconds": median(times[1:]),
        "peak_bytes": peak,
        "estimated_bytes": footprint.step_bytes(checkpointing),
        "checkpoint_bytes": checkpoint,
    }


def checkpoint_bytes(model, optimizer) -> int:
    """What a Trainer checkpoint holds of `model` and `optimizer`, written and measured."""
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        torch.save(optimizer.state_dict(), Path(folder) / "optimizer.pt")
        return sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())


def measured_in_fresh_process(
    size: str,
    peft: str,
    batch_size: int = 1,
    steps: int = 1,
    checkpointing: bool = False,
    checkpoint_size: bool = True,
) -> dict:
    """`measure` in a process of its own, one thread (the machine may be shared)."""
    argv = [sys.executable, __file__, "--one", peft, "--model", size, "--batch-size",
            str(batch_size), "--steps", str(steps)]  # fmt: skip
    if checkpointing:
        argv.append("--checkpointing")
    if not checkpoint_size:
        argv.append("--no-checkpoint-size")
    done = subprocess.run(argv, capture_output=True, text=True, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    mib = 2**20
    lines = [
        "| model | training | trainable / total parameters | step (s) | peak memory (MiB) "
        "| estimate (MiB) | estimate / peak | checkpoint (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        checkpoint = row["checkpoint_bytes"]  # None: not written (--no-checkpoint-size)
        lines.append(
            f"| {row['model']} | {row['training']} | {row['trainable_parameters']:,} / "
            f"{row['total_parameters']:,} | {row['step_seconds']:.2f} | "
            f"{row['peak_bytes'] / mib:,.0f} | {row['estimated_bytes'] / mib:,.0f} | "
            f"{row['estimated_bytes'] / row['peak_bytes']:.2f} | "
            f"{'-' if checkpoint is None else f'{checkpoint / mib:,.1f}'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--no-checkpoint-size", dest="checkpoint_size", action="store_false",
                        help="do not write the checkpoint to measure its size")  # fmt: skip
    parser.add_argument("--one", choices=("none", "lora"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        result = measure(
            args.model, args.one, args.batch_size, args.steps, args.checkpointing,
            args.checkpoint_size,
        )  # fmt: skip
        print(json.dumps(result))
        return
    rows = [
        measured_in_fresh_process(
            args.model, peft, args.batch_size, args.steps, args.checkpointing, args.checkpoint_size
        )
        for peft in ("none", "lora")
    ]
    print(table(rows))


if __name__ == "__main__":
    main()
