"""The prediction server under concurrent clients against a one-request-at-a-time
`pipeline()`, side by side in one run on this CPU: requests/s, p50/p99 latency, mean batch.

Models, built in a temporary folder with random weights from their configs (no download):
- `demo`: the demo's tiny Whisper (trainer/tasks/speech_recognition/demo.py `build_tiny_whisper`, as
  the demo builds it: 3 s window, at most 64 generated tokens);
- `speech`: whisper-small's dimensions (trainer/tasks/speech_recognition/
  whisper_sizes.py), the multilingual
  tokenizer rebuilt offline as the demo's is, generation capped at `SPEECH_TOKENS` tokens
  (a random model never ends its transcript by itself; a real 3 s clip's transcript is
  about that long) and timestamp tokens suppressed (a random model emits them, and
  `generate()` then decodes the clip again from each: five segments, not one). Both Whisper
  models decode with the speech pipeline's own default of
  5 beams (their generation configs, like the released ones, set no `num_beams`), on the
  server and one at a time alike;
- `image`: ViT-base (`ViTConfig()`'s defaults: 224 px, 16 px patches, 12 layers of 768)
  with a head of `IMAGE_LABELS` labels;
- `text`: BERT-base (`BertConfig()`'s defaults) with a 2-label head and a small WordPiece
  tokenizer trained on the request sentences (as tests/support/tiny_assets.py does).
- `chat`: a small Llama (`LlamaConfig`, 4 layers of 256) with a byte-level BPE tokenizer
  carrying Llama 3.1's special tokens and chat template (tests/support/chat_models.py); every
  request generates exactly `CHAT_TOKENS` tokens greedily (its generation config names no
  end-of-turn token, so no answer ends early), so tokens/s is `CHAT_TOKENS` x requests/s;
- `chat-135m`: the same, at SmolLM2-135M's dimensions (`SMOLLM2_135M`: 30 layers of 576,
  its 49,152-token vocabulary, of which the small tokenizer writes a few hundred), where
  each step's forward pass outweighs what the server and the engine add to it.

Instances: 3 s WAV clips (16 kHz tones over noise), 224x224 PNG images, one-sentence texts,
the same sentences as prompts (a few of each, cycled); every request holds one instance.

Per task, one after the other:
- **one at a time**: a fresh process (`OMP_NUM_THREADS=--cores`) runs
  `transformers.pipeline(task, model=dir)` on one input per call, sequentially, as the
  Hugging Face inference container does: base64-decoding and decoding the media (the
  pipeline's own ffmpeg read of the WAV bytes; Pillow for the PNG) are in each call's time.
  It runs where the server runs its model (trainer/tasks/served_model.py `device_and_dtype`:
  a GPU in bf16 if there is one, else the CPU in fp32), so both sides compare on the same
  device in the same dtype. One untimed warm-up call first.
- **server**: `python -m trainer.serve DIR` in a fresh process (`OMP_NUM_THREADS=--cores`,
  `--max_batch_size`, `--max_wait_ms`), started once per task and setting and driven, once
  it answers health 200, at each `--clients` count: that many threads, each with its own
  httpx client, posting one-instance requests back to back. Latency is each request's round
  trip as the client sees it; mean batch is the mean `batch_size` of the server's
  "prediction batch" log lines during that level.

- **forward pass alone**: a fresh process (`OMP_NUM_THREADS=--cores`) loads the model as
  the server does and times the server's own model-thread work (`predict`: collating, the
  forward pass, post-processing) on already prepared instances at batch 1, 4 and
  `--max_batch_size`: milliseconds per instance, and so the most batching can gain on this
  device whatever the server around it does. The targets table shows it beside each target.

Several `--max_batch_size` or `--max_wait_ms` values sweep the settings: one server per
combination, each driven at every `--clients` count, its rows labelled with its setting.
Several `--workers` values (`--workers 1 2`) run the server with that many model workers
behind its one port (docs/serving.md, "Several workers"): one server per value, all started
at once and driven in turns at each `--clients` count, so that a load that changes on a
shared machine meets each alike; the `--cores` threads are split among a server's workers.

`--report FILE` rewrites FILE after every row (the machine, the versions, the load, then the
two tables), and `--server_log FILE` gets every server's output as it comes, so a run that
is stopped keeps what it measured.

A level (and the one-at-a-time run) sends requests for `--duration` seconds (each client
starts no request after it), or `--requests` requests in all (spread over the clients, at
least one each); requests/s is the requests answered over the time from the first send to
the last answer. `--requests` or `--duration` take `N` for every task or `TASK=N` for one;
a task with a request count is measured by count. p50/p99 are nearest-rank percentiles.

    python bench/serve.py [--tasks demo speech image text chat chat-135m] [--clients 1 4 16]
                          [--duration 10 [TASK=S ...]] [--requests N [TASK=N ...]]
                          [--max_batch_size N ...] [--max_wait_ms MS ...] [--workers N ...]
                          [--generation_engines continuous generate]
                          [--cores N]
                          [--report FILE] [--server_log FILE] [--skip_baseline]

The targets (checked in the last table): at 16 clients at least 1.5x the one-at-a-time
requests/s for image and text, 2x for chat, and above it for speech; p99 at 4 clients under
twice the server's p50 at 1 client.
"""

