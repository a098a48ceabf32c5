"""LoRA against full fine-tuning, side by side in one run on this CPU or a GPU: step time,
peak memory, checkpoint size, and the launcher's memory estimate next to the measured peak.

Each configuration runs in a fresh process (so that its peak memory is its own): a randomly
initialised Whisper of a released size (`--model tiny|small|...`, from its published
dimensions, no download), with `--peft lora` adapters as the product makes them
(trainer/tasks/lora_adapters.py, Whisper's default targets) or every weight trained, AdamW as the
Trainer builds it (fused on a GPU, the launcher's `--optim adamw_torch_fused`), fp32 weights,
one batch of 30 s log-mel features and `generation_max_length` (225) label tokens: the
sizes the estimate assumes. `--device cuda` builds and trains the model on the GPU;
`--bf16` (GPU only) runs the forward pass under bf16 autocast, as the Trainer's `--bf16`
does, and estimates with mixed precision.

- step time: median over `--steps` steps after one warm-up step (forward, backward,
  optimizer step; on a GPU up to `torch.cuda.synchronize()`).
- peak memory: on CPU the process's peak RSS (ru_maxrss) minus its RSS before the model was
  built; on a GPU `torch.cuda.max_memory_allocated()` minus the memory allocated before
  the model was built: weights, gradients, optimizer state and activations, as the
  estimate counts them (the CUDA context and the allocator's cached blocks are not in it).
- estimate: `TrainingFootprint.step_bytes` (trainer/tasks/step_memory.py) for the same
  model, batch, precision and checkpointing, as `python -m trainer --dry-run` reports it.
- checkpoint: what a Trainer checkpoint holds of the model and optimizer: the weights the
  model saves (the adapter alone under LoRA) plus the optimizer state (`optimizer.pt`).

    python bench/lora.py [--model small ...] [--batch-size 1 ...] [--steps 2]
                         [--device cpu|cuda] [--bf16] [--checkpointing] [--no-checkpoint-size]

Several `--model` and `--batch-size` values measure each combination, in that order; a
configuration that runs out of GPU memory is reported on stderr and left out of the table.
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
from itertools import product
from pathlib import Path
from statistics import median

import psutil
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from trainer.settings.model_flags import ModelArguments  # noqa: E402
from trainer.tasks.lora_adapters import parameter_counts, with_lora  # noqa: E402
from trainer.tasks.speech_recognition.spec import SPEC, SpeechArguments  # noqa: E402
from trainer.tasks.speech_recognition.training import SpeechRecognitionTask  # noqa: E402
from trainer.tasks.speech_recognition.whisper_sizes import whisper_config  # noqa: E402
from trainer.tasks.step_memory import TrainingFootprint  # noqa: E402

LABEL_TOKENS = 225
"""`generation_max_length`'s default: the label length the estimate assumes."""


def measure(
    size: str,
    peft: str,
    batch_size: int,
    steps: int,
    checkpointing: bool,
    checkpoint_size: bool = True,
    device: str = "cpu",
    bf16: bool = False,
) -> dict:
    """One configuration, in this process: its step time, peak memory and estimate, and
    (with `checkpoint_size`) the size of its checkpoint, written to a temporary folder after
    the peak is read."""
    from transformers import WhisperForConditionalGeneration

    torch.manual_seed(0)
    cuda = device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = psutil.Process().memory_info().rss
    config = whisper_config(size, decoder_start_token_id=1, pad_token_id=0)
    with torch.device(device):
        model = WhisperForConditionalGeneration(config)
        if peft == "lora":
            lora = ModelArguments(peft="lora", lora_dropout=0.0)
            model = with_lora(model, lora, SPEC.lora_targets)
    if checkpointing:
        model.gradient_checkpointing_enable()
    if bf16:  # the forward pass under autocast, as accelerate wraps it for the Trainer's --bf16
        model.forward = torch.autocast(device, dtype=torch.bfloat16)(model.forward)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, fused=True if cuda else None)
    batch = {
        "input_features": torch.randn(batch_size, config.num_mel_bins, 3000, device=device),
        "labels": torch.randint(2, config.vocab_size, (batch_size, LABEL_TOKENS), device=device),
    }
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if cuda:
        peak = torch.cuda.max_memory_allocated() - before
    else:
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
        mixed_precision=bf16,
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
        "precision": "bf16 autocast" if bf16 else "fp32",
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
    device: str = "cpu",
    bf16: bool = False,
) -> dict:
    """`measure` in a process of its own, one thread (the machine may be shared)."""
    argv = [sys.executable, __file__, "--one", peft, "--model", size, "--batch-size",
            str(batch_size), "--steps", str(steps), "--device", device]  # fmt: skip
    if bf16:
        argv.append("--bf16")
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
        "| model | training | trainable / total parameters | batch | precision | step (s) "
        "| peak memory (MiB) | estimate (MiB) | estimate / peak | checkpoint (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        checkpoint = row["checkpoint_bytes"]  # None: not written (--no-checkpoint-size)
        lines.append(
            f"| {row['model']} | {row['training']} | {row['trainable_parameters']:,} / "
            f"{row['total_parameters']:,} | {row['batch_size']} | {row['precision']} | "
            f"{row['step_seconds']:.2f} | "
            f"{row['peak_bytes'] / mib:,.0f} | {row['estimated_bytes'] / mib:,.0f} | "
            f"{row['estimated_bytes'] / row['peak_bytes']:.2f} | "
            f"{'-' if checkpoint is None else f'{checkpoint / mib:,.1f}'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", default=["small"])
    parser.add_argument("--batch-size", nargs="+", type=int, default=[1])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (--device cuda)")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--no-checkpoint-size", dest="checkpoint_size", action="store_false",
                        help="do not write the checkpoint to measure its size")  # fmt: skip
    parser.add_argument("--one", choices=("none", "lora"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bf16 and args.device != "cuda":
        parser.error("--bf16 needs --device cuda")
    if args.one:
        result = measure(
            args.model[0], args.one, args.batch_size[0], args.steps, args.checkpointing,
            args.checkpoint_size, args.device, args.bf16,
        )  # fmt: skip
        print(json.dumps(result))
        return
    rows = []
    for size, batch_size, peft in product(args.model, args.batch_size, ("none", "lora")):
        try:
            row = measured_in_fresh_process(
                size, peft, batch_size, args.steps, args.checkpointing, args.checkpoint_size,
                args.device, args.bf16,
            )  # fmt: skip
        except RuntimeError as error:  # the child's stderr: skip only a configuration too large
            if "OutOfMemoryError" not in str(error):
                raise
            print(f"whisper-{size} {peft} batch {batch_size}: out of GPU memory, skipped: "
                  f"{str(error).splitlines()[-1]}", file=sys.stderr)  # fmt: skip
            continue
        rows.append(row)
    print(table(rows))


if __name__ == "__main__":
    main()
