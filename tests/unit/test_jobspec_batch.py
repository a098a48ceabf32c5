"""`python -m trainer.jobspec --batch_predict MODEL`, in-process: batch_prediction.json parses
strictly into Vertex AI's BatchPredictionJob with the flags' values, the printed command
submits it to the model's region, and bad input is one `error:` line, exit 2, nothing written.
The serving image answering both input formats: tests/unit/test_serve.py."""

from __future__ import annotations

import dataclasses
import json

import pytest
from google.cloud.aiplatform_v1.types import BatchPredictionJob
from google.protobuf import json_format

from tests.support.helpers import jobspec_refusal
from trainer.jobspec import __main__ as jobspec
from trainer.jobspec.batch import BatchPredictionArguments

MODEL = "projects/my-project/locations/europe-west4/models/1234@2"


def written(tmp_path, capsys, *argv: str) -> tuple[dict, str]:
    """The request written to `tmp_path` (as JSON) and what was printed."""
    jobspec.main(["--batch_predict", MODEL, "--output", "gs://bucket/predictions", *argv,
                  "--dest", str(tmp_path)])  # fmt: skip
    return json.loads((tmp_path / "batch_prediction.json").read_text()), capsys.readouterr().out


def test_the_request_is_a_batch_prediction_job_with_the_flags_values(tmp_path, capsys):
    body, out = written(tmp_path, capsys, "--input", "gs://bucket/in/a.jsonl",
                        "gs://bucket/in/b-*.jsonl", "--machine_type", "n1-standard-16",
                        "--starting_replica_count", "2", "--max_replica_count", "5",
                        "--batch_size", "16", "--display_name", "whisper-nightly")  # fmt: skip
    job = BatchPredictionJob.from_json(json.dumps(body), ignore_unknown_fields=False)
    assert job.display_name == "whisper-nightly" and job.model == MODEL
    assert job.input_config.instances_format == "jsonl"
    assert list(job.input_config.gcs_source.uris) == [
        "gs://bucket/in/a.jsonl", "gs://bucket/in/b-*.jsonl"]  # fmt: skip
    assert job.output_config.predictions_format == "jsonl"
    assert job.output_config.gcs_destination.output_uri_prefix == "gs://bucket/predictions"
    resources = job.dedicated_resources
    assert resources.machine_spec.machine_type == "n1-standard-16"
    assert resources.machine_spec.accelerator_type.name == "NVIDIA_TESLA_T4"
    assert resources.machine_spec.accelerator_count == 1, "the server uses one GPU"
    assert (resources.starting_replica_count, resources.max_replica_count) == (2, 5)
    assert job.manual_batch_tuning_parameters.batch_size == 16
    request = tmp_path / "batch_prediction.json"
    assert out.splitlines() == [
        f"wrote {request}",
        'submit it: curl -X POST -H "Authorization: Bearer $(gcloud auth print-access-token)" '
        '-H "Content-Type: application/json" https://europe-west4-aiplatform.googleapis.com'
        f"/v1/projects/my-project/locations/europe-west4/batchPredictionJobs -d @{request}",
    ]


def test_a_list_of_files_is_a_file_list_input_by_its_ending_or_by_the_flag(tmp_path, capsys):
    by_ending, _ = written(tmp_path, capsys, "--input", "gs://bucket/clips.txt")
    by_flag, _ = written(tmp_path, capsys, "--input", "gs://bucket/clips",
                         "--input_format", "file-list")  # fmt: skip
    for body in (by_ending, by_flag):
        job = BatchPredictionJob.from_json(json.dumps(body), ignore_unknown_fields=False)
        assert job.input_config.instances_format == "file-list"
        machine = job.dedicated_resources.machine_spec
        assert (machine.machine_type, machine.accelerator_type.name, machine.accelerator_count) == (
            "g2-standard-12", "NVIDIA_L4", 1)  # fmt: skip
        assert job.manual_batch_tuning_parameters.batch_size == 8


