"""`python -m trainer.register`, in-process, with the real Vertex AI SDK against a registry on
loopback (tests/support/vertex_capture.py, each request parsed into `aiplatform_v1` types) and a
tiny text classifier delivered to the Cloud Storage emulator as a run delivers it
(`publish_model`, manifest last): the label and name rules, a new model, a new version of a
model of the same name, a refusal that keeps the model and prints a retry command that works,
a second call that registers nothing, and bad input refused before any request."""

from __future__ import annotations

import json
import shlex
import uuid

import pytest
from google.cloud.aiplatform_v1.types import Probe

from tests.support.gcs_emulator import BUCKET
from tests.support.helpers import TEXT_COLUMNS, resolved
from tests.support.vertex_capture import VertexCapture
from trainer.common.errors import UserError
from trainer.register import main
from trainer.registry.labels import check_name_and_labels, check_version_aliases, label_value
from trainer.registry.registration import register as register_model
from trainer.registry.registration_request import Registration, image_tag
from trainer.registry.run_registration import run_registration
from trainer.registry.upload import VertexPlace
from trainer.storage.checkpoints import publish_model
from trainer.storage.store import open_store

IMAGE = "us-central1-docker.pkg.dev/test-project/vertex-trainer/vertex-hf-trainer-serve:ABC1234"


@pytest.fixture
def delivered(gcs, text_classifier) -> str:
    """The model delivered to a fresh gs:// folder, as trainer/training/delivery.py does."""
    uri = f"gs://{BUCKET}/{uuid.uuid4().hex}/model"
    publish_model(open_store(uri), text_classifier)
    return uri


@pytest.fixture
def registry():
    capture = VertexCapture()
    yield capture
    capture.close()


def record_of(model_uri: str) -> str | None:
    """The registration record beside the model (trainer/registry/registration_record.py)."""
    return open_store(model_uri.rpartition("/")[0]).read_text("model.registration.json")


def register(capsys, registry, model_uri, *flags: str) -> tuple[int, str, str]:
    argv = [model_uri, "--name", "sentiment", "--serving_image", IMAGE,
            "--project", "test-project", "--api_endpoint", registry.endpoint, *flags]  # fmt: skip
    try:
        main(argv)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def test_labels_are_made_to_fit_and_names_and_keys_are_checked():
    assert label_value("openai/whisper-small") == "openai_whisper-small"
    assert label_value("0.9375") == "0_9375"
    assert label_value("X" * 80) == "x" * 63
    labels = check_name_and_labels("whisper_demo-2", {"task": "A B", "metric": "eval_WER"})
    assert labels == {"task": "a_b", "metric": "eval_wer"}
    for name in ("whisper demo", "2fast", "dots.ok", "Модель «demo»", "a" * 128):
        assert check_name_and_labels(name, {}) == {}, "any UTF-8, up to 128 characters"
    for name in ("a" * 129, "", "   "):
        with pytest.raises(UserError, match="not a Vertex AI model name"):
            check_name_and_labels(name, {})
    for alias in ("production", "v2-candidate", "eN1"):
        check_version_aliases((alias,))
    for alias in ("a", "Prod", "2nd", "trailing-", "under_score", "x" * 129):
        with pytest.raises(UserError, match="is not a Vertex AI version alias"):
            check_version_aliases((alias,))
    with pytest.raises(UserError, match="each alias once"):
        check_version_aliases(("prod", "prod"))
    for key in ("Task", "1st", "k" * 64, "a.b"):
        with pytest.raises(UserError, match=f"label key '{key}' breaks"):
            check_name_and_labels("ok", {key: "v"})
    with pytest.raises(UserError, match="65 labels"):
        check_name_and_labels("ok", {f"k{i}": "v" for i in range(65)})
    assert image_tag(IMAGE) == "ABC1234"
    assert image_tag("localhost:5000/serve@sha256:0a1b") == "sha256:0a1b"
    assert image_tag("localhost:5000/serve") is None


