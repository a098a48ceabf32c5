"""One micro-batch's forward and backward time, measured, against the project's estimate
(trainer/common/step_time.py), to calibrate its assumed model-FLOPs utilisation.

The plan before launch estimates a micro-batch's time from the model's FLOPs and the GPU's
dense peak times `ASSUMED_UTILISATION`, and `python -m trainer.jobspec --spot` warns when it
exceeds `--stop_grace_seconds` (docs/restarts.md). This measures the same work on whatever
device is here: whisper-small, ViT-base and BERT-base with random weights built from their
configs (no download), a micro-batch of random inputs of the shapes the estimate assumes
(Whisper: 30 s of log-mel features and 225 label tokens, `generation_max_length`'s default;
ViT: 224 x 224 images; BERT: 128 tokens, the recipe's `max_seq_length`), forward and backward
after warm-up passes, `torch.cuda.synchronize`d, the mean of `--repeats`. On CUDA under 16-bit
autocast (as the Trainer without DeepSpeed), or with `--half-weights` in 16-bit weights and
inputs without autocast (as DeepSpeed trains, the job spec's default): bf16, fp16 on a GPU
without bf16 (a T4), as the launcher chooses; fp32 on a CPU.

Three variants: `full` (every weight trains), `checkpointing` (gradient checkpointing: the
forward runs again in backward) and `frozen` (every matrix frozen, biases and norms trained:
gradients still flow through every layer, as to LoRA's adapters, but no matrix's weight
gradient is computed: the case of the estimate's LoRA approximation).

Per row: the measured seconds, the project's estimate for this GPU, and the utilisation the
measurement implies (model FLOPs / seconds / peak). The last lines give the median implied
utilisation and the lowest (the figure at which no row's estimate is shorter than its
measurement).

It imports torch, transformers and two project modules that import nothing else
(trainer/common/step_time.py; trainer/tasks/speech_recognition/whisper_sizes.py, read by
path because the trainer.tasks package loads datasets, accelerate and peft), so it runs on a
bare GPU machine with only torch and transformers installed.

    python bench/step_time.py                      # a GPU: about a minute on an H100
    python bench/step_time.py --quick              # CPU: batch 1, one timed pass, full only
    python bench/step_time.py --quick --whisper-size tiny    # the same, in seconds
    python bench/step_time.py --json rows.json --models whisper --batch-sizes 8 16
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    ViTConfig,
    ViTForImageClassification,
    WhisperForConditionalGeneration,
)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trainer.common.step_time import (  # noqa: E402 - after the checkout is on the path
    ASSUMED_UTILISATION,
    encoder_forward_flops,
    micro_batch_seconds,
    peak_flops,
    whisper_forward_flops,
)

LABEL_TOKENS = 225
"""Whisper's labels: `generation_max_length`'s default (trainer/tasks/speech_recognition/
training.py), which the estimate takes as the label length (an upper bound: batches are
padded to their longest)."""
TEXT_TOKENS = 128
"""BERT's sequence: the bert-sentiment recipe's `max_seq_length`."""
VARIANTS = ("full", "checkpointing", "frozen")


def whisper_sizes():
    """trainer/tasks/speech_recognition/whisper_sizes.py, loaded from its file: importing it
    as a module would run trainer/tasks/__init__.py and its imports."""
    spec = importlib.util.spec_from_file_location(
        "whisper_sizes", REPO / "trainer" / "tasks" / "speech_recognition" / "whisper_sizes.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Workload:
    """A model to build and a micro-batch of its inputs, and the project's FLOPs count."""

    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int, torch.device], dict]
    forward_flops: Callable[[torch.nn.Module], object]


def whisper(size: str) -> Workload:
    config = whisper_sizes().whisper_config(
        size, pad_token_id=50257, bos_token_id=50257, eos_token_id=50257,
        decoder_start_token_id=50258,
    )  # fmt: skip

    def inputs(batch: int, device: torch.device) -> dict:
        frames = 2 * config.max_source_positions  # the first convolution halves them
        return {
            "input_features": torch.randn(batch, config.num_mel_bins, frames, device=device),
            "labels": torch.randint(0, config.vocab_size, (batch, LABEL_TOKENS), device=device),
        }

    return Workload(
        f"whisper-{size}",
        lambda: WhisperForConditionalGeneration(config),
        inputs,
        lambda model: whisper_forward_flops(model, LABEL_TOKENS),
    )


