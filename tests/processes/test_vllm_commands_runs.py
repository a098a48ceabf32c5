"""docs/serving.md's vLLM commands ("A large generation model: vLLM"), as the page writes
them (read from it here, not copied), run by the real gcloud CLI against the loopback
registry (tests/support/vertex_capture.py): `gcloud ai models upload` sends an
`UploadModelRequest` and `gcloud ai endpoints deploy-model` a `DeployModelRequest`, each
parsed strictly into `aiplatform_v1` types. Nothing here runs vLLM (it needs a GPU)."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

from tests.support.helpers import REPO_ROOT
from tests.support.vertex_capture import VertexCapture, gcloud_env

MARKER = "<!-- vllm-commands:"
IMAGE = "us-docker.pkg.dev/vertex-ai/vertex-vision-model-garden-dockers/pytorch-vllm-serve:"


def documented_commands() -> list[list[str]]:
    """The commands of the fenced block after MARKER in docs/serving.md, each as its words
    (continuation lines joined, quoted as a shell would)."""
    text = (REPO_ROOT / "docs" / "serving.md").read_text()
    block = text.split(MARKER, 1)[1].split("```\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line]


@pytest.fixture
def registry():
    capture = VertexCapture(project="p")
    yield capture
    capture.close()


def test_the_vllm_upload_and_deploy_commands_send_what_the_api_takes(registry, tmp_path):
    upload, deploy = documented_commands()
    assert upload[:4] == ["gcloud", "ai", "models", "upload"], upload
    assert deploy[:4] == ["gcloud", "ai", "endpoints", "deploy-model"], deploy
    env = gcloud_env(str(tmp_path), registry.endpoint)
    for command in (upload, deploy):
        if command is deploy:  # MODEL_ID: the id the upload made, as a person fills it in
            [uploaded] = registry.models
            command = [word.replace("MODEL_ID", uploaded.rpartition("/")[2]) for word in deploy]
        result = subprocess.run([shutil.which("gcloud"), *command[1:]], env=env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=180)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
    assert registry.errors == []

    [(parent, request)] = registry.uploads
    assert parent == "projects/p/locations/us-central1"
    model = request.model
    assert (model.display_name, model.artifact_uri) == ("chat-vllm", "gs://BUCKET/JOB/model")
    spec = model.container_spec
    assert spec.image_uri.startswith(IMAGE)
    assert list(spec.command) == []  # the image's entrypoint runs the args
    args = list(spec.args)
    assert args[:3] == ["python", "-m", "vllm.entrypoints.api_server"]
    # Vertex AI's copy of the artifact, as the container's `$(NAME)` reference, unexpanded
    assert {"--host=0.0.0.0", "--port=8080", "--model=$(AIP_STORAGE_URI)",
            "--generation-config=auto"} <= set(args)  # fmt: skip
    assert [port.container_port for port in spec.ports] == [8080]
    assert (spec.predict_route, spec.health_route) == ("/generate", "/ping")
    assert [(v.name, v.value) for v in spec.env] == [("MODEL_ID", "gs://BUCKET/JOB/model")]
    assert spec.shared_memory_size_mb == 16384
    assert spec.deployment_timeout.total_seconds() == 7200

    [(endpoint, request)] = registry.deploys
    assert endpoint == "projects/p/locations/us-central1/endpoints/ENDPOINT_ID"
    deployed = request.deployed_model
    assert deployed.model == uploaded
    assert deployed.display_name == "chat-vllm"
    resources = deployed.dedicated_resources
    machine = resources.machine_spec
    assert (machine.machine_type, machine.accelerator_type.name, machine.accelerator_count) == (
        "g2-standard-12", "NVIDIA_L4", 1)  # fmt: skip
    assert (resources.min_replica_count, resources.max_replica_count) == (1, 1)
