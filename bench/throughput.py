"""Training throughput of Whisper through the product's own path, several configurations.

Each configuration is a separate `python -m trainer` run (the real launcher, DeepSpeed preset,
Trainer and SpeechCollator) on the same synthetic audiofolder and the same randomly
initialised Whisper of a real size (`--model tiny|base|small|medium|large-v3`, built from its
published dimensions, no download). The first row is the seed recipe (fp32 on CPU, gradient
checkpointing on, ZeRO-2); the others change one thing each. Rows run one after the other in
one invocation, so their ratios to the first row are comparable; absolute numbers are not
(the machine may be shared).

Per configuration:
- step time: with `--logging_steps 1` the launcher prints one `step N/M` line per step; the
  time between consecutive lines' arrival is one step (the first WARMUP_STEPS are dropped).
  samples/s = batch size / median step time.
- peak memory: the largest summed RSS of the launcher's process tree, sampled every 0.2 s.
- data wait: the collator (decode + log-mel + tokenize) timed in this process on the same
  data, over the median step time; with 0 loader workers that work is on the step's path.
- FLOP/s: analytic model FLOPs per sample (docs/PERFORMANCE.md) x samples/s.

    python bench/throughput.py [--model tiny] [--steps 8] [--batch-size 2] [--clips 32]
                               [--peak-tflops T]
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
from transformers import (
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperProcessor,
)

from trainer.demo_assets import (
    ENDOFTEXT,
    _begin_suppress_tokens,
    _generation_config,
    build_whisper_tokenizer,
)
from trainer.whisper_sizes import WHISPER_SIZES, whisper_config

REPO_ROOT = Path(__file__).resolve().parent.parent
WARMUP_STEPS = 2
STEP_LINE = re.compile(r"^step \d+/\d+ ")
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
    batch_size: int


@dataclass
class Result:
    config: Config
    step_seconds: list[float]
    peak_rss_bytes: int
    wall_seconds: float
    returncode: int


def main() -> None:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="throughput-"))
    started = time.monotonic()
    print(f"building whisper-{args.model} (random init) and {args.clips} clips in {work}")
    model_dir = build_model(work / "model", args.model)
    data_dir = build_audiofolder(work / "data", args.clips)

    configs = configurations(args.batch_size)
    task, model, processor, train = product_task(model_dir, data_dir)
    flops_per_sample = model_flops_per_sample(model, processor, train)
    collate_seconds = {
        size: collate_time(task, processor, train, size) for size in {c.batch_size for c in configs}
    }
    del model

    results = []
    for config in configs:
        print(f"--- {config.name}: {' '.join(config.flags)}", flush=True)
        results.append(run_configuration(config, model_dir, data_dir, work, args.steps))

    print_report(args, results, flops_per_sample, collate_seconds, time.monotonic() - started)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(WHISPER_SIZES), default="tiny")
    parser.add_argument("--steps", type=int, default=8, help="training steps per configuration")
    parser.add_argument("--batch-size", type=int, default=2, help="the seed row's batch size")
    parser.add_argument(
        "--peak-tflops", type=float, help="the device's dense peak, e.g. 312 (A100 bf16): adds MFU"
    )
    parser.add_argument("--clips", type=int, default=32, help="synthetic training clips")
    return parser.parse_args()


def configurations(batch: int) -> list[Config]:
    """The seed recipe first; then the project's defaults; then one change each."""
    # --tf32 false keeps the new GPU default out of the seed row (no effect on CPU)
    seed = ["--gradient_checkpointing", "true", "--deepspeed", "zero2", "--tf32", "false"]
    defaults = ["--deepspeed", "zero2"]  # + whatever trainer.performance adds for this node
    return [
        Config("seed recipe (fp32, grad ckpt, ZeRO-2)", seed, batch),
        Config("project defaults (no grad ckpt)", defaults, batch),
        Config("defaults, 2x batch", defaults, 2 * batch),
        Config("defaults, 1 loader worker", [*defaults, "--dataloader_num_workers", "1"], batch),
    ]


def build_model(model_dir: Path, size: str) -> Path:
    """A randomly initialised Whisper of a released size, saved with its processor."""
    tokenizer = build_whisper_tokenizer()
    eot = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    config = whisper_config(
        size,
        decoder_start_token_id=tokenizer.convert_tokens_to_ids("<|startoftranscript|>"),
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        begin_suppress_tokens=_begin_suppress_tokens(tokenizer),
    )
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config)
    model.generation_config = _generation_config(tokenizer)
    processor = WhisperProcessor(
        WhisperFeatureExtractor(feature_size=config.num_mel_bins), tokenizer
    )
    model.save_pretrained(model_dir)
    processor.save_pretrained(model_dir)
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


def product_task(model_dir: Path, data_dir: Path):
    """The speech task as the training program builds it, with its model and processor."""
    from trainer.arguments import parse_flags

    argv = ["--model_name_or_path", str(model_dir), "--dataset_name", str(data_dir),
            "--language", "en", "--eval_split_name", ""]  # fmt: skip
    flags = parse_flags(argv)
    model, processor = flags.task.build_model_and_processor()
    train, _ = flags.task.load_datasets(processor)
    return flags.task, model, processor, train


