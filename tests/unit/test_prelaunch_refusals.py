"""Issue 33's lines that passed the launcher and then died after launch (or would have), now
refused before launch in one `error:` line that points the right way: an `--optim` whose
package or GPU is missing, a Hub checkpoint whose task cannot be told without `--task`, a Ray
cluster whose Python lacks the project's dependencies. Dry runs in this process
(tests/conftest.py `dry_run`: `python -m trainer --dry-run ...`, nothing written)."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from importlib.util import find_spec

import pytest
from huggingface_hub import constants
from transformers.utils import import_utils

from tests.support.helpers import (
    CPU,
    TEXT_COLUMNS,
    answer_json,
    assert_planned,
    assert_refused,
    resolved,
    use_hub_at,
)
from tests.support.loopback_hub import Repository, running_hub
from trainer import ray_submit
from trainer.common.errors import UserError
from trainer.launcher import main as launch
from trainer.node import machine
from trainer.preflight.training_checks import check_training_arguments
from trainer.settings.run_config import Hardware

L4 = Hardware(gpu_count=1, gpu_name="NVIDIA L4", compute_capability=(8, 9), cpu_count=8)


@pytest.fixture
def on_node(monkeypatch):
    """The node's detected hardware, made up: `on_node(CPU)`, `on_node(L4)`."""
    return lambda hardware: monkeypatch.setattr(machine, "detect_hardware", lambda: hardware)


# --optim ------------------------------------------------------------------------------------


def test_a_bitsandbytes_optimizer_on_a_cpu_node_is_refused(dry_run, on_node):
    """The issue's `--optim adamw_bnb_8bit` on a CPU node: an ImportError in every training
    process before; judged from the hardware, before bitsandbytes is imported."""
    on_node(CPU)
    for optim in ("adamw_bnb_8bit", "paged_adamw_8bit", "lion_32bit", "rmsprop_bnb"):
        assert_refused(
            dry_run("--optim", optim),
            f"error: --optim {optim} is a bitsandbytes optimizer and needs a CUDA GPU; this is "
            "a CPU-only node: leave --optim out (torch's AdamW, the default), or use a machine "
            "with a GPU.",
        )


@pytest.mark.skipif(find_spec("bitsandbytes") is not None, reason="needs no bitsandbytes")
def test_a_bitsandbytes_optimizer_without_bitsandbytes_is_refused(dry_run, on_node):
    on_node(L4)
    assert_refused(
        dry_run("--optim", "adamw_bnb_8bit"),
        "error: --optim adamw_bnb_8bit: You need to install `bitsandbytes` in order to use "
        "bitsandbytes optimizers: `pip install -U bitsandbytes` (not in this image): leave "
        "--optim out (torch's AdamW, the default), or add that package to the image's "
        "dependencies (pyproject.toml) and rebuild it.",
    )


OPTIONAL_PACKAGES = [
    ("galore_adamw", "galore_torch", "You need to install `galore_torch`"),
    ("apollo_adamw", "apollo_torch", "You need to install `apollo_torch`"),
    ("adalomo", "lomo_optim", "You need to install `lomo_optim`"),
    ("adamw_torch_8bit", "torchao", "You need to have `torchao>=0.4.0`"),
    ("schedule_free_adamw", "schedulefree", "You need to install `schedulefree`"),
    ("grokadamw", "grokadamw", "Please install grokadamw with `pip install grokadamw`"),
    ("stable_adamw", "optimi", "You need to install `torch-optimi`"),
    ("adamw_anyprecision", "torchdistx", "Please install https://github.com/pytorch/torchdistx"),
    ("adamw_torch_xla", "torch_xla", "Trainer failed to import syncfree AdamW from torch_xla"),
]
"""Optimizers of transformers' `OptimizerNames` whose package the image lacks, each with
transformers' own words for it (trainer_optimizer.py)."""


@pytest.mark.parametrize(("optim", "package", "words"), OPTIONAL_PACKAGES)
def test_an_optimizer_whose_package_the_image_lacks_is_refused(
    optim, package, words, dry_run, on_node
):
    if find_spec(package) is not None:
        pytest.skip(f"needs an environment without {package}")
    on_node(L4)
    assert_refused(
        dry_run("--optim", optim),
        f"error: --optim {optim}: {words}",
    )
    assert_refused(dry_run("--optim", optim), "(not in this image): leave --optim out")


