"""`python -m trainer.serve --workers N`: N model workers behind the one port (docs/serving.md,
"Several workers").

One Python process caps a small model on a large GPU: its event loop, its request parsing and
its one model thread are the bound, not the GPU. So the server process here (the supervisor)
binds the port itself, and N worker processes (spawned: none inherits a CUDA context or a
thread) each run uvicorn on that one listening socket, which the kernel hands connections
from; no balancer of our own sits in between. Each worker loads its own copy of the model
onto the same device, has its own batcher (batches form per worker) and its share of the
CPU's threads.

Health is shared: the workers' states sit in shared memory, and every worker answers health
503 until every worker has loaded and warmed its model, and again from the moment one stops
(its process ended, or its batching loop stopped). A worker that stops after it served is
started again by the supervisor (health 503 until the new one is warm); one that ends before
it was ever ready (the model does not load) ends the server, exit 1, as one process does. A
gs:// model is downloaded once, by the supervisor, while the workers wait for it. SIGTERM
(how Vertex AI stops a container) or SIGINT to the supervisor is passed to every worker, each
of which drains as uvicorn does; the supervisor then ends by that signal.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

import uvicorn

from trainer.common.quiet import silence_known_noise
from trainer.serve import app as served
from trainer.serve.contract import Contract
from trainer.serve.listening import opened
from trainer.tasks.load_failure import load_failure_line
from trainer.tasks.served_model import load_predictor, started_engine

LOADING, READY, STOPPED = 0, 1, 2
"""A worker's state in shared memory: loading its model, serving, or stopped serving."""
WORKER_HEADER = "x-serve-worker"
"""The response header naming the worker (its index) that answered."""
CUDA_CONTEXT_BYTES = 2**29
"""What a process's CUDA context takes on the GPU, about (0.3 to 0.5 GB on recent GPUs)."""
SERVING_BYTES = 2
"""Bytes per weight on a GPU: the server serves in bf16 (or fp16)."""


class Stopping(BaseException):
    """A worker stopped while it waited for the download: its loading thread ends quietly."""


@dataclass(frozen=True)
class WorkerSettings:
    """What every worker serves with (pickled to each)."""

    contract: Contract
    location: str
    """The model as given (a folder or a gs:// URI)."""
    folder: str
    """The local folder the workers load it from (for a gs:// model, where it downloads)."""
    threads: int
    max_batch_size: int
    max_wait: float
    max_request_bytes: int
    queue_size: int
    request_timeout: float | None
    gcs_read_prefixes: tuple[str, ...]
    generation_engine: str
    workers: int