def vit_base() -> Workload:
    config = ViTConfig(num_labels=2)  # the defaults are ViT-base/16 at 224 x 224
    patches = (config.image_size // config.patch_size) ** 2 + 1  # and [CLS]

    def inputs(batch: int, device: torch.device) -> dict:
        size = config.image_size
        return {
            "pixel_values": torch.randn(batch, 3, size, size, device=device),
            "labels": torch.randint(0, 2, (batch,), device=device),
        }

    return Workload(
        "vit-base",
        lambda: ViTForImageClassification(config),
        inputs,
        lambda model: encoder_forward_flops(model, patches),
    )


def bert_base() -> Workload:
    config = BertConfig(num_labels=2)  # the defaults are BERT-base (uncased vocabulary)

    def inputs(batch: int, device: torch.device) -> dict:
        return {
            "input_ids": torch.randint(0, config.vocab_size, (batch, TEXT_TOKENS), device=device),
            "attention_mask": torch.ones(batch, TEXT_TOKENS, dtype=torch.long, device=device),
            "labels": torch.randint(0, 2, (batch,), device=device),
        }

    return Workload(
        "bert-base",
        lambda: BertForSequenceClassification(config),
        inputs,
        lambda model: encoder_forward_flops(model, TEXT_TOKENS),
    )


WORKLOADS = ("whisper", "vit-base", "bert-base")


@dataclass
class Row:
    model: str
    variant: str
    batch: int
    measured_s: float | None
    """Mean of the timed passes; None when the micro-batch did not fit the device."""
    min_s: float | None
    training_tflop: float
    """The project's count for the micro-batch: forward and backward, all examples."""
    estimate_s: float | None
    """The project's estimate on this device (None: its peak is not known)."""
    achieved_tflops: float | None
    implied_utilisation: float | None


def prepared(model: torch.nn.Module, variant: str) -> torch.nn.Module:
    """`model` in training mode, set up for the variant."""
    model.train()
    if variant == "checkpointing":  # renamed in later transformers 5 releases
        enable = getattr(model, "activation_checkpointing_enable", None)
        (enable or model.gradient_checkpointing_enable)({"use_reentrant": False})
    if variant == "frozen":
        for parameter in model.parameters():
            parameter.requires_grad_(parameter.dim() < 2)  # biases and norms train
    return model


def timed_passes(model, batch: dict, device, args) -> list[float]:
    """Seconds of each timed forward and backward pass (gradients dropped in between)."""
    mixed = device.type == "cuda" and not args.half_weights
    autocast = torch.autocast("cuda", dtype=half(), enabled=mixed)
    if args.half_weights:
        batch = {k: v.to(half()) if v.is_floating_point() else v for k, v in batch.items()}
    repeats, warmup = args.repeats, args.warmup
    times = []
    for index in range(warmup + repeats):
        model.zero_grad(set_to_none=True)
        synchronize(device)
        started = time.perf_counter()
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        synchronize(device)
        if index >= warmup:
            times.append(time.perf_counter() - started)
    return times


def half() -> torch.dtype:
    """The 16-bit type the launcher trains in on this GPU: bf16, else fp16 (a T4)."""
    bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.bfloat16 if bf16 else torch.float16


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(workload: Workload, variant: str, batches: list[int], args, peak) -> list[Row]:
    device = torch.device(args.device)
    with device:
        model = prepared(workload.build(), variant)
        if args.half_weights:
            model.to(half())
    attention = getattr(model.config, "_attn_implementation", None)
    print(f"{workload.name} ({attention} attention), {variant}", file=sys.stderr, flush=True)
    per_example = workload.forward_flops(model).training(variant == "checkpointing")
    rows = []
    for batch in batches:
        flops = per_example * batch
        try:
            times = timed_passes(model, workload.inputs(batch, device), device, args)
        except torch.OutOfMemoryError:
            times = []
        if device.type == "cuda":
            torch.cuda.empty_cache()
        mean = statistics.fmean(times) if times else None
        achieved = flops / mean if mean else None
        rows.append(Row(
            workload.name, variant, batch, mean, min(times) if times else None, flops / 1e12,
            micro_batch_seconds(per_example, batch, peak) if peak else None,
            achieved / 1e12 if achieved else None,
            achieved / peak if achieved and peak else None,
        ))  # fmt: skip
        took = f"{mean:.4f} s" if mean else "did not fit"
        print(f"  batch {batch}: {took}", file=sys.stderr, flush=True)
    del model
    return rows


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default=",".join(WORKLOADS), help="comma-separated")
    parser.add_argument(
        "--whisper-size", default="small", help="tiny, base, small, medium or large-v3"
    )
    parser.add_argument(
        "--variants", help=f"comma-separated (default: {','.join(VARIANTS)}; --quick: full)"
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--repeats", type=int, default=10, help="timed passes")
    parser.add_argument("--warmup", type=int, default=3, help="untimed passes first")
    parser.add_argument(
        "--peak-tflops", type=float, help="the device's dense peak (default: the project's table)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="batch 1, one warm-up and one timed pass, full only"
    )
    parser.add_argument(
        "--half-weights", action="store_true", help="16-bit weights, no autocast (as DeepSpeed)"
    )
    parser.add_argument("--json", type=Path, help="also write the rows and the device here")
    args = parser.parse_args()
    if args.quick:
        args.batch_sizes, args.repeats, args.warmup = [1], 1, 1
    args.variants = args.variants or ("full" if args.quick else ",".join(VARIANTS))
    return args


def device_peak(args) -> tuple[str, float | None]:
    """The device's name and its dense peak for the precision the passes run in."""
    if args.device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(args.device))
        peak = peak_flops(name, "16-bit")
    else:
        name, peak = platform.processor() or platform.machine(), None
    return name, args.peak_tflops * 1e12 if args.peak_tflops else peak


