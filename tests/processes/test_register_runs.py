"""`--register_model` in real runs: `python -m trainer` trains, delivers its model to Cloud
Storage (the project's emulator) and registers it with the real Vertex AI SDK in a Model
Registry on loopback (tests/support/vertex_capture.py), as a restarted Vertex AI job does:
credentials without the permission are refused before training; a registry that refuses
the upload keeps the model and gives the command to retry; the restart registers the
delivered model without training; a further restart registers nothing."""

from __future__ import annotations

import json
import re
import uuid

import pytest

from tests.support.gcs_emulator import BUCKET
from tests.support.helpers import TEXT_COLUMNS, run_trainer, trainer_env, vertex_outputs
from tests.support.vertex_capture import VertexCapture
from trainer.storage.store import open_store

IMAGE = "us-central1-docker.pkg.dev/p/r/vertex-hf-trainer-serve:abc1234"


@pytest.fixture
def registry():
    capture = VertexCapture()
    yield capture
    capture.close()


def test_a_run_registers_its_model_once_even_when_the_registry_first_refuses(
    tmp_path, text_assets, gcs, registry
):
    model_dir, dataset_dir = text_assets
    base = f"gs://{BUCKET}/{uuid.uuid4().hex}"
    env = trainer_env(tmp_path / "cache", STORAGE_EMULATOR_HOST=gcs, CLOUD_ML_JOB_ID="4242",
                      GOOGLE_CLOUD_PROJECT="test-project", **vertex_outputs(base))  # fmt: skip
    args = ["--task", "text-classification", "--model_name_or_path", str(model_dir),
            "--dataset_name", str(dataset_dir), *TEXT_COLUMNS, "--max_seq_length", "16",
            "--deepspeed", "none", "--nproc_per_node", "1", "--max_steps", "2",
            "--eval_strategy", "steps", "--eval_steps", "2", "--output_dir", "out",
            "--register_model", "sentiment", "--serving_image", IMAGE,
            "--registry_api_endpoint", registry.endpoint, "--version_alias", "production",
            "--deployment_timeout_s", "1800"]  # fmt: skip

    registry.deny("aiplatform.models.upload")  # asked by the launcher before training
    code, output = run_trainer(args, cwd=tmp_path, env=env, timeout=300)
    assert code == 2, output[-3000:]
    assert (
        output.strip()
        .splitlines()[-1]
        .startswith(
            "error: --register_model: these credentials lack aiplatform.models.upload in project "
            "test-project"
        )
    ), output[-3000:]
    assert not re.search(r"^step \d+/2", output, re.M) and registry.uploads == []

    registry.deny()  # granted, but the upload is refused anyway (a quota, say)
    registry.refuse_uploads(403, "PERMISSION_DENIED", "aiplatform.models.upload denied")
    code, output = run_trainer(args, cwd=tmp_path, env=env, timeout=300)
    assert code == 1, output[-3000:]
    [line] = [line for line in output.splitlines() if line.startswith("error:")]
    assert line.startswith("error: registering the model in the Vertex AI Model Registry failed "
                           "(Forbidden"), line  # fmt: skip
    assert f"retry with: python -m trainer.register {base}/model --name sentiment " in line
    assert line.endswith(f"the trained model is saved at {base}/model/ (load it with "
                         "from_pretrained)"), line  # fmt: skip
    assert open_store(f"{base}/model").read_text("manifest.json"), "the model is not delivered"
    assert "step 2/2" in output
    [(_, refused)] = registry.uploads
    assert refused.model.artifact_uri == f"{base}/model"
    labels = dict(refused.model.labels)
    assert labels["task"] == "text-classification" and labels["metric"] == "accuracy"
    assert labels["image_tag"] == "abc1234" and float(labels["metric_value"].replace("_", "."))
    assert "base_model" not in labels  # a local path is no base checkpoint's name
    assert list(refused.model.version_aliases) == ["production", "default"]
    spec = refused.model.container_spec
    assert spec.deployment_timeout.total_seconds() == 1800
    probe = spec.startup_probe
    assert (probe.http_get.path, probe.failure_threshold) == ("/health", 180)
    assert "--version_alias production --deployment_timeout_s 1800" in line

    registry.refusal = None  # the permission granted; Vertex AI restarts the job
    code, output = run_trainer(args, cwd=tmp_path, env=env, timeout=300)
    assert code == 0, output[-3000:]
    assert "model delivered: an earlier attempt of this job" in output
    name = "projects/test-project/locations/us-central1/models/2000"
    assert f"registered: {name}@1 (a new model, version 1)" in output, output[-2000:]
    assert not re.search(r"^step \d+/2", output, re.M), "it trained again"

    code, output = run_trainer(args, cwd=tmp_path, env=env, timeout=300)
    assert code == 0, output[-3000:]
    assert f"already registered: {name}@1" in output, output[-2000:]
    assert len(registry.uploads) == 2 and registry.errors == []
    record = json.loads(open_store(base).read_text("model.registration.json"))
    assert [r["resource_name"] for r in record["registrations"]] == [name]