def test_the_optimizers_torch_and_transformers_bring_are_accepted(dry_run, on_node):
    on_node(CPU)
    for optim in ("adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adagrad", "rmsprop"):
        plan = assert_planned(dry_run("--optim", optim))
        assert plan["config"]["flags"]["training"]["optim"] == optim


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """`installed(NAME, SOURCE)`: a stand-in third-party package on this process's path, as
    an image that installs it has it, gone after the test (transformers asks `find_spec`
    once and caches the answer: the caches of the two asked here are cleared around)."""
    answers = (import_utils.is_lomo_available, import_utils.is_galore_torch_available)
    names = []

    def install(name: str, source: str) -> None:
        (tmp_path / "site" / name).mkdir(parents=True)
        (tmp_path / "site" / name / "__init__.py").write_text(source)
        monkeypatch.syspath_prepend(tmp_path / "site")
        names.append(name)
        for answer in answers:
            answer.cache_clear()

    yield install
    for name in names:
        sys.modules.pop(name, None)
    for answer in answers:
        answer.cache_clear()


def test_an_optimizer_that_needs_the_model_passes_once_its_package_is_there(
    dry_run, on_node, installed
):
    """LOMO asks for the model after finding its package: only the training processes
    have it, so the launcher has nothing more to say."""
    on_node(CPU)
    installed("lomo_optim", "class Lomo: ...\nclass AdaLomo: ...\n")
    plan = assert_planned(dry_run("--optim", "adalomo"))
    assert plan["config"]["flags"]["training"]["optim"] == "adalomo"


def test_galore_without_target_modules_is_refused_once_its_package_is_there(
    dry_run, on_node, installed
):
    on_node(CPU)
    installed("galore_torch", "GaLoreAdafactor = GaLoreAdamW = GaLoreAdamW8bit = object\n")
    assert_refused(
        dry_run("--optim", "galore_adamw"),
        "error: --optim galore_adamw: You need to define `optim_target_modules` to use "
        "galore_adamw optimizers.",
    )


def test_a_job_spec_leaves_the_optimizers_package_to_the_image(text_assets):
    """`python -m trainer.jobspec` runs away from the image that will train (which has
    bitsandbytes, the `gpu` extra): it judges the machine's GPU, not this Python's packages."""
    model_dir, dataset_dir = text_assets
    argv = ["--task", "text-classification", "--model_name_or_path", model_dir,
            "--dataset_name", dataset_dir, *TEXT_COLUMNS, "--optim", "adamw_bnb_8bit"]  # fmt: skip
    args = check_training_arguments(resolved(argv, L4), packages_here=False)
    assert args.optim == "adamw_bnb_8bit"
    with pytest.raises(UserError, match="needs a CUDA GPU; this is a CPU-only node"):
        check_training_arguments(resolved(argv, CPU), packages_here=False)


# --do_predict's test split ------------------------------------------------------------------


def test_do_predict_without_the_test_split_is_refused_naming_the_splits(dry_run):
    """The split --do_predict predicts after training must be there before anything starts
    (its absence once surfaced only after training): one line naming the dataset's splits."""
    assert_planned(dry_run("--do_predict"))  # the fixture's sentiment set: train, test
    code, out, err = dry_run("--do_predict", "--test_split_name", "holdout")
    assert_refused((code, out, err), 'error: Split "holdout" not found in ')
    assert err.rstrip().endswith(
        ": it has test, train. (--test_split_name names the split --do_predict predicts)"
    ), err
    assert_planned(dry_run("--test_split_name", "holdout"))  # read only with --do_predict


def test_do_predict_on_files_needs_a_test_file(text_assets, capsys):
    """With --train_file, the test split is --test_file's: without it, the one line says
    which splits the files give."""
    model_dir, dataset_dir = text_assets
    args = ["--task", "text-classification", "--model_name_or_path", str(model_dir),
            "--train_file", str(dataset_dir / "train.csv"), *TEXT_COLUMNS,
            "--do_predict"]  # fmt: skip
    code, out, err = launch_dry_run(args, capsys)
    assert_refused(
        (code, out, err),
        'error: Split "test" not found in the data files '
        "(--train_file ...): it has train. (--test_split_name names the split",
    )
    with_test = [*args, "--test_file", str(dataset_dir / "test.csv")]
    assert_planned(launch_dry_run(with_test, capsys))


# A Hub checkpoint without --task -------------------------------------------------------------

INFERRED = "task: image-classification (no --task; org/tiny-vit's config.json on the Hub says vit)"


@pytest.fixture
def vit_hub(image_assets, tmp_path, monkeypatch):
    """A loopback Hub serving the tiny ViT as `org/tiny-vit` and the colour set as
    `org/colours`; this process online to it, with an empty Hub cache of its own."""
    model_dir, dataset_dir = image_assets
    colours = Repository.from_directory(dataset_dir)
    readable = {path: data for path, data in colours.files.items() if "0000" in path}
    repositories = {"org/tiny-vit": Repository.from_directory(model_dir),
                    "org/colours": Repository(readable)}  # fmt: skip
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))  # read at import
    with running_hub(repositories) as hub:
        use_hub_at(monkeypatch, hub.url)
        yield hub