def fmt(value, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def report(rows: list[Row], name: str, peak: float | None, args) -> None:
    precision = "fp32"
    if args.device.startswith("cuda"):
        half_name = str(half()).removeprefix("torch.")
        precision = f"{half_name} {'weights' if args.half_weights else 'autocast'}"
    print(f"\n# {name}, {precision}; torch {torch.__version__}, transformers "
          f"{transformers.__version__}; peak {fmt(peak and peak / 1e12, 'g')} TFLOP/s; "
          f"assumed utilisation {ASSUMED_UTILISATION}; mean of {args.repeats} after "
          f"{args.warmup} warm-up\n")  # fmt: skip
    print("| model | variant | batch | measured s | min s | estimate s | estimate / measured "
          "| TFLOP | achieved TFLOP/s | implied utilisation |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        ratio = row.estimate_s / row.measured_s if row.estimate_s and row.measured_s else None
        print(f"| {row.model} | {row.variant} | {row.batch} | {fmt(row.measured_s, '.4f')} "
              f"| {fmt(row.min_s, '.4f')} | {fmt(row.estimate_s, '.4f')} | {fmt(ratio, '.2f')} "
              f"| {row.training_tflop:.3f} | {fmt(row.achieved_tflops, '.3g')} "
              f"| {fmt(row.implied_utilisation, '.3f')} |")  # fmt: skip
    implied = [row.implied_utilisation for row in rows if row.implied_utilisation]
    if implied:
        print(
            f"\nimplied utilisation: median {statistics.median(implied):.3f}, lowest "
            f"{min(implied):.3f} (at the lowest, no row's estimate is shorter than its "
            f"measurement), highest {max(implied):.3f}; assumed {ASSUMED_UTILISATION}"
        )


def main() -> None:
    args = parse_arguments()
    torch.manual_seed(0)
    name, peak = device_peak(args)
    print(f"device: {name}", file=sys.stderr, flush=True)
    started = time.monotonic()
    rows = []
    for model_name in args.models.split(","):
        workload = {"whisper": lambda: whisper(args.whisper_size), "vit-base": vit_base,
                    "bert-base": bert_base}[model_name]()  # fmt: skip
        for variant in args.variants.split(","):
            rows += measure(workload, variant, args.batch_sizes, args, peak)
    report(rows, name, peak, args)
    print(f"\n(took {time.monotonic() - started:.0f} s)")
    if args.json:
        record = {
            "device": name,
            "peak_tflops": peak and peak / 1e12,
            "assumed_utilisation": ASSUMED_UTILISATION,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "rows": [asdict(row) for row in rows],
        }
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