def test_a_new_model_is_uploaded_with_the_serving_container(capsys, registry, delivered):
    model_files = open_store(delivered).list_files()
    code, out, err = register(capsys, registry, delivered, "--base_model",
                              "google-bert/bert-base-uncased", "--metric", "eval_accuracy=0.9375",
                              "--serving_env", "SERVE_MAX_BATCH_SIZE=16")  # fmt: skip
    assert (code, err, registry.errors) == (0, "", [])
    name = "projects/test-project/locations/us-central1/models/2000"
    assert out == f"registered: {name}@1 (a new model, version 1)\n"
    [(parent, request)] = registry.uploads
    assert parent == "projects/test-project/locations/us-central1"
    assert request.parent_model == ""
    model = request.model
    assert (model.display_name, model.artifact_uri) == ("sentiment", delivered)
    spec = model.container_spec
    assert spec.image_uri == IMAGE
    assert list(spec.command) == ["python", "-m", "trainer.serve"]
    assert [port.container_port for port in spec.ports] == [8080]
    assert (spec.predict_route, spec.health_route) == ("/predict", "/health")
    assert [(v.name, v.value) for v in spec.env] == [
        ("SERVE_GCS_READ_PREFIXES", f"gs://{BUCKET}/"), ("SERVE_MAX_BATCH_SIZE", "16")]  # fmt: skip
    assert dict(model.labels) == {
        "task": "text-classification", "base_model": "google-bert_bert-base-uncased",
        "metric": "eval_accuracy", "metric_value": "0_9375", "image_tag": "abc1234",
    }  # fmt: skip
    assert list(model.version_aliases) == ["default"]
    # HTTP GET on the health route; the startup probe outlasts any deployment timeout the API
    # allows (2 hours: 720 tries 10 s apart), the health probe takes 3 failures in a row
    http = Probe.HttpGetAction(path="/health", port=8080)
    assert spec.startup_probe == Probe(http_get=http, period_seconds=10, timeout_seconds=15,
                                       failure_threshold=720)  # fmt: skip
    assert spec.health_probe == Probe(http_get=http, period_seconds=10, timeout_seconds=15,
                                      failure_threshold=3)  # fmt: skip
    assert "deployment_timeout" not in spec and "liveness_probe" not in spec
    assert [r.split(" ")[0] for r in registry.requests] == ["GET", "POST", "GET"]
    assert json.loads(record_of(delivered))["registrations"] == [{
        "project": "test-project", "region": "us-central1", "name": "sentiment",
        "resource_name": name, "version_id": "1",
    }]  # fmt: skip
    assert open_store(delivered).list_files() == model_files  # the model folder as delivered


def test_an_existing_name_gets_a_new_version(capsys, registry, gcs, text_classifier, tmp_path):
    """A merged LoRA model names its base checkpoint in adapter/adapter_config.json."""
    existing = registry.add_model("sentiment")
    folder = tmp_path / "model"
    folder.mkdir()
    for path in text_classifier.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "adapter").mkdir()
    (folder / "adapter" / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": "Google-BERT/bert-base-uncased"})
    )
    uri = f"gs://{BUCKET}/{uuid.uuid4().hex}/model"
    publish_model(open_store(uri), folder)
    code, out, err = register(capsys, registry, uri)
    assert (code, err, registry.errors) == (0, "", [])
    assert out == f"registered: {existing}@2 (a new version of sentiment, version 2)\n"
    [(_, request)] = registry.uploads
    assert request.parent_model == existing
    assert dict(request.model.labels) == {
        "task": "text-classification", "image_tag": "abc1234",
        "base_model": "google-bert_bert-base-uncased",
    }  # fmt: skip