def launch_dry_run(args: list[str], capsys) -> tuple[int, str, str]:
    """`python -m trainer --dry-run ARGS` in this process: (exit code, stdout, stderr)."""
    try:
        launch.main(["--dry-run", *args])
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    out, err = capsys.readouterr()
    return code, out, err


HUB_VIT = ["--model_name_or_path", "org/tiny-vit", "--dataset_name", "org/colours"]


def test_a_hub_vit_without_task_is_planned_from_its_config_on_the_hub(
    vit_hub, on_node, capsys, tmp_path, monkeypatch
):
    """The issue's Hub ViT, not in the cache: its config.json is asked of the Hub (into the
    cache, where the plan reads it) instead of falling back to speech recognition."""
    on_node(CPU)
    monkeypatch.chdir(tmp_path)
    plan = assert_planned(launch_dry_run(HUB_VIT, capsys))
    assert plan["config"]["flags"]["task"] == "image-classification"
    assert INFERRED in plan["notices"]
    assert ("GET", "/org/tiny-vit/resolve/main/config.json", None) in vit_hub.requests


ASK_FOR_TASK = (
    "add --task image-classification or --task preference-tuning or --task speech-recognition or "
    "--task text-classification or --task text-generation."
)


def test_a_hub_checkpoint_without_task_the_hub_may_not_be_asked_about_is_refused(
    vit_hub, on_node, capsys, tmp_path, monkeypatch
):
    """Offline or with --skip_hub_check, the config.json cannot be had: one line asking for
    --task, not speech recognition guessed (a traceback in the training processes)."""
    on_node(CPU)
    monkeypatch.chdir(tmp_path)
    closed = "org/tiny-vit is not in the local Hugging Face cache: its config.json, which would "
    for extra, reason in ((["--skip_hub_check"], "--skip_hub_check"), ([], "HF_HUB_OFFLINE")):
        monkeypatch.setenv("HF_HUB_OFFLINE", "1" if not extra else "0")
        assert_refused(
            launch_dry_run([*HUB_VIT, *extra], capsys),
            f"error: No --task, and {closed}tell the task, cannot be asked of the Hub "
            f"({reason}); {ASK_FOR_TASK}",
        )
    assert vit_hub.requests == [], "nothing asked"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    plan = assert_planned(launch_dry_run(["--task", "image-classification", *HUB_VIT], capsys))
    assert plan["config"]["flags"]["task"] == "image-classification"


def test_a_hub_checkpoint_without_task_the_hub_cannot_tell_is_refused(
    vit_hub, on_node, capsys, tmp_path, monkeypatch
):
    on_node(CPU)
    monkeypatch.chdir(tmp_path)
    assert_refused(
        launch_dry_run(
            ["--model_name_or_path", "org/gone", "--dataset_name", "org/colours"], capsys
        ),
        f"error: No --task, and the config.json of org/gone, which would tell the task, cannot "
        f"be read from the Hub at {vit_hub.url} (RepositoryNotFoundError: 404 Client Error.): "
        f"check the id, or {ASK_FOR_TASK}",
    )


# trainer.ray_submit: the cluster's Python ---------------------------------------------------