def test_instance_config_model_parameters_and_service_account_parse_into_the_job(tmp_path, capsys):
    body, _ = written(tmp_path, capsys, "--input", "gs://bucket/in.jsonl", "--key_field", "key",
                      "--excluded_fields", "note", "source", "--instance_type", "object",
                      "--model_parameters", '{"language": "en", "return_timestamps": true}',
                      "--service_account", "batch-runner@my-project.iam.gserviceaccount.com",
                      "--starting_replica_count", "3")  # fmt: skip
    job = BatchPredictionJob.from_json(json.dumps(body), ignore_unknown_fields=False)
    config = job.instance_config
    assert (config.key_field, list(config.excluded_fields), config.instance_type) == (
        "key", ["note", "source"], "object")  # fmt: skip
    assert list(config.included_fields) == []
    assert dict(job.model_parameters) == {"language": "en", "return_timestamps": True}
    assert job.service_account == "batch-runner@my-project.iam.gserviceaccount.com"
    resources = job.dedicated_resources
    assert (resources.starting_replica_count, resources.max_replica_count) == (3, 3)
    included, _ = written(tmp_path, capsys, "--input", "gs://bucket/in.jsonl",
                          "--included_fields", "text", "text_pair")  # fmt: skip
    job = BatchPredictionJob.from_json(json.dumps(included), ignore_unknown_fields=False)
    assert list(job.instance_config.included_fields) == ["text", "text_pair"]
    plain, _ = written(tmp_path, capsys, "--input", "gs://bucket/in.jsonl")
    assert not {"instanceConfig", "modelParameters", "serviceAccount"} & set(plain)


def test_a_misspelled_field_would_be_caught(tmp_path, capsys):
    body, _ = written(tmp_path, capsys, "--input", "gs://bucket/in.jsonl")
    body["manualBatchTuningParameters"] = {"batchSise": 8}
    with pytest.raises(json_format.ParseError, match="batchSise"):
        BatchPredictionJob.from_json(json.dumps(body), ignore_unknown_fields=False)


GOOD = ["--input", "gs://bucket/in.jsonl", "--output", "gs://bucket/out"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--batch_predict", "models/1234", *GOOD], "projects/P/locations/L/models/ID"),
        (["--batch_predict", MODEL + "/extra", *GOOD], "is not of the form"),
        (["--batch_predict", MODEL, "--output", "gs://bucket/out"], "--input is missing"),
        (["--batch_predict", MODEL, *GOOD[2:], "--input", "/data/in.jsonl"], "gs://BUCKET/OBJECT"),
        (["--batch_predict", MODEL, *GOOD[:2], "--output", "/tmp/out"], "gs://BUCKET[/PREFIX]"),
        (["--batch_predict", MODEL, *GOOD[:2]], "--output is missing"),
        (["--batch_predict", MODEL, "--input", "gs://b/a.csv", *GOOD[2:]], "--input_format"),
        (["--batch_predict", MODEL, *GOOD, "--input_format", "csv"], "jsonl or file-list"),
        (["--batch_predict", MODEL, *GOOD, "--machine_type", "e2-standard-4"], "GPU machine"),
        (["--batch_predict", MODEL, *GOOD, "--accelerator_type", "NVIDIA_TESLA_T4"], "not NVIDIA"),
        (["--batch_predict", MODEL, *GOOD, "--accelerator_count", "3"], "not --accelerator_count"),
        (["--batch_predict", MODEL, *GOOD, "--batch_size", "0"], "--batch_size must be at least"),
        (["--batch_predict", MODEL, *GOOD, "--max_replica_count", "0"], "--max_replica_count"),
        (["--batch_predict", MODEL, *GOOD, "--nodes", "2"], "--nodes is not a batch prediction"),
        (
            [
                "--batch_predict",
                MODEL,
                "--input",
                "gs://b/clips.txt",
                GOOD[2],
                GOOD[3],
                "--key_field",
                "key",
            ],
            "--key_field apply to a jsonl input only",
        ),
        (
            ["--batch_predict", MODEL, *GOOD, "--included_fields", "a", "--excluded_fields", "b"],
            "give one",
        ),
        (["--batch_predict", MODEL, *GOOD, "--instance_type", "list"], "object or array"),
        (["--batch_predict", MODEL, *GOOD, "--model_parameters", "[1]"], "a JSON object"),
        (["--batch_predict", MODEL, *GOOD, "--model_parameters", "{top_k: 1}"], "a JSON object"),
        (
            ["--batch_predict", MODEL, *GOOD, "--service_account", "me@example.com"],
            "not a service account's email",
        ),
    ],
)
def test_bad_input_is_one_error_line_and_nothing_written(tmp_path, capsys, argv, says):
    assert says in jobspec_refusal(argv, tmp_path, capsys)


def test_help_lists_every_batch_prediction_flag(capsys):
    jobspec.main(["--help"])
    text = capsys.readouterr().out
    batch = text[text.index("Batch prediction: write batch_prediction.json") :]
    flags = [f"--{field.name}" for field in dataclasses.fields(BatchPredictionArguments)]
    assert [name for name in flags if f"  {name} " not in batch] == []