from __future__ import annotations

import argparse
import base64
import functools
import io
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TextIO

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from trainer.serve.__main__ import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_WAIT_MS  # noqa: E402

SAMPLING_RATE = 16_000
CLIP_SECONDS = 3.0
SPEECH_TOKENS = 24
"""Generated tokens per whisper-small transcript (its `max_length`, prompt not counted)."""
IMAGE_SIZE = 224
IMAGE_LABELS = ("cat", "dog", "bird", "fish", "horse")
INPUTS_PER_TASK = 4
SENTENCES = (
    "Operating profit rose to EUR 13.1 mn from EUR 8.7 mn in the corresponding period in 2007.",
    "Net sales fell sharply in the first quarter as demand for paper products slumped.",
    "The company said it expects its full-year revenue to remain stable compared to last year.",
    "The share price jumped after the quarterly results beat analysts' expectations.",
)
CHAT_TOKENS = 32
"""Tokens each chat request generates."""
TASK_MODELS = {"demo": "demo tiny Whisper", "speech": "whisper-small", "image": "ViT-base",
               "text": "BERT-base", "chat": "small Llama", "chat-135m": "SmolLM2-135M"}  # fmt: skip
CHAT_TASKS = ("chat", "chat-135m")
BASELINE = "pipeline(), one at a time"
FORWARD = "forward pass alone"
FORWARD_BATCHES = (1, 4)
"""Batch sizes the forward pass alone is timed at, besides the server's `--max_batch_size`:
1 (a lone request) and 4 (four clients' requests sharing a batch)."""
FORWARD_REPEATS = 5
"""Timed calls per batch size (the fastest counts), fewer once they add up to a minute."""
TARGET_SPEEDUP = {"demo": 1.0, "speech": 1.0, "image": 1.5, "text": 1.5, "chat": 2.0,
                  "chat-135m": 2.0}  # fmt: skip
"""At 16 clients, the server's requests/s over one-at-a-time's must exceed (speech: the demo
and whisper-small) or reach (image, text) this."""
P99_LIMIT = 2.0
"""p99 at 4 clients under this times the server's p50 at 1 client."""


# --- models -------------------------------------------------------------------------------


def build_demo(model_dir: Path) -> None:
    from trainer.tasks.speech_recognition.demo import build_tiny_whisper

    build_tiny_whisper(model_dir)