def test_a_utf8_name_aliases_and_a_deployment_timeout_reach_the_registry(
    capsys, registry, delivered, text_classifier
):
    """`whisper "demo"` as the API allows a display name (listed with the quote escaped, so
    a second upload finds it), two version aliases, a deployment timeout for a long load."""
    name = 'whisper "demo" – ünïcode'
    code, out, err = register(capsys, registry, delivered, "--name", name, "--version_alias",
                              "production", "--version_alias", "v1-candidate",
                              "--deployment_timeout_s", "3600")  # fmt: skip
    assert (code, err, registry.errors) == (0, "", [])
    [(_, request)] = registry.uploads
    assert request.model.display_name == name
    assert list(request.model.version_aliases) == ["production", "v1-candidate", "default"]
    spec = request.model.container_spec
    assert spec.deployment_timeout.total_seconds() == 3600
    # the startup probe gives the load the deployment's hour: 360 tries, 10 s apart
    assert (spec.startup_probe.period_seconds, spec.startup_probe.failure_threshold) == (10, 360)
    assert spec.startup_probe.http_get.path == "/health"
    again = f"gs://{BUCKET}/{uuid.uuid4().hex}/model"
    publish_model(open_store(again), text_classifier)
    assert register(capsys, registry, again, "--name", name)[1].startswith(
        "registered: projects/test-project/locations/us-central1/models/2000@2 (a new version"
    )


def test_invoke_routes_upload_the_model_with_every_route_behind_invoke(capsys, registry, delivered):
    """`--invoke_routes` sends invokeRoutePrefix `/*` (the body parsed strictly by the
    registry on loopback), so `invoke` reaches /v1/chat/completions; without it none is sent,
    and the retry command keeps it."""
    assert register(capsys, registry, delivered, "--name", "plain")[0] == 0
    code, out, err = register(capsys, registry, delivered, "--name", "routes", "--invoke_routes")
    assert (code, err, registry.errors) == (0, "", [])
    [plain, routes] = [request.model.container_spec for _, request in registry.uploads]
    assert (plain.invoke_route_prefix, routes.invoke_route_prefix) == ("", "/*")
    assert routes.predict_route == "/predict"  # what the server listens on stays named
    retry = Registration(delivered, "routes", IMAGE, VertexPlace("p", "us-central1"),
                         invoke_routes=True).retry_command()  # fmt: skip
    assert retry.endswith(" --invoke_routes")


def test_a_second_call_registers_nothing(capsys, registry, delivered):
    assert register(capsys, registry, delivered)[0] == 0
    sent = len(registry.requests)
    code, out, err = register(capsys, registry, delivered)
    name = "projects/test-project/locations/us-central1/models/2000"
    assert (code, err) == (0, "")
    assert out == f"already registered: {name}@1 (sentiment, version 1; nothing sent)\n"
    assert (len(registry.uploads), len(registry.requests)) == (1, sent)
    # another name is another registration
    assert register(capsys, registry, delivered, "--name", "sentiment-b")[0] == 0
    names = [request.model.display_name for _, request in registry.uploads]
    assert names == ["sentiment", "sentiment-b"]


@pytest.mark.parametrize(
    ("code", "status", "message"),
    [(403, "PERMISSION_DENIED", "Permission 'aiplatform.models.upload' denied"),
     (429, "RESOURCE_EXHAUSTED", "Quota exceeded for aiplatform.googleapis.com/model_uploads"),
     (400, "INVALID_ARGUMENT", "Display name is invalid")],
)  # fmt: skip
def test_a_refusal_keeps_the_model_and_says_how_to_retry(
    capsys, registry, delivered, code, status, message
):
    model_files = open_store(delivered).list_files()
    registry.refuse_uploads(code, status, message)
    exit_code, out, err = register(capsys, registry, delivered, "--metric", "eval_accuracy=0.9")
    assert (exit_code, out, registry.errors) == (1, "", [])
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"error: the model at {delivered} is kept; registering it failed: ")
    assert message in err
    assert open_store(delivered).list_files() == model_files
    assert record_of(delivered) is None
    # the printed command registers it once the registry accepts
    retry = shlex.split(err.split("; retry with: ")[1])
    assert retry[:4] == ["python", "-m", "trainer.register", delivered]
    registry.refusal = None
    main(retry[3:])
    assert capsys.readouterr().out.startswith("registered: ")
    assert dict(registry.uploads[-1][1].model.labels)["metric_value"] == "0_9"