class JobsApi(http.server.BaseHTTPRequestHandler):
    """Ray's job REST API as a cluster whose dashboard has not yet found a job agent
    answers it: `refusals` submissions get Ray's own 500, then one is taken."""

    refusals = 0
    submissions: list[dict] = []

    def do_GET(self):
        import ray

        self._answer(200, {"ray_version": ray.__version__, "version": "4"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        JobsApi.submissions.append(body)
        if len(JobsApi.submissions) <= JobsApi.refusals:
            text = b"No available agent to submit job, please try again later."
            self.send_response(500)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
            return
        self._answer(200, {"submission_id": "raysubmit_taken", "job_id": "raysubmit_taken"})

    def _answer(self, status: int, payload: dict) -> None:
        answer_json(self, status, payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def jobs_api():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), JobsApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    JobsApi.submissions = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_submission_waits_for_a_freshly_started_cluster_s_job_agent(jobs_api, monkeypatch):
    """A cluster just started answers "try again later" until its dashboard has found a job
    agent: the submission is made again (the real client, against the API on loopback), and
    refused in one line only once AGENT_WAIT_SECONDS have passed."""
    client = ray_submit.connect(jobs_api)
    JobsApi.refusals = 2
    naps: list[float] = []
    assert ray_submit.submit(client, sleep=naps.append, entrypoint="python -V") == "raysubmit_taken"
    assert len(JobsApi.submissions) == 3 and len(naps) == 2
    assert JobsApi.submissions[-1]["entrypoint"] == "python -V"

    JobsApi.refusals, JobsApi.submissions = 10**6, []
    now = iter(range(0, 10**6, 30))
    with pytest.raises(UserError, match="refused the job: .*No available agent .*try again later"):
        ray_submit.submit(client, clock=lambda: next(now), sleep=naps.append, entrypoint="x")
    assert 1 < len(JobsApi.submissions) <= 1 + ray_submit.AGENT_WAIT_SECONDS / 30 + 1


# --register_model -----------------------------------------------------------------------------


def test_register_model_is_checked_before_launch(dry_run, monkeypatch):
    """What the registry would refuse, or a registration that cannot be made, is one line
    before anything trains: no serving image, a model that stays on the node's disk, a name
    Vertex AI refuses, no project to register in."""
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "test-project")
    assert_refused(dry_run("--register_model", "sentiment"),
                   "error: --register_model needs --serving_image")  # fmt: skip
    image = ["--serving_image", "us-central1-docker.pkg.dev/p/r/t-serve:abc"]
    assert_refused(dry_run("--register_model", "sentiment", *image),
                   "is not in Cloud Storage: Vertex AI serves a model from its gs://BUCKET/PATH "
                   "folder")  # fmt: skip
    in_gcs = ["--model_dir", "gs://bucket/run/model", *image]
    assert_refused(dry_run("--register_model", "n" * 129, *in_gcs),
                   "is not a Vertex AI model name")  # fmt: skip
    assert_refused(dry_run("--register_model", "sentiment", "--model_dir",
                           "gs://bucket/run/model", "--serving_image",
                           "us-docker.pkg.dev/p/r/t-serve:abc"),
                   "is in a multi-regional Artifact Registry (us)")  # fmt: skip
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT")
    monkeypatch.delenv("CLOUD_ML_PROJECT_ID", raising=False)
    assert_refused(dry_run("--register_model", "sentiment", *in_gcs),
                   "no project to register in")  # fmt: skip
    monkeypatch.setenv("CLOUD_ML_PROJECT_ID", "the-jobs-project")  # as Vertex AI sets it
    code, out, err = dry_run("--register_model", "sentiment", *in_gcs)
    assert code == 0, err


def test_register_model_aliases_and_deployment_timeout_are_checked_before_launch(
    dry_run, monkeypatch
):
    """`--version_alias` and `--deployment_timeout_s` ride with `--register_model` and are
    checked at launch by trainer.register's own rules (registration_request.py): a bad alias
    or timeout is one line before anything trains; good ones (repeatable) pass."""
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "test-project")
    registration = ["--register_model", "sentiment", "--model_dir", "gs://bucket/run/model",
                    "--serving_image", "us-central1-docker.pkg.dev/p/r/t-serve:abc"]  # fmt: skip
    assert_refused(dry_run(*registration, "--version_alias", "Production"),
                   "error: --register_model sentiment: --version_alias 'Production' is not a "
                   "Vertex AI version alias: [a-z][a-zA-Z0-9-]{0,126}[a-z0-9]")  # fmt: skip
    assert_refused(dry_run(*registration, "--version_alias", "prod", "--version_alias", "prod"),
                   "--version_alias: each alias once")  # fmt: skip
    assert_refused(dry_run(*registration, "--deployment_timeout_s", "7201"),
                   "error: --register_model sentiment: --deployment_timeout_s 7201: "
                   "1 to 7200")  # fmt: skip
    code, out, err = dry_run(*registration, "--version_alias", "production", "--version_alias",
                             "v2-candidate", "--deployment_timeout_s", "3600")  # fmt: skip
    assert code == 0, err


def test_a_job_spec_registers_with_the_serving_image_of_its_own_commit():
    """`trainer.jobspec` names the serving image cloudbuild.yaml pushed beside --image from
    the same commit (IMAGE-serve:TAG); an image pinned by digest names none: one line."""
    from trainer.jobspec.__main__ import parse_arguments
    from trainer.jobspec.custom_job import container_args

    options, flags = parse_arguments([
        "--image", "us-central1-docker.pkg.dev/p/r/vertex-hf-trainer:abc123",
        "--register_model", "whisper-demo"])  # fmt: skip
    args = container_args(options, flags)
    assert args[-2:] == [
        "--serving_image",
        "us-central1-docker.pkg.dev/p/r/vertex-hf-trainer-serve:abc123",
    ]
    options, flags = parse_arguments([
        "--image", "us-docker.pkg.dev/p/r/trainer@sha256:" + "ab" * 32,
        "--register_model", "whisper-demo"])  # fmt: skip
    with pytest.raises(UserError, match="pass --serving_image"):
        container_args(options, flags)