def build_whisper_small(model_dir: Path) -> None:
    from trainer.tasks.speech_recognition.demo import (
        ENDOFTEXT,
        begin_suppress_tokens,
        build_whisper_tokenizer,
        save_random_whisper,
        suppress_tokens,
        whisper_generation_config,
    )
    from trainer.tasks.speech_recognition.whisper_sizes import whisper_config

    tokenizer = build_whisper_tokenizer()
    ids = tokenizer.convert_tokens_to_ids
    eot = ids(ENDOFTEXT)
    # A random model emits timestamp tokens even after <|notimestamps|>, and `generate()`
    # then reads each as a segment's end and decodes the clip again from there: five
    # segments of SPEECH_TOKENS, not one, were measured. A trained model does not; the
    # timestamps are suppressed so that each transcript is one segment, as a real one's.
    timestamps = list(range(ids("<|0.00|>"), ids("<|30.00|>") + 1))
    suppressed = suppress_tokens(tokenizer, True) + timestamps
    config = whisper_config(
        "small",
        decoder_start_token_id=ids("<|startoftranscript|>"),
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        suppress_tokens=suppressed,
        begin_suppress_tokens=begin_suppress_tokens(tokenizer),
    )
    generation = whisper_generation_config(
        tokenizer, max_length=SPEECH_TOKENS, suppress_tokens=suppressed
    )
    save_random_whisper(model_dir, config, generation, tokenizer, chunk_length=30)


def build_vit_base(model_dir: Path) -> None:
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessorPil

    config = ViTConfig(
        id2label=dict(enumerate(IMAGE_LABELS)),
        label2id={label: i for i, label in enumerate(IMAGE_LABELS)},
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = ViTForImageClassification(config)
    model.save_pretrained(model_dir)
    ViTImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(
        model_dir
    )


def build_bert_base(model_dir: Path) -> None:
    import torch
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(SENTENCES, vocab_size=400, min_frequency=1, show_progress=False)
    tokenizer = BertTokenizer(vocab=wordpiece.get_vocab(), do_lower_case=True, model_max_length=512)
    # BERT-base's own vocabulary size (30,522): the embedding is as large as the real one's.
    config = BertConfig(
        num_labels=2,
        id2label={0: "negative", 1: "positive"},
        label2id={"negative": 0, "positive": 1},
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = BertForSequenceClassification(config)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)


SMALL_LLAMA = {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
               "num_attention_heads": 8, "num_key_value_heads": 4,
               "tie_word_embeddings": False}  # fmt: skip
SMOLLM2_135M = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
                "rope_theta": 100000.0, "tie_word_embeddings": True}  # fmt: skip
"""HuggingFaceTB/SmolLM2-135M's config.json dimensions."""


def build_llama(model_dir: Path, dimensions: dict, device: str = "cpu", dtype=None) -> None:
    """A Llama of these `dimensions` (the tokenizer's vocabulary unless they name one), made
    on `device` in `dtype` (float32 unless given)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.support.chat_models import FAMILIES, family_tokenizer

    tokenizer = family_tokenizer(FAMILIES["llama"], list(SENTENCES))
    config = LlamaConfig(**{"vocab_size": len(tokenizer)} | dimensions,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=None)  # fmt: skip
    with torch.random.fork_rng(), torch.device(device):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(dtype or torch.float32)
    model.generation_config.update(max_new_tokens=CHAT_TOKENS, do_sample=False, eos_token_id=None)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)


def build_small_llama(model_dir: Path) -> None:
    build_llama(model_dir, SMALL_LLAMA)


BUILDERS: dict[str, Callable[[Path], None]] = {
    "demo": build_demo,
    "speech": build_whisper_small,
    "image": build_vit_base,
    "text": build_bert_base,
    "chat": build_small_llama,
    "chat-135m": functools.partial(build_llama, dimensions=SMOLLM2_135M),
}


# --- instances ----------------------------------------------------------------------------


def wav_bytes(index: int) -> bytes:
    """A 3 s, 16 kHz mono clip: a few tone bursts over noise."""
    rng = np.random.default_rng(index)
    t = np.arange(int(CLIP_SECONDS * SAMPLING_RATE)) / SAMPLING_RATE
    pitch = 200.0 + 40.0 * (np.floor(t * 3 + index) % 5)
    samples = 0.3 * np.sin(2 * np.pi * pitch * t) + rng.normal(0, 0.05, t.size)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(SAMPLING_RATE)
        wav.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def png_bytes(index: int) -> bytes:
    """A 224x224 RGB picture: a coloured gradient with noise."""
    from PIL import Image

    rng = np.random.default_rng(index)
    ramp = np.linspace(0, 255, IMAGE_SIZE)
    pixels = np.stack(
        [np.add.outer(ramp, ramp) / 2, np.add.outer(ramp[::-1], ramp) / 2,
         np.full((IMAGE_SIZE, IMAGE_SIZE), 40.0 * index)], axis=-1,
    )  # fmt: skip
    pixels = np.clip(pixels + rng.normal(0, 20, pixels.shape), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def instances(task: str) -> list[dict]:
    """The task's request instances, as a client sends them."""
    if task in ("demo", "speech"):
        return [{"audio": {"b64": base64.b64encode(wav_bytes(i)).decode()}}
                for i in range(INPUTS_PER_TASK)]  # fmt: skip
    if task == "image":
        return [{"image": {"b64": base64.b64encode(png_bytes(i)).decode()}}
                for i in range(INPUTS_PER_TASK)]  # fmt: skip
    if task in CHAT_TASKS:
        return [{"prompt": sentence} for sentence in SENTENCES[:INPUTS_PER_TASK]]
    return [{"text": sentence} for sentence in SENTENCES[:INPUTS_PER_TASK]]