def threads_per_worker(workers: int, env=os.environ) -> int:
    """Torch threads for each worker: the CPU's (OMP_NUM_THREADS if set, else the cores this
    process may run on) split among them, at least one each."""
    given = env.get("OMP_NUM_THREADS", "")
    total = int(given) if given.isdigit() and int(given) > 0 else len(os.sched_getaffinity(0))
    return max(1, total // workers)


def weight_count(folder: Path) -> int | None:
    """The model's weights, counted from its safetensors headers (safetensors reads no tensor
    for a shape); None when it has no safetensors file or one cannot be read (the workers'
    load says why)."""
    from safetensors import SafetensorError, safe_open

    count = 0
    try:
        for file in sorted(folder.glob("*.safetensors")):
            with safe_open(file, framework="numpy") as weights:
                count += sum(math.prod(weights.get_slice(name).get_shape())
                             for name in weights.keys())  # noqa: SIM118 (not a dict)  # fmt: skip
    except (OSError, SafetensorError):
        return None
    return count or None


def gpu_free_bytes() -> int | None:
    """The first visible GPU's free memory, from nvidia-smi (no CUDA context is made here);
    None without a GPU or nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", visible],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = done.stdout.split()
    return int(lines[0]) * 2**20 if done.returncode == 0 and lines and lines[0].isdigit() else None


def refusal_on_this_gpu(workers: int, folder: Path) -> str | None:
    """Why `workers` copies of the model in `folder` cannot fit this machine's GPU; None
    without a GPU, or if they may."""
    free = gpu_free_bytes()
    return None if free is None else copies_refusal(workers, weight_count(folder), free)


def copies_refusal(workers: int, weights: int | None, free: int | None) -> str | None:
    """Why `workers` copies of a model of `weights` weights plainly cannot fit a GPU with
    `free` bytes free (each copy in bf16 and a CUDA context; activations not counted), or
    None if they may (or either is unknown)."""
    if weights is None or free is None:
        return None
    each = weights * SERVING_BYTES + CUDA_CONTEXT_BYTES
    if workers * each <= free:
        return None
    fits = free // each
    size = weights * SERVING_BYTES / 1e9
    return (f"--workers {workers}: {workers} copies of the model ({size:.1f} GB of bf16 "
            f"weights and a CUDA context of about {CUDA_CONTEXT_BYTES / 1e9:.1f} GB each) do "
            f"not fit the GPU's {free / 1e9:.1f} GB free; at most {fits} would, before any "
            "batch's activations")  # fmt: skip


class SharedHealth:
    """The worker's app, with health answered from every worker's state: 503 (`loading`, or
    `failed` while one has stopped) until all are ready; and each answer naming the worker in
    its `x-serve-worker` header."""

    def __init__(self, app, health_route: str, states, index: int) -> None:
        self.app, self.health_route, self.states, self.index = app, health_route, states, index

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        header = (WORKER_HEADER.encode(), str(self.index).encode())

        async def named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        states = list(self.states)
        if scope["path"] == self.health_route and any(s != READY for s in states):
            status = "failed" if STOPPED in states else "loading"
            names = {LOADING: "loading", READY: "ready", STOPPED: "stopped"}
            body = json.dumps({"status": status, "workers": [names[s] for s in states]})
            await named({"type": "http.response.start", "status": 503,
                         "headers": [(b"content-type", b"application/json")]})  # fmt: skip
            return await named({"type": "http.response.body", "body": body.encode()})
        return await self.app(scope, receive, named)


def run_worker(
    index: int, sock: socket.socket, states, downloaded, settings, supervisor: int
) -> None:
    """One worker's process: its share of the threads, its own model and batcher, uvicorn
    on the shared socket. Ends 1 if its model did not load, else when told to stop (or when
    its batching loop stops: its supervisor starts another)."""
    os.environ["OMP_NUM_THREADS"] = str(settings.threads)  # before torch loads
    served.WORKER.update(worker=index, pid=os.getpid())
    silence_known_noise()
    server: uvicorn.Server | None = None
    failed: list[bool] = []

    def load():
        import torch

        torch.set_num_threads(settings.threads)
        while not downloaded.value:
            if server.should_exit:  # stopped before the model came: nothing to say
                raise Stopping
            time.sleep(0.2)
        predictor = load_predictor(Path(settings.folder))
        predictor.source = settings.location
        predictor.warm_up()
        started_engine(predictor, settings.generation_engine, settings.workers)
        pipe = predictor.pipe
        print(f"worker {index} (pid {os.getpid()}): model ready: {predictor.task} on "
              f"{pipe.device} in {pipe.model.dtype}, {settings.threads} torch threads",
              flush=True)  # fmt: skip
        states[index] = READY
        return predictor

    def stop(failure: bool) -> None:
        if failure:
            failed.append(True)
        else:
            states[index] = STOPPED
        server.should_exit = True

    contract = settings.contract
    app = served.make_app(
        contract, load, settings.max_batch_size, settings.max_wait, settings.max_request_bytes,
        settings.queue_size, on_load_failure=lambda: stop(True),
        request_timeout=settings.request_timeout, gcs_read_prefixes=settings.gcs_read_prefixes,
        model_location=settings.folder, on_batching_stopped=lambda: stop(False),
        after_batching_stops="the worker ends and another starts; health answers 503 until "
        "it is ready",
    )  # fmt: skip
    server = uvicorn.Server(uvicorn.Config(
        SharedHealth(app, contract.health_route, states, index), log_level="warning",
        access_log=False))  # fmt: skip
    threading.Thread(target=end_with_supervisor, args=(supervisor,), daemon=True).start()
    server.run(sockets=[sock])
    sys.exit(1 if failed else 0)


def end_with_supervisor(supervisor: int) -> None:
    """A worker whose supervisor was killed (no SIGTERM passed on), even while the worker
    was still starting, stops by itself."""
    while os.getppid() == supervisor:
        time.sleep(1)
    os.kill(os.getpid(), signal.SIGTERM)


def how_it_ended(code: int | None) -> str:
    if code is not None and code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class Supervisor:
    """Starts the workers, downloads a gs:// model once for them, and watches them: started
    again when one stops after it served, the server ended when one ends before it was ever
    ready, a stop signal passed on to all."""

    def __init__(self, workers: int, sock: socket.socket, settings: WorkerSettings) -> None:
        self.context = multiprocessing.get_context("spawn")
        self.sock, self.settings = sock, settings
        self.states = self.context.RawArray("b", workers)
        self.downloaded = self.context.RawValue("b", 0)
        """Set once the model is in its folder (shared memory, no semaphore: the server may
        end by a signal, which leaves no time to release one)."""
        self.processes: list = [None] * workers
        self.stopping: int | None = None
        """The signal the server was told to stop by."""
        self.failure: str | None = None
        """Why the model cannot be served, found by the supervisor (its download failed, or
        the copies do not fit the GPU): the server ends 1."""

    def start(self, index: int) -> None:
        self.states[index] = LOADING
        process = self.context.Process(
            target=run_worker, name=f"serve-worker-{index}",
            args=(index, self.sock, self.states, self.downloaded, self.settings, os.getpid()),
        )  # fmt: skip
        process.start()
        self.processes[index] = process

    def stop(self, signum: int, _frame=None) -> None:
        self.stopping = signum
        for process in self.processes:
            if process is not None and process.is_alive():
                os.kill(process.pid, signal.SIGTERM)

    def download(self) -> None:
        """The gs:// model into the workers' folder, then they are let go if its copies may
        fit the GPU (on a thread of its own: the supervisor watches the workers meanwhile)."""
        from trainer.storage.store import open_store

        folder = Path(self.settings.folder)
        try:
            open_store(self.settings.location).download(folder)
        except Exception as error:  # noqa: BLE001 - said in the log; the server ends 1
            self.failure = f"the model did not load: {load_failure_line(error, None)}"
            return
        self.failure = refusal_on_this_gpu(len(self.processes), folder)
        if self.failure is None:
            self.downloaded.value = 1

    def run(self) -> int:
        """Until every worker has ended: the server's exit code (a stop signal: re-raised)."""
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        for index in range(len(self.processes)):
            self.start(index)
        if self.settings.location.startswith("gs://"):
            threading.Thread(target=self.download, daemon=True).start()
        else:
            self.downloaded.value = 1
        code = self.watch()
        if self.stopping is not None:
            signal.signal(self.stopping, signal.SIG_DFL)
            os.kill(os.getpid(), self.stopping)
        return code

    def watch(self) -> int:
        code = 0
        while any(process.is_alive() for process in self.processes):
            ended = wait([p.sentinel for p in self.processes if p.is_alive()], timeout=0.5)
            if self.stopping is not None or code:
                continue  # the workers are stopping: wait for them all
            if self.failure:
                served.error_line(self.failure)
                code = self.end_all()
                continue
            code = self.replace_ended(ended)
        return code

    def replace_ended(self, ended: list) -> int:
        """Each worker whose sentinel is in `ended` replaced (0), until one ends the server
        (1)."""
        for index, process in enumerate(self.processes):
            if process.sentinel in ended:
                process.join()
                if self.replace(index, process):
                    return 1
        return 0

    def end_all(self) -> int:
        """Every worker told to stop, as the server ends 1."""
        self.stop(signal.SIGTERM)
        self.stopping = None
        return 1

    def replace(self, index: int, process) -> int:
        """A worker that ended while the server runs: started again if it had served (0),
        else the server ends (1)."""
        state = self.states[index]
        self.states[index] = STOPPED
        how = how_it_ended(process.exitcode)
        if state == LOADING:
            if process.exitcode != 1:  # 1: it said why (the model did not load)
                served.error_line(f"worker {index} (pid {process.pid}) {how} before its model "
                                  "was ready; the server stops")  # fmt: skip
            return self.end_all()
        if state != STOPPED or process.exitcode != 0:  # else it said why (its batching)
            served.error_line(f"worker {index} (pid {process.pid}) {how}; health answers 503 "
                              "until another has loaded the model")  # fmt: skip
        self.start(index)
        print(f"worker {index} started again (pid {self.processes[index].pid})", flush=True)
        return 0


def serve_with_workers(args, contract: Contract, location: str, prefixes: tuple[str, ...]) -> int:
    """`--workers N` (N > 1): the supervisor's exit code; a refusal (N copies do not fit the
    GPU, for a local model; a port that cannot be bound) is one `error:` line and 2."""
    workers = args.workers
    local = not location.startswith("gs://")
    if local:
        refusal = refusal_on_this_gpu(workers, Path(location))
        if refusal:
            print(f"error: {refusal}", file=sys.stderr, flush=True)
            return 2
    sock = opened(args.host, args.port, contract.port)
    if sock is None:
        return 2
    settings = WorkerSettings(
        contract, location, location if local else tempfile.mkdtemp(prefix="model-"),
        threads_per_worker(workers), args.max_batch_size, args.max_wait_ms / 1000,
        args.max_request_bytes, args.queue_size, args.request_timeout_s or None, prefixes,
        args.generation_engine, workers,
    )  # fmt: skip
    port = sock.getsockname()[1]
    print(f"serving {location} on {args.host}:{port} with {workers} workers of "
          f"{settings.threads} torch threads each (predict {contract.predict_route}, health "
          f"{contract.health_route}); instances may name gs:// objects under: "
          f"{', '.join(prefixes) or 'none'}; loading the model", flush=True)  # fmt: skip
    return Supervisor(workers, sock, settings).run()
