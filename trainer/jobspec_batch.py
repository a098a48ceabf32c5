"""`python -m trainer.jobspec --batch_predict MODEL --input ... --output gs://...`: the
BatchPredictionJob request that runs a registered model (the serving image) over files in
Cloud Storage, written as its REST body with the command that submits it.

A batch prediction job is checked by Vertex AI only once its machines are provisioned; this
refuses a malformed model name, a non-gs:// input or output, a machine without the asked
accelerators or a batch size below 1 first, with one `error:` line and exit code 2.

The fields (REST names) are google.cloud.aiplatform.v1.BatchPredictionJob's, as its
reference and `aiplatform_v1.types.BatchPredictionJob` describe them:
- `model`: `projects/P/locations/L/models/ID`, optionally `@VERSION` (a version id or alias);
- `inputConfig.instancesFormat` with `gcsSource.uris` (wildcards allowed): `jsonl`, one
  instance per line, sent as `{"instances": [<line>, ...]}`; or `file-list`, a text file of
  gs:// URIs, each file sent as `{"b64": <its bytes in base64>}` (Vertex AI, "Get batch
  predictions from a custom trained model"), which trainer.serve takes as the task's media;
- `outputConfig.predictionsFormat` `jsonl` with `gcsDestination.outputUriPrefix`: Vertex AI
  writes `prediction-<model>-<time>/predictions_0001.jsonl, ...` there, and
  `errors_0001.jsonl, ...` for instances that failed;
- `dedicatedResources`: `machineSpec`, `startingReplicaCount`, `maxReplicaCount`
  (BatchDedicatedResources; Vertex AI's default maximum is 10);
- `manualBatchTuningParameters.batchSize`: instances per request to one replica (default 64).

No gcloud command creates one (gcloud 528's `ai`, `beta ai` and `alpha ai` groups have no
batch-prediction group), so the command printed is the REST call (docs/serving.md, "Batch
prediction", also gives the Python SDK's).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from trainer.command_line.parser import FlagParser
from trainer.common.errors import UserError
from trainer.common.flag_fields import flag
from trainer.preflight.vertex_machines import GPU_MACHINES, resolve_accelerator

REQUEST_FILE = "batch_prediction.json"

MODEL_SHAPE = r"projects/[^/@]+/locations/([^/@]+)/models/[^/@]+(@[A-Za-z0-9_-]+)?"
GCS_OBJECT_SHAPE = r"gs://[^/]+/\S+"
GCS_PREFIX_SHAPE = r"gs://[^/\s]+(/\S*)?"

INPUT_FORMATS = {".jsonl": "jsonl", ".txt": "file-list"}
"""An input file's ending -> its instancesFormat: JSON Lines, or a list of files."""


@dataclass
class BatchPredictionArguments:
    batch_predict: str | None = flag(
        None,
        "Write a batch prediction request for this registered model instead: "
        "projects/P/locations/L/models/ID[@VERSION] (gcloud ai models list).",
    )
    input: list[str] = flag(
        [],
        "gs:// files of instances (wildcards allowed): .jsonl, one instance per line, or "
        ".txt, one gs:// media file per line (each sent as {'b64': ...}).",
    )
    input_format: str | None = flag(
        None, "jsonl or file-list (default: from --input's ending, .jsonl or .txt)."
    )
    output: str | None = flag(
        None, "gs:// prefix the predictions_*.jsonl and errors_*.jsonl go under."
    )
    display_name: str = flag("batch-prediction", "The job's name in the console.")
    machine_type: str = flag(
        "g2-standard-12", "Vertex machine type of each replica (the server uses one GPU)."
    )
    accelerator_type: str | None = flag(None, "GPU type (default: the machine type's own).")
    accelerator_count: int | None = flag(
        None, "GPUs per replica (default: the fewest the machine type offers)."
    )
    starting_replica_count: int = flag(1, "Replicas the job starts with.")
    max_replica_count: int = flag(1, "Replicas Vertex AI may scale the job to.")
    batch_size: int = flag(
        8,
        "Instances per request to a replica (manualBatchTuningParameters.batchSize): the "
        "server's --max_batch_size, one forward pass; the request must stay under its "
        "--max_request_bytes (10 MiB).",
    )


def requested(argv: list[str]) -> bool:
    """Whether this command line asks for a batch prediction request, not a training job."""
    return any(item.split("=", 1)[0] == "--batch_predict" for item in argv)


def parser() -> FlagParser:
    return FlagParser(
        [BatchPredictionArguments],
        prog="python -m trainer.jobspec",
        description=f"Batch prediction: write {REQUEST_FILE} (a BatchPredictionJob) instead.",
    )


