"""Training throughput of Whisper through the product's own path, several configurations.

Each configuration is a separate `python -m trainer` run (the real launcher, DeepSpeed preset,
Trainer and SpeechCollator) on the same synthetic audiofolder and the same randomly
initialised Whisper of a real size (`--model tiny|base|small|medium|large-v3`, built from its
published dimensions, no download). The first row is the seed recipe (fp32, gradient
checkpointing on, features computed on the CPU, ZeRO-2); the second the project's defaults;
the others change one thing each against the defaults. Rows run one after the other in one
invocation, so their ratios to the first row are comparable; absolute numbers are not (the
machine may be shared).

Per configuration:
- step time: with `--logging_steps 1` the trainer prints one `step N/M` line per step; the
  time between consecutive lines' arrival is one step (the first WARMUP_STEPS are dropped).
  samples/s = batch size / median step time.
- data wait: the share of step time the training loop waited for the data loader, as the
  product measures and prints it on each step line (trainer/training/progress.py, DataWaitClock).
- peak memory: on a GPU, rank 0's peak allocated CUDA memory (printed by the trainer at the
  end); on CPU, the largest summed RSS of the launcher's process tree, sampled every 0.2 s.
- FLOP/s and MFU: analytic model FLOPs per sample (docs/PERFORMANCE.md) x samples/s, over the
  device's dense bf16/fp16 peak (known GPUs, or `--peak-tflops`).
- time to first step (`--startup`): the built-in demo on this machine, phase by phase.

    python bench/throughput.py [--model tiny] [--steps 8] [--batch-size 2] [--clips 32]
                               [--configs a,b,...] [--peak-tflops T] [--startup]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import platform
import random
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import wave
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from statistics import median, quantiles

import numpy as np
import psutil
import torch

from trainer.tasks.speech_recognition.demo import (
    ENDOFTEXT,
    begin_suppress_tokens,
    build_whisper_tokenizer,
    save_random_whisper,
    whisper_generation_config,
)
from trainer.tasks.speech_recognition.whisper_sizes import WHISPER_SIZES, whisper_config

REPO_ROOT = Path(__file__).resolve().parent.parent
WARMUP_STEPS = 2
STEP_LINE = re.compile(r"^step \d+/\d+ ")
DATA_WAIT = re.compile(r"\| data wait (\d+)% \|")
GPU_PEAK = re.compile(r"peak GPU memory ([\d.]+) GiB")
SAMPLING_RATE = 16_000

WORDS = (  # noqa: SIM905 (a word list reads better as text)
    "the a of and to in is was that for on with as his he it at by from they we say her she "
    "or an will my one all would there their what so up out if about who get which go me when "
    "make can like time no just him know take people into year your good some could them see "
    "other than then now look only come its over think also back after use two how our work "
    "first well way even new want because any these give day most us river mountain window "
    "village morning letter station harbour garden winter summer teacher doctor bicycle"
).split()


@dataclass
class Config:
    name: str
    flags: list[str]
    batch_multiplier: int = 1


@dataclass
class Result:
    config: Config
    batch_size: int
    step_seconds: list[float]
    data_wait_shares: list[float]
    peak_memory_bytes: int
    returncode: int


SEED = Config(
    "seed recipe (fp32, grad ckpt, CPU features, ZeRO-2)",
    ["--bf16", "false", "--tf32", "false", "--gradient_checkpointing", "true",
     "--log_mel_on", "loader", "--deepspeed", "zero2"],
)  # fmt: skip
DEFAULTS = ["--deepspeed", "zero2"]  # + what trainer.config.hardware_defaults adds for this node
CONFIGS = {
    "seed": SEED,
    "defaults": Config("project defaults", DEFAULTS),
    "eager": Config("eager attention", [*DEFAULTS, "--attn_implementation", "eager"]),
    "foreach-adamw": Config("for-each AdamW", [*DEFAULTS, "--optim", "adamw_torch"]),
    "grad-ckpt": Config("grad ckpt on", [*DEFAULTS, "--gradient_checkpointing", "true"]),
    "loader-features": Config("log-mel in the loader", [*DEFAULTS, "--log_mel_on", "loader"]),
    "device-features": Config("log-mel on the device", [*DEFAULTS, "--log_mel_on", "device"]),
    "no-workers": Config("no loader workers", [*DEFAULTS, "--dataloader_num_workers", "0"]),
    "one-worker": Config("1 loader worker", [*DEFAULTS, "--dataloader_num_workers", "1"]),
    "fp32": Config("fp32 (bf16 off)", [*DEFAULTS, "--bf16", "false"]),
    "no-tf32": Config("TF32 off", [*DEFAULTS, "--tf32", "false"]),
    "compile": Config("torch.compile", [*DEFAULTS, "--torch_compile", "true"]),
    "group-by-length": Config(
        "decoder batches grouped by label length",
        [*DEFAULTS, "--train_sampling_strategy", "group_by_length"],
    ),
    "ddp": Config("no DeepSpeed (DDP)", ["--deepspeed", "none"]),
    "2x-batch": Config("2x batch", DEFAULTS, batch_multiplier=2),
    "4x-batch": Config("4x batch", DEFAULTS, batch_multiplier=4),
}  # fmt: skip
CPU_CONFIGS = "seed,defaults,eager,foreach-adamw,device-features,group-by-length,2x-batch"
GPU_CONFIGS = ("seed,defaults,fp32,no-tf32,eager,foreach-adamw,grad-ckpt,loader-features,"
               "no-workers,group-by-length,compile,ddp,2x-batch,4x-batch")  # fmt: skip
"""On CPU: no bf16 or TF32 (the launcher refuses --bf16 there), and the seed already runs fp32
with its features in the (only) process; torch.compile takes longer than the whole run."""

PEAK_TFLOPS = {"A100": 312, "H100": 989, "H200": 989, "L4": 121, "T4": 65}
"""Dense bf16 (T4: fp16) tensor-core peaks from NVIDIA's data sheets (SXM parts; an H100
PCIe is 756: pass --peak-tflops)."""


def main() -> None:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="throughput-"))
    started = time.monotonic()
    print(f"building whisper-{args.model} (random init) and {args.clips} clips in {work}")
    model_dir = build_model(work / "model", args.model)
    data_dir = build_audiofolder(work / "data", args.clips)
    flops_per_sample = model_flops_per_sample(model_dir, data_dir)

    results = []
    for name in args.configs.split(","):
        config = CONFIGS[name]
        print(f"--- {config.name}: {' '.join(config.flags)}", flush=True)
        batch = args.batch_size * config.batch_multiplier
        results.append(run_configuration(config, batch, model_dir, data_dir, work, args.steps))
    startup = demo_startup() if args.startup else None

    print_report(args, results, flops_per_sample, startup, time.monotonic() - started)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(WHISPER_SIZES), default="tiny")
    parser.add_argument("--steps", type=int, default=8, help="training steps per configuration")
    parser.add_argument("--batch-size", type=int, default=2, help="the seed row's batch size")
    parser.add_argument(
        "--configs",
        default=GPU_CONFIGS if torch.cuda.is_available() else CPU_CONFIGS,
        help=f"rows, in order, from: {', '.join(CONFIGS)} (default: {CPU_CONFIGS} on CPU, "
        f"{GPU_CONFIGS} on a GPU)",
    )
    parser.add_argument(
        "--peak-tflops", type=float, help="the device's dense peak (default: known GPUs' peak)"
    )
    parser.add_argument("--clips", type=int, default=32, help="synthetic training clips")
    parser.add_argument(
        "--startup", action="store_true", help="also time the demo from launch to first step"
    )
    args = parser.parse_args()
    unknown = set(args.configs.split(",")) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configurations {sorted(unknown)}: choose from {list(CONFIGS)}")
    if args.peak_tflops is None and torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        args.peak_tflops = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    return args


def build_model(model_dir: Path, size: str) -> Path:
    """A randomly initialised Whisper of a released size, saved with its processor."""
    tokenizer = build_whisper_tokenizer(num_languages=100 if size == "large-v3" else 99)
    eot = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    config = whisper_config(
        size,
        decoder_start_token_id=tokenizer.convert_tokens_to_ids("<|startoftranscript|>"),
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        begin_suppress_tokens=begin_suppress_tokens(tokenizer),
    )
    generation = whisper_generation_config(tokenizer)
    save_random_whisper(model_dir, config, generation, tokenizer, chunk_length=30)
    return model_dir


def build_audiofolder(root: Path, clips: int) -> Path:
    """`clips` 16 kHz noise WAVs of 2-15 s with 5-15-word transcripts (Common Voice-like)."""
    rng = random.Random(0)
    (root / "train").mkdir(parents=True)
    rows = []
    for index in range(clips):
        seconds = rng.uniform(2.0, 15.0)
        samples = np.random.default_rng(index).normal(0, 3000, int(seconds * SAMPLING_RATE))
        name = f"{index:04d}.wav"
        with wave.open(str(root / "train" / name), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(SAMPLING_RATE)
            wav.writeframes(samples.clip(-32768, 32767).astype("<i2").tobytes())
        words = rng.choices(WORDS, k=rng.randint(5, 15))
        rows.append((name, " ".join(words).capitalize() + "."))
    with (root / "train" / "metadata.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file_name", "text"])
        writer.writerows(rows)
    return root


def model_flops_per_sample(model_dir: Path, data_dir: Path) -> float:
    """Training FLOPs of one sample (forward + backward) = 3 x forward (docs/PERFORMANCE.md).

    Weights: 6 x weights x positions they apply to (Kaplan et al. 2020, "C = 6N" per token):
    the encoder's over its 1500 positions, the decoder's (with the output projection) over the
    label tokens, and the cross-attention K/V projections over the 1500 encoder states.
    Attention scores and their weighted sum: 12 x layers x d_model x (keys) per query
    (Chowdhery et al. 2022, PaLM, appendix B), for encoder self-attention, decoder
    self-attention and cross-attention. Label tokens: the mean over the synthetic set, as the
    product's tokenizer counts them (without the start token the model prepends).
    """
    from trainer.command_line.parser import parse_flags

    argv = ["--model_name_or_path", str(model_dir), "--dataset_name", str(data_dir),
            "--language", "en", "--eval_split_name", ""]  # fmt: skip
    task = parse_flags(argv).build_task()
    model, processor = task.build_model_and_processor()
    train, _ = task.load_datasets(processor)
    config = model.config
    positions, d_model = config.max_source_positions, config.d_model
    encoder = sum(p.numel() for n, p in model.model.encoder.named_parameters() if "embed_" not in n)
    cross_kv = sum(
        p.numel()
        for n, p in model.model.decoder.named_parameters()
        if "encoder_attn.k_proj" in n or "encoder_attn.v_proj" in n
    )
    decoder = sum(p.numel() for n, p in model.model.decoder.named_parameters() if "embed_" not in n)
    decoder += model.proj_out.weight.numel() - cross_kv
    tokens = [len(processor.tokenizer(text).input_ids) - 1 for text in train["text"]]
    label_tokens = float(np.mean(tokens))
    print(f"params: encoder {encoder / 1e6:.1f}M, decoder+head {decoder / 1e6:.1f}M, "
          f"cross K/V {cross_kv / 1e6:.1f}M; label tokens mean {label_tokens:.1f}, "
          f"range {min(tokens)}-{max(tokens)}")  # fmt: skip
    encoder_flops = 6 * encoder * positions
    encoder_flops += 12 * config.encoder_layers * d_model * positions * positions
    decoder_flops = 6 * decoder * label_tokens + 6 * cross_kv * positions
    keys_per_query = label_tokens + positions  # decoder self-attention + cross-attention
    decoder_flops += 12 * config.decoder_layers * d_model * label_tokens * keys_per_query
    return encoder_flops + decoder_flops


def run_configuration(
    config: Config, batch: int, model_dir: Path, data_dir: Path, work: Path, steps: int
) -> Result:
    output_dir = work / "runs" / re.sub(r"\W+", "-", config.name).strip("-")
    argv = [
        sys.executable, "-m", "trainer", "--nproc_per_node", "1",
        "--model_name_or_path", str(model_dir), "--dataset_name", str(data_dir),
        "--language", "en", "--eval_split_name", "", "--output_dir", str(output_dir),
        "--max_steps", str(steps), "--logging_steps", "1", "--learning_rate", "1e-4",
        "--warmup_steps", "0", "--eval_strategy", "no", "--save_strategy", "no",
        "--report_to", "none", "--resume", "never",
        "--per_device_train_batch_size", str(batch), *config.flags,
    ]  # fmt: skip
    log = output_dir.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    step_ends, waits = [], []  # when each `step N/M` line arrived, and its data-wait share
    gpu_peak = 0
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=bench_env(), text=True
    )
    rss = PeakMemory(process.pid)
    with log.open("w") as handle:
        for line in process.stdout:
            if STEP_LINE.match(line):
                step_ends.append(time.monotonic())
                waits.append(int(DATA_WAIT.search(line).group(1)) / 100)
            if match := GPU_PEAK.search(line):
                gpu_peak = int(float(match.group(1)) * 2**30)
            handle.write(line)
    returncode = process.wait()
    rss.stop()
    if returncode != 0 or len(step_ends) < steps:
        print(log.read_text()[-3000:])
        print(f"FAILED (exit {returncode}): {shlex.join(argv)}")
    step_seconds = [b - a for a, b in zip(step_ends, step_ends[1:], strict=False)]
    step_seconds = step_seconds[WARMUP_STEPS - 1 :]  # the first WARMUP_STEPS steps dropped
    waits = waits[WARMUP_STEPS:]
    return Result(config, batch, step_seconds, waits, gpu_peak or rss.bytes, returncode)


def bench_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CLUSTER_SPEC"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))
    return env


def demo_startup() -> str:
    """The demo's own start-up lines (2 processes, ZeRO-2, 4 steps, nothing saved)."""
    output_dir = tempfile.mkdtemp(prefix="demo-startup-")
    argv = [sys.executable, "-m", "trainer", "--nproc_per_node", "2", "--max_steps", "4",
            "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none",
            "--resume", "never", "--output_dir", output_dir]  # fmt: skip
    print(f"--- time to first step: {shlex.join(argv[1:])}", flush=True)
    done = subprocess.run(argv, capture_output=True, text=True, env=bench_env(), check=False)
    if done.returncode != 0:
        return f"demo failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
    return "\n".join(
        line
        for line in done.stdout.splitlines()
        if "launcher checks" in line or line.startswith("time to first step")
    )


