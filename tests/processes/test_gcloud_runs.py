"""The real gcloud CLI submits config.yaml, hptuning.yaml and cloudbuild.yaml.

gcloud is pointed at a capture server on 127.0.0.1, which records
each request and answers like the API would, so gcloud exits 0 and the tests can check the
exact body a user's `gcloud ... --config` sends: worker pools, replica counts, image, args,
env, output directory, build steps and substitutions. cloudbuild.yaml's check-tag step is
run by bash. What is checked without the CLI: tests/unit/test_gcloud.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from google.cloud.aiplatform_v1.types import CustomJobSpec, HyperparameterTuningJob

from tests.support.helpers import CONFIG, HPTUNING, REPO_ROOT, parse_strictly
from tests.support.image_build import CLOUDBUILD
from trainer.config.topology import GPUS_PER_REPLICA_VARIABLE
from trainer.jobspec import __main__ as jobspec
from trainer.jobspec.custom_job import DEFAULT_ENV, DEFAULT_IMAGE, SPOT_SAVE_INTERVAL_MINUTES

REGION = "europe-west4"


class CaptureServer(ThreadingHTTPServer):
    """Records (method, path, JSON body) and answers as Vertex AI or Cloud Build would."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _CaptureHandler)
        self.requests: list[tuple[str, str, dict]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"  # gcloud needs the slash


class _CaptureHandler(BaseHTTPRequestHandler):
    server: CaptureServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        path = self.path.split("?")[0]
        self.server.requests.append(("POST", path, body))
        self._reply(_api_response(path, body))

    def do_GET(self) -> None:
        self.server.requests.append(("GET", self.path.split("?")[0], {}))
        self._reply({}, status=404)

    def _reply(self, payload: dict, status: int = 200) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # keep pytest's output clean
        pass


def _api_response(path: str, body: dict) -> dict:
    if path.endswith("/builds"):
        build = {**body, "id": "b-1", "projectId": "p", "status": "QUEUED"}
        return {
            "name": "operations/build/p/b-1",
            "metadata": {
                "@type": "type.googleapis.com/google.devtools.cloudbuild.v1.BuildOperationMetadata",
                "build": build,
            },
        }
    # POST /v1/projects/p/locations/REGION/customJobs (or hyperparameterTuningJobs)
    return {**body, "name": f"{path.removeprefix('/v1/')}/1", "state": "JOB_STATE_PENDING"}


@pytest.fixture
def capture():
    server = CaptureServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def gcloud(capture: CaptureServer, tmp_path, *args: str) -> tuple[str, str, dict]:
    """Run gcloud against the capture server; return the one request it made."""
    env = {  # nothing of the user's gcloud configuration or credentials
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "CLOUDSDK_CONFIG": str(tmp_path / "gcloud-config"),
        "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
        "CLOUDSDK_CORE_PROJECT": "p",
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
        "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_AIPLATFORM": capture.url,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDBUILD": capture.url,
    }
    result = subprocess.run(
        [shutil.which("gcloud"), *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    posts = [request for request in capture.requests if request[0] == "POST"]
    assert len(posts) == 1, capture.requests
    return posts[0]


def test_custom_job_create_sends_config_yaml_as_written(capture, tmp_path):
    _, path, body = gcloud(
        capture, tmp_path, "ai", "custom-jobs", "create", f"--region={REGION}",
        "--display-name=whisper-small-sr", "--config=config.yaml",
    )  # fmt: skip
    assert path == f"/v1/projects/p/locations/{REGION}/customJobs"
    assert body["displayName"] == "whisper-small-sr"
    spec = body["jobSpec"]
    chief, workers = spec["workerPoolSpecs"]
    assert [chief["replicaCount"], workers["replicaCount"]] == ["1", "1"]  # int64 as JSON text
    for pool in (chief, workers):
        assert pool["machineSpec"] == {
            "machineType": "a2-highgpu-8g",
            "acceleratorType": "NVIDIA_TESLA_A100",
            "acceleratorCount": 8,
        }
        assert pool["containerSpec"]["imageUri"] == DEFAULT_IMAGE
        assert pool["containerSpec"]["args"] == ["whisper-small.yaml", "--deepspeed", "zero2"]
        env = {item["name"]: item["value"] for item in pool["containerSpec"]["env"]}
        assert env == DEFAULT_ENV | {GPUS_PER_REPLICA_VARIABLE: "8"}
        assert pool["diskSpec"] == {"bootDiskSizeGb": 200}
    assert spec["baseOutputDirectory"] == {"outputUriPrefix": "gs://BUCKET/whisper-small-sr"}
    assert spec["scheduling"] == {
        "timeout": "86400s",
        "restartJobOnWorkerRestart": True,
        "disableRetries": False,
    }
    # Nothing in the file was lost or added on the way.
    sent = parse_strictly(spec, CustomJobSpec)
    assert sent == parse_strictly(yaml.safe_load(CONFIG.read_text()), CustomJobSpec)


def test_hp_tuning_job_create_sends_hptuning_yaml_as_written(capture, tmp_path):
    _, path, body = gcloud(
        capture, tmp_path, "ai", "hp-tuning-jobs", "create", f"--region={REGION}",
        "--display-name=whisper-small-sr-tuning", "--config=hptuning.yaml",
    )  # fmt: skip
    assert path == f"/v1/projects/p/locations/{REGION}/hyperparameterTuningJobs"
    assert body["displayName"] == "whisper-small-sr-tuning"
    assert (body["maxTrialCount"], body["parallelTrialCount"]) == (8, 2)
    assert body["studySpec"]["metrics"] == [{"metricId": "wer", "goal": "MINIMIZE"}]
    parameters = {p["parameterId"]: p for p in body["studySpec"]["parameters"]}
    assert parameters["learning_rate"]["scaleType"] == "UNIT_LOG_SCALE"
    assert set(parameters) == {"learning_rate", "warmup_steps"}
    sent = parse_strictly(body, HyperparameterTuningJob)
    written = parse_strictly(yaml.safe_load(HPTUNING.read_text()), HyperparameterTuningJob)
    written.display_name = "whisper-small-sr-tuning"
    assert sent == written
    assert sent.trial_job_spec == parse_strictly(yaml.safe_load(CONFIG.read_text()), CustomJobSpec)


def test_builds_submit_sends_build_smoke_test_and_push(capture, tmp_path):
    _, path, body = gcloud(
        capture, tmp_path, "builds", "submit", "--no-source", "--async",
        "--config=cloudbuild.yaml", "--substitutions=_TAG=abc1234,_REGION=europe-west4",
    )  # fmt: skip
    assert path == "/v1/projects/p/locations/global/builds"
    assert body["substitutions"] == {
        "_REGION": "europe-west4",
        "_REPOSITORY": "vertex-trainer",
        "_IMAGE": "vertex-hf-trainer",
        "_TAG": "abc1234",
        "_REDUCTION_SERVER": "0",
    }
    assert body["options"] == {"machineType": "E2_HIGHCPU_32", "diskSizeGb": "200"}
    assert body["timeout"] == "7200s"
    image = "${_REGION}-docker.pkg.dev/${PROJECT_ID}/${_REPOSITORY}/${_IMAGE}"
    assert body["images"] == [f"{image}:${{_TAG}}", f"{image}:latest", f"{image}:builder",
                              f"{image}-ray:${{_TAG}}", f"{image}-serve:${{_TAG}}"]  # fmt: skip

    steps = {step["id"]: step for step in body["steps"]}
    assert list(steps) == [
        "check-tag",
        "pull-previous",
        "build-builder",
        "build",
        "smoke-test",
        "build-ray",
        "build-serve",
        "smoke-test-serve",
    ], "check the tag, pull, build, test; push last"
    pull = steps["pull-previous"]["args"][-1]
    assert f"docker pull {image}:$$tag" in pull and "for tag in builder latest;" in pull
    # The builder stage is built and tagged on its own: an image holds only its last stage,
    # and the next build needs the compile's layers as a cache.
    builder = steps["build-builder"]["args"]
    assert builder[0] == "build" and builder[-1] == "." and "--target=builder" in builder
    assert {f"--cache-from={image}:builder", f"--tag={image}:builder"} <= set(builder)
    build = steps["build"]["args"]
    assert build[0] == "build" and build[-1] == "."
    assert {f"--cache-from={image}:builder", f"--cache-from={image}:latest"} <= set(build)
    assert {f"--tag={image}:${{_TAG}}", f"--tag={image}:latest"} <= set(build)
    assert "--target=builder" not in build
    for args in (builder, build):
        assert "--file=docker/Dockerfile" in args and "--build-arg=BUILDKIT_INLINE_CACHE=1" in args
    smoke = steps["smoke-test"]["args"][-1]
    assert f"{image}:${{_TAG}}" in smoke and '-c "$$(cat docker/smoke-test.sh)"' in smoke
    # Every substitution is used and every one used is defined (Cloud Build rejects either).
    used = set(re.findall(r"\$\{(_[A-Z_]+)\}", json.dumps(body["steps"] + body["images"])))
    assert used == set(body["substitutions"])


def check_tag_step(tag: str) -> subprocess.CompletedProcess:
    """Run cloudbuild.yaml's check-tag script with bash, substituted as Cloud Build would."""
    steps = {step["id"]: step for step in yaml.safe_load(CLOUDBUILD.read_text())["steps"]}
    script = steps["check-tag"]["args"][-1].replace("${_TAG}", tag).replace("$$", "$")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


def test_cloud_build_refuses_to_push_without_a_commit_tag():
    default = yaml.safe_load(CLOUDBUILD.read_text())["substitutions"]["_TAG"]
    for tag in (default, "dev", "latest", ""):
        result = check_tag_step(tag)
        assert result.returncode != 0, tag
        assert result.stdout == (
            f"error: _TAG is '{tag}', not a commit SHA: submit with "
            "--substitutions=_TAG=$(git rev-parse --short HEAD) (a trigger: _TAG=$SHORT_SHA).\n"
        )
    for tag in ("abc1234", "0123456789abcdef0123456789abcdef01234567"):
        assert check_tag_step(tag).returncode == 0, tag


def send_generated_job(capture, tmp_path, flags: list[str], name: str):
    """`trainer.jobspec FLAGS`, then its config.yaml sent by the real gcloud CLI: the request
    body, and its strict parse (checked equal to the written file's). Then its hptuning.yaml:
    the trial spec sent, strictly parsed."""
    jobspec.main([*flags, "--dest", str(tmp_path / "job")])
    _, _, body = gcloud(
        capture, tmp_path, "ai", "custom-jobs", "create", f"--region={REGION}",
        f"--display-name={name}", f"--config={tmp_path / 'job' / 'config.yaml'}",
    )  # fmt: skip
    sent = parse_strictly(body["jobSpec"], CustomJobSpec)
    written = yaml.safe_load((tmp_path / "job" / "config.yaml").read_text())
    assert sent == parse_strictly(written, CustomJobSpec)

    capture.requests.clear()
    _, _, tuning = gcloud(
        capture, tmp_path, "ai", "hp-tuning-jobs", "create", f"--region={REGION}",
        f"--display-name={name}-tuning", f"--config={tmp_path / 'job' / 'hptuning.yaml'}",
    )  # fmt: skip
    return body, sent, parse_strictly(tuning, HyperparameterTuningJob).trial_job_spec


def test_flex_start_job_is_sent_with_its_scheduling_strategy(capture, tmp_path):
    """--flex_start: the custom job and the tuning trials ask for FLEX_START with a wait."""
    body, sent, trial = send_generated_job(
        capture, tmp_path, ["--flex_start", "--max_wait_hours", "6"], "flex"
    )
    assert body["jobSpec"]["scheduling"] == {
        "timeout": "86400s",
        "restartJobOnWorkerRestart": True,
        "disableRetries": False,
        "strategy": "FLEX_START",
        "maxWaitDuration": "21600s",
    }
    assert sent.scheduling.strategy.name == "FLEX_START"
    assert sent.scheduling.max_wait_duration.total_seconds() == 6 * 3600
    assert trial == sent


def test_spot_job_is_sent_with_restarts_a_wait_and_saves_by_time(capture, tmp_path):
    """--spot: Spot VMs, the whole job restarted when a worker is, retries left on, a
    bounded wait for capacity, and every node saving at least every 15 minutes."""
    body, sent, trial = send_generated_job(
        capture, tmp_path, ["--spot", "--max_wait_hours", "4"], "spot"
    )
    assert body["jobSpec"]["scheduling"] == {
        "timeout": "86400s",
        "restartJobOnWorkerRestart": True,
        "disableRetries": False,
        "strategy": "SPOT",
        "maxWaitDuration": "14400s",
    }
    for pool in body["jobSpec"]["workerPoolSpecs"]:
        args = pool["containerSpec"]["args"]
        assert args[args.index("--save_interval_minutes") + 1] == str(SPOT_SAVE_INTERVAL_MINUTES)
    assert sent.scheduling.strategy.name == "SPOT"
    assert sent.scheduling.restart_job_on_worker_restart and not sent.scheduling.disable_retries
    assert sent.scheduling.max_wait_duration.total_seconds() == 4 * 3600
    assert trial == sent


PLACED = {
    "serviceAccount": "trainer@p.iam.gserviceaccount.com",
    "tensorboard": "projects/p/locations/europe-west4/tensorboards/1234",
    "enableWebAccess": True,
    "network": "projects/123456/global/networks/training-vpc",
}


def test_placement_fields_are_sent_as_the_api_names_them(capture, tmp_path):
    """Service account, TensorBoard, web access, network and a specific reservation reach
    the API from `trainer.jobspec`'s flags, in the custom job and in every tuning trial."""
    reservation = "projects/p/zones/europe-west4-a/reservations/a100-pool"
    body, sent, trial = send_generated_job(
        capture, tmp_path,
        ["--service_account", PLACED["serviceAccount"], "--tensorboard", PLACED["tensorboard"],
         "--enable_web_access", "--network", PLACED["network"], "--reservation", reservation],
        "placed",
    )  # fmt: skip
    spec = body["jobSpec"]
    assert {name: spec[name] for name in PLACED} == PLACED
    for pool in spec["workerPoolSpecs"]:
        assert pool["machineSpec"]["reservationAffinity"] == {
            "reservationAffinityType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": [reservation],
        }
    assert sent.service_account == PLACED["serviceAccount"] and sent.enable_web_access
    affinity = sent.worker_pool_specs[0].machine_spec.reservation_affinity
    assert affinity.reservation_affinity_type.name == "SPECIFIC_RESERVATION"
    assert trial == sent


def test_a_job_on_a_persistent_resource_names_it(capture, tmp_path):
    body, sent, trial = send_generated_job(
        capture, tmp_path,
        ["--persistent_resource_id", "a100-pool", "--reservation", "any"], "persistent",
    )  # fmt: skip
    assert body["jobSpec"]["persistentResourceId"] == "a100-pool"
    assert sent.persistent_resource_id == "a100-pool"
    for pool in sent.worker_pool_specs:
        assert pool.machine_spec.reservation_affinity.reservation_affinity_type.name == (
            "ANY_RESERVATION"
        )
    assert trial == sent


def test_a_python_package_job_is_sent_as_written(capture, tmp_path, gcs):
    """--python_package: every pool is a pythonPackageSpec that runs `trainer` from the
    uploaded sdist on the image, with the image job's args and env; gcloud sends it as
    written (strictly parsed), and so do the tuning trials."""
    from tests.support.gcs_emulator import BUCKET

    base = f"gs://{BUCKET}/package-sent"
    body, sent, trial = send_generated_job(
        capture, tmp_path, ["--python_package", "--base_output_dir", base], "package"
    )
    for pool in body["jobSpec"]["workerPoolSpecs"]:
        assert "containerSpec" not in pool
        spec = pool["pythonPackageSpec"]
        assert spec["executorImageUri"] == DEFAULT_IMAGE
        assert spec["pythonModule"] == "trainer"
        (uri,) = spec["packageUris"]
        sdist = r"vertex_hf_trainer-0\.1\.0\.tar\.gz"
        assert re.fullmatch(rf"{base}/packages/[0-9a-f]{{16}}/{sdist}", uri)
        assert spec["args"] == ["whisper-small.yaml", "--deepspeed", "zero2"]
        env = {item["name"]: item["value"] for item in spec["env"]}
        assert env == DEFAULT_ENV | {GPUS_PER_REPLICA_VARIABLE: "8"}
    for pool in sent.worker_pool_specs:
        assert pool.python_package_spec.python_module == "trainer"
        assert not pool.container_spec.image_uri
    assert trial == sent


def test_a_python_package_command_job_is_sent_as_written(capture, tmp_path, gcs):
    """--python_package_command: every pool is a containerSpec of the image whose command
    installs the uploaded sdist from the /gcs/ mount and then runs the launcher with the
    image job's args and env; gcloud sends it as written (strictly parsed)."""
    from tests.support.gcs_emulator import BUCKET

    base = f"gs://{BUCKET}/package-command-sent"
    argv = ["--python_package", "--python_package_command", "--base_output_dir", base]
    body, sent, trial = send_generated_job(capture, tmp_path, argv, "package-command")
    for pool in body["jobSpec"]["workerPoolSpecs"]:
        assert "pythonPackageSpec" not in pool
        spec = pool["containerSpec"]
        assert spec["imageUri"] == DEFAULT_IMAGE
        shell, flag, script, name = spec["command"]
        assert (shell, flag, name) == ("sh", "-c", "trainer")
        mounted = rf"/gcs/{BUCKET}/package-command-sent/packages/[0-9a-f]{{16}}/"
        assert re.fullmatch(
            rf"python -m pip install --quiet --user --no-build-isolation {mounted}"
            r'vertex_hf_trainer-0\.1\.0\.tar\.gz && exec python -m trainer "\$@"',
            script,
        ), script
        assert spec["args"] == ["whisper-small.yaml", "--deepspeed", "zero2"]
        env = {item["name"]: item["value"] for item in spec["env"]}
        assert env == DEFAULT_ENV | {GPUS_PER_REPLICA_VARIABLE: "8"}
    for pool in sent.worker_pool_specs:
        assert list(pool.container_spec.command) == spec["command"]
    assert trial == sent