# --- measurement --------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value at or above a share `q` of the values."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(latencies: list[float], elapsed: float) -> dict:
    return {
        "requests": len(latencies),
        "per_second": len(latencies) / elapsed,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def one_at_a_time(task: str, model_dir: str, payload: list[dict], budget: dict) -> dict:
    """In this process (the `--baseline` child): `pipeline()` on one input per call."""
    from trainer.common.quiet import silence_known_noise

    silence_known_noise()
    from PIL import Image
    from transformers import pipeline

    from trainer.tasks.registry import task_spec
    from trainer.tasks.served_model import device_and_dtype, task_of_model_dir

    device, dtype = device_and_dtype()  # where the server runs the model, in its dtype
    served = task_spec(task_of_model_dir(Path(model_dir))).predictor
    pipe = pipeline(served.pipeline_task, model=model_dir, device=device, dtype=dtype)

    def call(instance: dict):
        if "audio" in instance:
            return pipe(base64.b64decode(instance["audio"]["b64"]))
        if "image" in instance:
            raw = base64.b64decode(instance["image"]["b64"])
            return pipe(Image.open(io.BytesIO(raw)).convert("RGB"))
        if "prompt" in instance:  # the model's generation config: CHAT_TOKENS, greedy
            return pipe(instance["prompt"], return_full_text=False)
        return pipe(instance["text"])

    call(payload[0])  # warm-up, untimed: the server warms up before it answers health too
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + budget.get("duration", math.inf)
    while time.perf_counter() < deadline and len(latencies) < budget.get("requests", math.inf):
        sent = time.perf_counter()
        call(payload[len(latencies) % len(payload)])
        latencies.append(time.perf_counter() - sent)
    where = f"{pipe.device} in {pipe.model.dtype}"
    return summary(latencies, time.perf_counter() - start) | {"where": where}


def forward_alone(model_dir: str, payload: list[dict], batch_sizes: list[int]) -> dict:
    """In this process (the `--forward` child): the server's own model-thread work (its
    task's `Predictor.predict`, trainer/tasks/predictor.py: collating, the forward pass,
    post-processing) on
    batches of already prepared instances, with no HTTP, no queue and no pre-processing in
    the time. Its milliseconds per instance at batch 1 against batch N are the most that
    batching N requests can gain on this device, whatever the server around it does."""
    from trainer.common.quiet import silence_known_noise

    silence_known_noise()
    from trainer.tasks.served_model import load_predictor

    predictor = load_predictor(Path(model_dir))
    predictor.warm_up()
    prepared = [predictor.prepare(instance) for instance in payload]
    per_instance_ms = {}
    for size in batch_sizes:
        batch = [prepared[i % len(prepared)] for i in range(size)]
        times: list[float] = []
        while len(times) < FORWARD_REPEATS and sum(times) < 60:
            started = time.perf_counter()
            predictor.predict(batch, {})
            times.append(time.perf_counter() - started)
        per_instance_ms[size] = min(times) / size * 1000
    return {"per_instance_ms": per_instance_ms}


def in_fresh_process(mode: str, arguments: list[str], cores: int) -> dict:
    """This script's `--baseline` or `--forward` child with `OMP_NUM_THREADS=cores`: its
    last stdout line, a JSON object."""
    argv = [sys.executable, __file__, f"--{mode}", *arguments]
    done = subprocess.run(argv, capture_output=True, text=True, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": str(cores)})  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the {mode} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


class Server:
    """`python -m trainer.serve` in a process of its own; its stdout lines kept (and copied
    to `log` as they come)."""

    def __init__(
        self, model_dir: Path, cores: int, max_batch_size: int, max_wait_ms: float,
        log: TextIO | None = None, workers: int = 1, name: str = "",
        engine: str = "continuous",
    ):  # fmt: skip
        self.lines: list[str] = []
        self.log, self.name = log, name
        """`name`, when given, starts each of its lines in `log` (servers run side by side);
        `engine` is its --generation_engine (text generation's)."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trainer.serve", str(model_dir), "--host", "127.0.0.1",
             "--port", "0", "--max_batch_size", str(max_batch_size),
             "--max_wait_ms", str(max_wait_ms), "--workers", str(workers),
             "--generation_engine", engine],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "OMP_NUM_THREADS": str(cores)},
        )  # fmt: skip
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    @functools.cached_property
    def url(self) -> str:
        """Where it listens, from its first line (`serving ... on HOST:PORT ...`): it takes a
        free port itself (`--port 0`), so no other process can take it first."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.process.poll() is None:
            for line in list(self.lines):
                if line.startswith("serving "):
                    return "http://" + line.split(" on ", 1)[1].split(" ", 1)[0]
            time.sleep(0.1)
        raise RuntimeError("the server did not say where it listens:\n" + "".join(self.lines[-40:]))

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)
            if self.log is not None:
                self.log.write(f"[{self.name}] {line}" if self.name else line)
                self.log.flush()

    def where(self) -> str:
        """Its "model ready: TASK on DEVICE in DTYPE" line's device and dtype (a worker's
        line, "worker I (pid P): model ready: ...", adds its torch threads)."""
        for line in self.lines:
            if "model ready: " in line:
                return line.split("model ready: ", 1)[1].split(" on ", 1)[1].strip()
        return "?"

    def wait_ready(self, timeout: float = 900.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited {self.process.returncode}:\n"
                                   + "".join(self.lines[-40:]))  # fmt: skip
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("the server was not ready in time:\n" + "".join(self.lines[-40:]))

    def batch_sizes(self, since: int) -> list[int]:
        sizes = []
        for line in self.lines[since:]:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("message") == "prediction batch":
                sizes.append(record["batch_size"])
        return sizes

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.reader.join(timeout=5)


def drive(server: Server, bodies: list[bytes], clients: int, budget: dict) -> dict:
    """`clients` threads posting one-instance requests back to back."""
    import httpx

    if "requests" in budget:
        total = max(budget["requests"], clients)
        quotas = [total // clients + (i < total % clients) for i in range(clients)]
    else:
        quotas = [math.inf] * clients
    start_line = len(server.lines)
    ready = threading.Barrier(clients + 1)
    start_at: list[float] = []

    def client(index: int) -> tuple[list[float], float]:
        latencies: list[float] = []
        with httpx.Client(timeout=600) as http:
            ready.wait()
            deadline = start_at[0] + budget.get("duration", math.inf)
            while len(latencies) < quotas[index] and time.perf_counter() < deadline:
                body = bodies[(index + len(latencies)) % len(bodies)]
                sent = time.perf_counter()
                answer = http.post(f"{server.url}/predict", content=body,
                                   headers={"content-type": "application/json"})  # fmt: skip
                answer.raise_for_status()
                latencies.append(time.perf_counter() - sent)
        return latencies, time.perf_counter()

    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(client, i) for i in range(clients)]
        start_at.append(time.perf_counter())
        ready.wait()
        results = [future.result() for future in futures]
    latencies = [latency for own, _ in results for latency in own]
    elapsed = max(finished for _, finished in results) - start_at[0]
    time.sleep(0.2)  # the last batch's log line
    sizes = server.batch_sizes(start_line)
    return summary(latencies, elapsed) | {"mean_batch": sum(sizes) / max(len(sizes), 1)}


def measure_task(task: str, root: Path, args: argparse.Namespace, rows: list[dict]) -> None:
    """The task's rows, appended to `rows` as each is measured (and printed on stderr)."""
    model_dir = root / task
    built = time.perf_counter()
    BUILDERS[task](model_dir)
    print(f"{task}: built {TASK_MODELS[task]} in {time.perf_counter() - built:.0f} s",
          file=sys.stderr, flush=True)  # fmt: skip
    payload = instances(task)
    payload_file = root / f"{task}.json"
    payload_file.write_text(json.dumps(payload))
    budget = budget_of(task, args)
    if not args.skip_baseline:
        baseline = in_fresh_process(
            "baseline", [task, str(model_dir), str(payload_file), json.dumps(budget)], args.cores
        )
        add_row(rows, {"task": task, "path": BASELINE, "clients": 1, "mean_batch": 1.0}
                | baseline, args)  # fmt: skip
        sizes = sorted({*FORWARD_BATCHES, *args.max_batch_size})
        forward = in_fresh_process(
            "forward", [str(model_dir), str(payload_file), json.dumps(sizes)], args.cores
        )
        add_row(rows, {"task": task, "path": FORWARD} | forward, args)
    settings = list(itertools.product(args.max_batch_size, args.max_wait_ms))
    bodies = [json.dumps({"instances": [instance]}).encode() for instance in payload]
    for max_batch_size, max_wait_ms in settings:
        # One server per --workers value, all started, then driven in turns at each level:
        # a load that changes on a shared machine meets each alike.
        servers = {}
        engines = args.generation_engines if task in CHAT_TASKS else args.generation_engines[:1]
        try:
            for workers, engine in itertools.product(args.workers, engines):
                path = server_label(args, max_batch_size, max_wait_ms, workers, engine)
                side_by_side = len(args.workers) > 1 or len(engines) > 1
                if args.server_log is not None and not side_by_side:
                    args.server_log.write(f"=== {task}: {path}\n")
                servers[path] = Server(model_dir, args.cores, max_batch_size, max_wait_ms,
                                       args.server_log, workers, path if side_by_side else "",
                                       engine)  # fmt: skip
            for server in servers.values():
                server.wait_ready()
            for clients in args.clients:
                for path, server in servers.items():
                    row = drive(server, bodies, clients, budget)
                    add_row(rows, {"task": task, "path": path, "clients": clients} | row
                            | {"where": server.where(), "max_batch_size": max_batch_size},
                            args)  # fmt: skip
        finally:
            for server in servers.values():
                server.stop()


def server_label(args: argparse.Namespace, max_batch_size: int, max_wait_ms: float,
                 workers: int, engine: str) -> str:  # fmt: skip
    """A server row's path: "server", with the settings swept ("server, 2 workers",
    "server, generate")."""
    label = "server"
    if len(args.max_batch_size) * len(args.max_wait_ms) > 1:
        label += f", batch {max_batch_size}, wait {max_wait_ms:g} ms"
    if len(args.workers) > 1:
        label += f", {workers} worker{'s' if workers > 1 else ''}"
    if len(args.generation_engines) > 1:
        label += f", {engine}"
    return label


def add_row(rows: list[dict], row: dict, args: argparse.Namespace) -> None:
    """The row kept, printed on stderr, and the report rewritten with it."""
    rows.append(row)
    print(json.dumps(row), file=sys.stderr, flush=True)
    if args.report:
        Path(args.report).write_text(report(rows, args))


def budget_of(task: str, args: argparse.Namespace) -> dict:
    """{"requests": N} or {"duration": S} for `task`, from the flags."""
    requests = parsed_values(args.requests, task, int)
    if requests is not None:
        return {"requests": requests}
    return {"duration": parsed_values(args.duration, task, float)}


def parsed_values(values: list[str] | None, task: str, kind: type):
    """`TASK=N` for this task, else a plain `N`, else None."""
    plain = None
    for value in values or []:
        name, equals, number = value.rpartition("=")
        if not equals:
            plain = kind(number)
        elif name == task:
            return kind(number)
    return plain


# --- report -------------------------------------------------------------------------------


@functools.cache
def machine() -> str:
    """What runs it: the GPU or the processor, the versions (asked once)."""
    import torch
    import transformers

    if torch.cuda.is_available():
        device = f"{torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}"
    else:
        device = f"{platform.machine()} CPU, {os.cpu_count()} cores"
    return (f"{device}; Python {platform.python_version()}, torch {torch.__version__}, "
            f"transformers {transformers.__version__}")  # fmt: skip


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def report(rows: list[dict], args: argparse.Namespace) -> str:
    """The report so far: the command, the machine, where each side ran, the three tables."""
    command = " ".join(["bench/serve.py", *sys.argv[1:]])
    where = sorted({f"{TASK_MODELS[r['task']]}: {r['path'].split(',')[0]} on {r['where']}"
                    for r in rows if "where" in r})  # fmt: skip
    now = f"{time.strftime('%Y-%m-%d %H:%M:%S')}, load average {load_average()}"
    lines = [f"`{command}`", "", f"{machine()}; {now}", "", *(f"- {w}" for w in where)]
    tables = [table(rows), forward_table(rows), targets(rows)]
    return "\n".join([*lines, "", "\n\n".join(t for t in tables if t), ""])


def table(rows: list[dict]) -> str:
    baseline = {row["task"]: row for row in rows if row["path"] == BASELINE}
    lines = [
        "| model | path | clients | requests | requests/s | tokens/s | vs one at a time "
        "| p50 (ms) | p99 (ms) | mean batch |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["path"] == FORWARD:
            continue
        base = baseline.get(row["task"])
        ratio = f"{row['per_second'] / base['per_second']:.2f}x" if base else "-"
        tokens = f"{row['per_second'] * CHAT_TOKENS:.1f}" if row["task"] in CHAT_TASKS else "-"
        lines.append(
            f"| {TASK_MODELS[row['task']]} | {row['path']} | {row['clients']} | "
            f"{row['requests']} | {row['per_second']:.2f} | {tokens} | {ratio} | "
            f"{row['p50_ms']:,.0f} | {row['p99_ms']:,.0f} | {row['mean_batch']:.2f} |"
        )
    return "\n".join(lines)


def batching_gain(forward: dict, size: int) -> float | None:
    """Batch 1's time per instance over batch `size`'s, in the forward pass alone."""
    per_instance = forward["per_instance_ms"]
    if str(size) not in per_instance:
        return None
    return per_instance["1"] / per_instance[str(size)]


def forward_table(rows: list[dict]) -> str:
    """The forward pass alone: milliseconds per instance, and batching's gain, per batch."""
    forwards = [row for row in rows if row["path"] == FORWARD]
    if not forwards:
        return ""
    lines = ["| model | batch | ms per instance | gain over batch 1 |", "|---|---|---|---|"]
    for row in forwards:
        for size, milliseconds in row["per_instance_ms"].items():
            lines.append(f"| {TASK_MODELS[row['task']]} | {size} | {milliseconds:,.1f} | "
                         f"{batching_gain(row, int(size)):.2f}x |")  # fmt: skip
    return "\n".join(lines)


def targets(rows: list[dict]) -> str:
    """The issue's targets, per task (and server setting, in a sweep) where the run
    measured what they need, whatever the device; beside each, what the forward pass alone
    allows. Throughput: a one-at-a-time request's time over an instance's in a full batch
    (a server whose model thread did nothing else, everything before and after the forward
    pass done on other cores meanwhile). p99 at 4 clients: a batch of 4's time over a lone
    instance's (what four clients wait at least, against one)."""
    lines = ["| model | target | measured | the forward pass alone allows | met |",
             "|---|---|---|---|---|"]  # fmt: skip
    for task in dict.fromkeys(row["task"] for row in rows):
        own = {(row["path"], row.get("clients")): row for row in rows if row["task"] == task}
        base, forward = own.get((BASELINE, 1)), own.get((FORWARD, None))
        paths = list(dict.fromkeys(path for path, _ in own if path not in (BASELINE, FORWARD)))
        for path in paths:
            name = TASK_MODELS[task] + ("" if len(paths) == 1 else f" ({path})")
            single = own.get((path, 1))
            if task in TARGET_SPEEDUP and base and (path, 16) in own:
                ratio = own[(path, 16)]["per_second"] / base["per_second"]
                wanted = TARGET_SPEEDUP[task]
                met = ratio > wanted if wanted == 1.0 else ratio >= wanted
                sign = ">" if wanted == 1.0 else ">="
                size = str(own[(path, 16)]["max_batch_size"])
                full = forward and forward["per_instance_ms"].get(size)
                allows = f"{1000 / base['per_second'] / full:.2f}x" if full else "-"
                lines.append(f"| {name} | requests/s at 16 clients {sign} {wanted:.1f}x one "
                             f"at a time | {ratio:.2f}x | {allows} | "
                             f"{'yes' if met else 'no'} |")  # fmt: skip
            if single and (path, 4) in own:
                ratio = own[(path, 4)]["p99_ms"] / single["p50_ms"]
                met = "yes" if ratio < P99_LIMIT else "no"
                gain = forward and batching_gain(forward, 4)
                allows = f"{4 / gain:.2f}x" if gain else "-"
                lines.append(f"| {name} | p99 at 4 clients < {P99_LIMIT:.0f}x p50 at 1 client "
                             f"| {ratio:.2f}x | {allows} | {met} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", choices=tuple(BUILDERS),
                        default=["demo", "speech", "image", "text", "chat"])  # fmt: skip
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--duration", nargs="+", default=["10"],
                        help="seconds per level: N, or TASK=N for one task")  # fmt: skip
    parser.add_argument("--requests", nargs="+",
                        help="requests per level: N, or TASK=N for one task (wins over "
                             "--duration)")  # fmt: skip
    parser.add_argument("--max_batch_size", nargs="+", type=int,
                        default=[DEFAULT_MAX_BATCH_SIZE],
                        help="the server's; several: one server per value (a sweep)")  # fmt: skip
    parser.add_argument("--max_wait_ms", nargs="+", type=float, default=[DEFAULT_MAX_WAIT_MS],
                        help="the server's; several: one server per value (a sweep)")  # fmt: skip
    parser.add_argument(
        "--workers",
        nargs="+",
        type=int,
        default=[1],
        help="the server's model workers; several: one server per value",
    )
    parser.add_argument("--generation_engines", nargs="+", default=["continuous"],
                        choices=["continuous", "generate"],
                        help="the chat server's --generation_engine; several: one server per "
                             "value, side by side")  # fmt: skip
    parser.add_argument("--skip_baseline", action="store_true",
                        help="the server alone: no one-at-a-time run and no forward pass "
                             "alone (a sweep after a run that measured them)")  # fmt: skip
    parser.add_argument("--report", help="a file rewritten with the tables after every row")
    parser.add_argument("--server_log", type=argparse.FileType("a"),
                        help="a file every server's output is appended to as it comes")  # fmt: skip
    parser.add_argument("--cores", type=int, default=os.cpu_count(),
                        help="OMP_NUM_THREADS of the server and of pipeline()")  # fmt: skip
    parser.add_argument("--baseline", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--forward", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline:
        task, model_dir, payload_file, budget = args.baseline
        payload = json.loads(Path(payload_file).read_text())
        print(json.dumps(one_at_a_time(task, model_dir, payload, json.loads(budget))))
        return
    if args.forward:
        model_dir, payload_file, sizes = args.forward
        payload = json.loads(Path(payload_file).read_text())
        print(json.dumps(forward_alone(model_dir, payload, json.loads(sizes))))
        return
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as root:
        for task in args.tasks:
            try:
                measure_task(task, Path(root), args, rows)
            except Exception as error:  # the rows measured so far are still worth a table
                print(f"{task}: not measured to the end: {error}", file=sys.stderr, flush=True)
    print(f"measured in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print(report(rows, args))


if __name__ == "__main__":
    main()