def model_flops_per_sample(model, processor, train) -> float:
    """Training FLOPs of one sample (forward + backward) = 3 x forward (docs/PERFORMANCE.md).

    Weights: 6 x weights x positions they apply to (Kaplan et al. 2020, "C = 6N" per token):
    the encoder's over its 1500 positions, the decoder's (with the output projection) over the
    label tokens, and the cross-attention K/V projections over the 1500 encoder states.
    Attention scores and their weighted sum: 12 x layers x d_model x (keys) per query
    (Chowdhery et al. 2022, PaLM, appendix B), for encoder self-attention, decoder
    self-attention and cross-attention.
    """
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
          f"cross K/V {cross_kv / 1e6:.1f}M; mean label tokens {label_tokens:.1f}")  # fmt: skip
    encoder_flops = 6 * encoder * positions
    encoder_flops += 12 * config.encoder_layers * d_model * positions * positions
    decoder_flops = 6 * decoder * label_tokens + 6 * cross_kv * positions
    keys_per_query = label_tokens + positions  # decoder self-attention + cross-attention
    decoder_flops += 12 * config.decoder_layers * d_model * label_tokens * keys_per_query
    return encoder_flops + decoder_flops


def collate_time(task, processor, train, batch_size: int, batches: int = 4) -> float:
    """Median seconds to read and collate one batch, with the product's dataset and collator."""
    collator = task.data_collator(processor)
    times = []
    for index in range(batches):
        start = time.perf_counter()
        examples = [train[(index * batch_size + i) % len(train)] for i in range(batch_size)]
        collator(examples)
        times.append(time.perf_counter() - start)
    return median(times)


def run_configuration(config: Config, model_dir: Path, data_dir: Path, work: Path, steps: int):
    output_dir = work / "runs" / re.sub(r"\W+", "-", config.name).strip("-")
    argv = [
        sys.executable, "-m", "trainer", "--nproc_per_node", "1",
        "--model_name_or_path", str(model_dir), "--dataset_name", str(data_dir),
        "--language", "en", "--eval_split_name", "", "--output_dir", str(output_dir),
        "--max_steps", str(steps), "--logging_steps", "1", "--learning_rate", "1e-4",
        "--warmup_steps", "0", "--eval_strategy", "no", "--save_strategy", "no",
        "--report_to", "none", "--resume", "never",
        "--per_device_train_batch_size", str(config.batch_size), *config.flags,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "CLUSTER_SPEC"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))
    log = output_dir.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    step_ends = []  # when each `step N/M` line arrived: the launcher prints one per step
    start = time.monotonic()
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
    )
    peak = PeakMemory(process.pid)
    with log.open("w") as handle:
        for line in process.stdout:
            if STEP_LINE.match(line):
                step_ends.append(time.monotonic())
            handle.write(line)
    returncode = process.wait()
    peak.stop()
    wall = time.monotonic() - start
    if returncode != 0 or len(step_ends) < steps:
        print(log.read_text()[-3000:])
        print(f"FAILED (exit {returncode}): {shlex.join(argv)}")
    step_seconds = [b - a for a, b in zip(step_ends, step_ends[1:], strict=False)]
    step_seconds = step_seconds[WARMUP_STEPS - 1 :]  # the first WARMUP_STEPS steps dropped
    return Result(config, step_seconds, peak.bytes, wall, returncode)


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


def print_report(args, results: list[Result], flops_per_sample, collate_seconds, total) -> None:
    print()
    print(f"# whisper-{args.model}, {args.steps} steps per row (first {WARMUP_STEPS} dropped), "
          f"{datetime.now():%Y-%m-%d %H:%M}, {os.cpu_count()}-core {platform.machine()} CPU, "
          f"torch {torch.__version__}")  # fmt: skip
    print(f"# command: python bench/throughput.py {shlex.join(sys.argv[1:])}")
    print(f"# model FLOPs per training sample: {flops_per_sample / 1e9:.1f} GFLOP")
    print()
    print("| configuration | batch | samples/s | vs seed | step s (median) | step s (p10-p90) "
          "| peak RSS GiB | data wait | GFLOP/s | MFU |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    base_rate = None
    for result in results:
        config = result.config
        if result.returncode != 0 or len(result.step_seconds) < 2:
            print(f"| {config.name} | {config.batch_size} | failed (exit {result.returncode}) "
                  "| | | | | | | |")  # fmt: skip
            continue
        step = median(result.step_seconds)
        low, *_, high = quantiles(result.step_seconds, n=10)
        rate = config.batch_size / step
        base_rate = base_rate or rate
        workers = "--dataloader_num_workers" in config.flags
        wait = "in worker" if workers else f"{collate_seconds[config.batch_size] / step:.0%}"
        flops = rate * flops_per_sample
        mfu = f"{flops / (args.peak_tflops * 1e12):.1%}" if args.peak_tflops else "-"
        print(f"| {config.name} | {config.batch_size} | {rate:.2f} | {rate / base_rate:.2f}x "
              f"| {step:.2f} | {low:.2f}-{high:.2f} | {result.peak_rss_bytes / 2**30:.2f} "
              f"| {wait} | {flops / 1e9:.1f} | {mfu} |")  # fmt: skip
    print()
    print(f"benchmark wall time: {total / 60:.1f} min")


if __name__ == "__main__":
    main()
