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
- `instanceConfig` (jsonl input only): `keyField` (sent to no model, written as the output
  line's `key` in place of the instance), `includedFields` or `excludedFields`,
  `instanceType` (`object` or `array`);
- `modelParameters`: the `parameters` of every request (a Whisper `language`, `top_k`);
- `serviceAccount`: the job's identity, which reads the input and the `gs://` objects the
  instances name (the default one may not: docs/serving.md);
- `dedicatedResources`: `machineSpec`, `startingReplicaCount`, `maxReplicaCount`
  (BatchDedicatedResources). The pages disagree on the maximum: "Get batch predictions from
  a custom trained model" has the job use the starting count and ignore the maximum, the
  REST reference and the SDK's docstring call it the count Vertex AI may scale to (default
  10). The service page is followed: `--starting_replica_count` is the number of replicas,
  and the maximum is written equal to it unless `--max_replica_count` is given;
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
    starting_replica_count: int = flag(
        1, "Replicas the job runs on (startingReplicaCount; the batch page: the count used)."
    )
    max_replica_count: int | None = flag(
        None,
        "maxReplicaCount (default: --starting_replica_count). The batch page says a job "
        "ignores it; the REST reference and the SDK's docstring say it may scale to it.",
    )
    key_field: str | None = flag(
        None,
        "jsonl: the field of each line that is its key (instanceConfig.keyField): not sent "
        "to the model, written as the output line's key in place of the instance.",
    )
    included_fields: list[str] = flag(
        [], "jsonl: send only these fields of each line (instanceConfig.includedFields).",
        nargs="+",
    )  # fmt: skip
    excluded_fields: list[str] = flag(
        [], "jsonl: send each line without these fields (instanceConfig.excludedFields).",
        nargs="+",
    )  # fmt: skip
    instance_type: str | None = flag(
        None, "jsonl: object or array (instanceConfig.instanceType; default: each line's own)."
    )
    model_parameters: str | None = flag(
        None,
        "A JSON object sent as every request's parameters (modelParameters), e.g. "
        '\'{"language": "en"}\' or \'{"top_k": 1}\'.',
    )
    service_account: str | None = flag(
        None,
        "The job's service account (serviceAccount): it reads --input and any gs:// object "
        "an instance names; Vertex AI's default account may not.",
    )
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
    if options.max_replica_count is not None and (
        options.max_replica_count < options.starting_replica_count
    ):
        raise UserError(
            f"--max_replica_count ({options.max_replica_count}) must be at least "
            f"--starting_replica_count ({options.starting_replica_count})."
        )
    if options.batch_size < 1:
        raise UserError(f"--batch_size must be at least 1, got {options.batch_size}.")


INSTANCE_TYPES = ("object", "array")
SERVICE_ACCOUNT_SHAPE = r"[a-z][a-z0-9-]{4,61}[a-z0-9]@[a-z0-9.-]+\.gserviceaccount\.com"
"""A service account's email (user-made: NAME@PROJECT.iam...; Google's: ...@developer...)."""


def instance_config(options: BatchPredictionArguments, formats: str) -> dict:
    """`instanceConfig` from the flags (empty without them), or UserError."""
    config = {"instanceType": options.instance_type, "keyField": options.key_field,
              "includedFields": options.included_fields or None,
              "excludedFields": options.excluded_fields or None}  # fmt: skip
    config = {name: value for name, value in config.items() if value is not None}
    check_instance_flags(options, config, formats)
    return config


def check_instance_flags(options: BatchPredictionArguments, config: dict, formats: str) -> None:
    """UserError for instance flags Vertex AI would refuse: with a file-list, both field
    lists, an unknown instance type."""
    if config and formats != "jsonl":
        given = "/--".join(sorted(FIELD_FLAGS[name] for name in config))
        raise UserError(f"--{given} apply to a jsonl input only: a file-list's files are "
                        "sent as {'b64': ...}.")  # fmt: skip
    if options.included_fields and options.excluded_fields:
        raise UserError("--included_fields and --excluded_fields: give one (Vertex AI takes "
                        "one of them).")  # fmt: skip
    if options.instance_type not in (None, *INSTANCE_TYPES):
        raise UserError(f"--instance_type must be object or array, got {options.instance_type!r}.")


FIELD_FLAGS = {
    "instanceType": "instance_type",
    "keyField": "key_field",
    "includedFields": "included_fields",
    "excludedFields": "excluded_fields",
}


def model_parameters(text: str | None) -> dict | None:
    """--model_parameters as a JSON object, or UserError."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise UserError(f"--model_parameters must be a JSON object, e.g. '{{\"top_k\": 1}}', "
                        f"got {text!r}.")  # fmt: skip
    return value


def identity(options: BatchPredictionArguments, formats: str) -> dict:
    """The job's fields beyond its input, output and machines: instanceConfig,
    modelParameters and serviceAccount, each only when given."""
    fields = {"instanceConfig": instance_config(options, formats) or None,
              "modelParameters": model_parameters(options.model_parameters),
              "serviceAccount": options.service_account}  # fmt: skip
    account = options.service_account
    if account is not None and not re.fullmatch(SERVICE_ACCOUNT_SHAPE, account):
        raise UserError(f"--service_account {account!r} is not a service account's email "
                        "(NAME@PROJECT.iam.gserviceaccount.com).")  # fmt: skip
    return {name: value for name, value in fields.items() if value is not None}


def batch_prediction_job(options: BatchPredictionArguments) -> dict:
    """The BatchPredictionJob's REST body, once the flags are checked (UserError if not)."""
    check_locations(options)
    check_replicas(options)
    formats = instances_format(options)
    extra = identity(options, formats)
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
            "maxReplicaCount": options.max_replica_count or options.starting_replica_count,
        },
        "manualBatchTuningParameters": {"batchSize": options.batch_size},
        **extra,
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