@pytest.mark.parametrize(
    ("where", "flags", "expected"),
    [("local", [], "is not in Cloud Storage"),
     ("empty", [], "holds no delivered model: no manifest.json"),
     ("gs", ["--name", "m" * 129], "is not a Vertex AI model name"),
     ("gs", ["--version_alias", "Prod"], "'Prod' is not a Vertex AI version alias"),
     ("gs", ["--deployment_timeout_s", "9000"], "1 to 7200"),
     ("gs", ["--serving_image", "us-docker.pkg.dev/p/r/serve:1"], "multi-regional"),
     ("gs", ["--serving_image", "europe-west4-docker.pkg.dev/p/r/serve:1"],
      "is in europe-west4; the model is registered in us-central1"),
     ("gs", ["--serving_image", "gcr.io/p/serve:1"], "is not in Artifact Registry"),
     ("gs", ["--serving_env", "HF_TOKEN=x"], "--serving_env HF_TOKEN looks secret"),
     ("gs", ["--metric", "eval_wer"], "--metric 'eval_wer' is not KEY=VALUE")],
)  # fmt: skip
def test_bad_input_is_one_line_before_any_request(
    capsys, registry, delivered, text_classifier, where, flags, expected
):
    uri = {
        "local": str(text_classifier),
        "empty": f"gs://{BUCKET}/nothing/model",
        "gs": delivered,
    }
    code, out, err = register(capsys, registry, uri[where], *flags)
    assert (code, out) == (2, "")
    assert err.startswith("error: ") and err.count("\n") == 1 and expected in err
    assert registry.requests == []


def test_the_permission_to_register_is_asked_without_registering(registry, capsys):
    """Resource Manager's testIamPermissions (asked of the loopback registry, as the
    launcher's check asks it before anything trains): granted passes, a permission missing
    is one line naming it, no answer is a warning and the run goes on. Nothing is uploaded."""
    from trainer.registry.permission import check_register_permission
    from trainer.registry.upload import VertexPlace

    place = VertexPlace("test-project", "us-central1", registry.endpoint)
    check_register_permission(place)
    assert registry.requests == ["POST /v1/projects/test-project:testIamPermissions"]

    registry.deny("aiplatform.models.upload")
    with pytest.raises(UserError, match=r"lack aiplatform.models.upload in project test-project: "
                       r"grant the job's service account roles/aiplatform.user"):  # fmt: skip
        check_register_permission(place)

    check_register_permission(VertexPlace("test-project", "us-central1", "http://127.0.0.1:9"))
    assert "could not be asked (ConnectionError); the run goes on" in capsys.readouterr().err
    assert registry.uploads == []


def test_the_training_runs_registration_sends_its_aliases_and_deployment_timeout(
    registry, delivered, text_assets
):
    """`--register_model` with `--version_alias` (twice) and `--deployment_timeout_s`, as the
    chief registers after training (trainer/training/model_registration.py: the run's
    resolved flags into `run_registration`, then `register`): the upload body carries both,
    and the retry command a refusal prints names them."""
    model_dir, dataset_dir = text_assets
    config = resolved(["--task", "text-classification", "--model_name_or_path", model_dir,
                       "--dataset_name", dataset_dir, *TEXT_COLUMNS, "--model_dir", delivered,
                       "--register_model", "sentiment", "--serving_image", IMAGE,
                       "--registry_api_endpoint", registry.endpoint,
                       "--version_alias", "production", "--version_alias", "v2-candidate",
                       "--deployment_timeout_s", "5400"],
                      env={"GOOGLE_CLOUD_PROJECT": "test-project"})  # fmt: skip
    registration = run_registration(config, {"GOOGLE_CLOUD_PROJECT": "test-project"})
    retry = shlex.split(registration.retry_command())
    assert retry[retry.index("--deployment_timeout_s") + 1] == "5400"
    assert [retry[i + 1] for i, word in enumerate(retry) if word == "--version_alias"] == [
        "production", "v2-candidate"]  # fmt: skip
    register_model(registration)
    assert registry.errors == []
    [(_, request)] = registry.uploads
    assert list(request.model.version_aliases) == ["production", "v2-candidate", "default"]
    assert request.model.container_spec.deployment_timeout.total_seconds() == 5400