def parse_arguments(argv: list[str]) -> BatchPredictionArguments:
    namespace, unknown = parser().parse_known_args(argv)
    if unknown:
        raise UserError(
            f"{unknown[0]} is not a batch prediction flag (see python -m trainer.jobspec --help)."
        )
    return BatchPredictionArguments(**vars(namespace))


def instances_format(options: BatchPredictionArguments) -> str:
    """--input_format, or the one every --input's ending names."""
    if options.input_format is not None:
        if options.input_format not in INPUT_FORMATS.values():
            raise UserError(
                f"--input_format must be jsonl or file-list, got {options.input_format!r}."
            )
        return options.input_format
    formats = {INPUT_FORMATS.get(Path(uri).suffix) for uri in options.input}
    if len(formats) != 1 or None in formats:
        raise UserError(
            "--input's format cannot be told from its endings (.jsonl: jsonl, .txt: "
            "file-list, one format for all): give --input_format jsonl or file-list."
        )
    return formats.pop()


def check_locations(options: BatchPredictionArguments) -> None:
    """The model's resource name, and gs:// input files and output prefix."""
    if not re.fullmatch(MODEL_SHAPE, options.batch_predict or ""):
        raise UserError(
            f"--batch_predict {options.batch_predict!r} is not of the form "
            "projects/P/locations/L/models/ID[@VERSION]."
        )
    if not options.input:
        raise UserError("--input is missing: the gs:// files of instances to predict.")
    for uri in options.input:
        if not re.fullmatch(GCS_OBJECT_SHAPE, uri):
            raise UserError(f"--input {uri!r} is not a gs://BUCKET/OBJECT URI.")
    if options.output is None:
        raise UserError("--output is missing: the gs:// prefix the predictions go under.")
    if not re.fullmatch(GCS_PREFIX_SHAPE, options.output):
        raise UserError(f"--output {options.output!r} is not a gs://BUCKET[/PREFIX] URI.")


def check_replicas(options: BatchPredictionArguments) -> None:
    if options.starting_replica_count < 1:
        raise UserError("--starting_replica_count must be at least 1.")
    if options.max_replica_count < options.starting_replica_count:
        raise UserError(
            f"--max_replica_count ({options.max_replica_count}) must be at least "
            f"--starting_replica_count ({options.starting_replica_count})."
        )
    if options.batch_size < 1:
        raise UserError(f"--batch_size must be at least 1, got {options.batch_size}.")


def batch_prediction_job(options: BatchPredictionArguments) -> dict:
    """The BatchPredictionJob's REST body, once the flags are checked (UserError if not)."""
    check_locations(options)
    check_replicas(options)
    formats = instances_format(options)
    gpu, count = resolve_accelerator(
        options.machine_type, options.accelerator_type, options.accelerator_count
    )
    if options.accelerator_count is None:  # the server runs on one GPU: the fewest offered
        count = min(GPU_MACHINES[options.machine_type][1])
    return {
        "displayName": options.display_name,
        "model": options.batch_predict,
        "inputConfig": {"instancesFormat": formats, "gcsSource": {"uris": options.input}},
        "outputConfig": {
            "predictionsFormat": "jsonl",
            "gcsDestination": {"outputUriPrefix": options.output},
        },
        "dedicatedResources": {
            "machineSpec": {
                "machineType": options.machine_type,
                "acceleratorType": gpu,
                "acceleratorCount": count,
            },
            "startingReplicaCount": options.starting_replica_count,
            "maxReplicaCount": options.max_replica_count,
        },
        "manualBatchTuningParameters": {"batchSize": options.batch_size},
    }


def submit_command(model: str, request: Path) -> str:
    """The REST call creating the job in the model's project and region."""
    project, region = re.fullmatch(r"projects/([^/]+)/locations/([^/]+)/.*", model).groups()
    url = (
        f"https://{region}-aiplatform.googleapis.com/v1/projects/{project}/locations/{region}"
        "/batchPredictionJobs"
    )
    return (
        'curl -X POST -H "Authorization: Bearer $(gcloud auth print-access-token)" '
        f'-H "Content-Type: application/json" {url} -d @{shlex.quote(str(request))}'
    )


def render(argv: list[str], dest: Path) -> tuple[dict[str, str], str]:
    """File name -> content (the request as JSON), and the command that submits it from
    `dest`."""
    options = parse_arguments(argv)
    job = batch_prediction_job(options)
    files = {REQUEST_FILE: json.dumps(job, indent=2) + "\n"}
    return files, submit_command(job["model"], dest / REQUEST_FILE)