class PeakMemory:
    """Polls the summed RSS of a process and all its descendants until stopped."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.bytes = 0
        self._root = psutil.Process(pid)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(interval,), daemon=True)
        self._thread.start()

    def _poll(self, interval: float) -> None:
        while not self._done.is_set():
            total = 0
            with contextlib.suppress(psutil.NoSuchProcess):
                for process in [self._root, *self._root.children(recursive=True)]:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        total += process.memory_info().rss
            self.bytes = max(self.bytes, total)
            self._done.wait(interval)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def print_report(args, results: list[Result], flops_per_sample, startup, total) -> None:
    on_gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if on_gpu else f"{os.cpu_count()}-core CPU"
    print()
    print(f"# whisper-{args.model}, {args.steps} steps per row (first {WARMUP_STEPS} dropped), "
          f"{datetime.now():%Y-%m-%d %H:%M}, {device} ({platform.machine()}), "
          f"torch {torch.__version__}")  # fmt: skip
    print(f"# command: python bench/throughput.py {shlex.join(sys.argv[1:])}")
    print(f"# model FLOPs per training sample: {flops_per_sample / 1e9:.1f} GFLOP")
    print()
    memory = "peak GPU mem GiB" if on_gpu else "peak RSS GiB"
    unit = "TFLOP/s" if on_gpu else "GFLOP/s"
    print(f"| configuration | batch | samples/s | vs seed | step s (median) | step s (p10-p90) "
          f"| {memory} | data wait | {unit} | MFU |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    base_rate = None
    for result in results:
        config = result.config
        if result.returncode != 0 or len(result.step_seconds) < 2:
            print(f"| {config.name} | {result.batch_size} | failed (exit {result.returncode}) "
                  "| | | | | | | |")  # fmt: skip
            continue
        step = median(result.step_seconds)
        low, *_, high = quantiles(result.step_seconds, n=10)
        rate = result.batch_size / step
        base_rate = base_rate or rate
        wait = sum(result.data_wait_shares) / max(len(result.data_wait_shares), 1)
        flops = rate * flops_per_sample
        achieved = flops / (1e12 if on_gpu else 1e9)
        mfu = f"{flops / (args.peak_tflops * 1e12):.1%}" if args.peak_tflops else "-"
        print(f"| {config.name} | {result.batch_size} | {rate:.2f} | {rate / base_rate:.2f}x "
              f"| {step:.3f} | {low:.3f}-{high:.3f} | {result.peak_memory_bytes / 2**30:.2f} "
              f"| {wait:.0%} | {achieved:.1f} | {mfu} |")  # fmt: skip
    if startup:
        print(f"\n# the demo's start-up on this machine:\n{startup}")
    print()
    print(f"benchmark wall time: {total / 60:.1f} min")


if __name__ == "__main__":
    main()
