"""`--register_model NAME`: the Registration a training run asks for, built from its resolved
settings and the node's environment. The same function builds it for the check at launch
(every way in: the launcher, `trainer.ray`, `trainer.jobspec` before it writes the job), for
the training chief once the model is delivered, and for a restart that finds the model
delivered (it registers what an earlier attempt could not; `register()` never registers a
model twice).

Where: `--registry_project`, else the project gcloud and the client libraries name
($GOOGLE_CLOUD_PROJECT), else the one Vertex AI sets in its jobs ($CLOUD_ML_PROJECT_ID);
`--registry_region`, else the job's ($CLOUD_ML_REGION), else us-central1.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainer.common.errors import UserError
from trainer.registry.registration_request import Registration, check_before_requests
from trainer.registry.upload import VertexPlace
from trainer.settings.run_config import RunConfig
from trainer.storage.run_records import RunAlreadyEnded

DEFAULT_REGION = "us-central1"
PROJECT_VARIABLES = ("GOOGLE_CLOUD_PROJECT", "CLOUD_ML_PROJECT_ID")
UNKNOWN_PROJECT = "PROJECT"
"""What a job spec's check names the project, which only the job's environment will say."""


def project_of(flag: str | None, env: Mapping[str, str]) -> str | None:
    return flag or next((env[name] for name in PROJECT_VARIABLES if env.get(name)), None)


def region_of(flag: str | None, env: Mapping[str, str]) -> str:
    return flag or env.get("CLOUD_ML_REGION") or DEFAULT_REGION


def hub_id(model: str) -> str | None:
    """The base checkpoint's label: a Hub id, not a path on this machine or a bucket's."""
    return None if model.startswith(("/", ".", "~", "gs://")) else model


def run_registration(
    config: RunConfig,
    env: Mapping[str, str],
    metric: tuple[str, str] | None = None,
    on_node: bool = True,
) -> Registration | None:
    """The Registration `config` asks for (None without --register_model), checked as far as
    it can be without a request; UserError otherwise. Off a node (a job spec's check) the
    project may still be unknown."""
    outputs = config.outputs
    if not outputs.register_model:
        return None
    if not outputs.serving_image:
        raise UserError(
            "--register_model needs --serving_image: the serving image the registry entry "
            "runs, pinned (IMAGE-serve:COMMIT, pushed by cloudbuild.yaml beside the training "
            "image; python -m trainer.jobspec names it from --image)"
        )
    project = project_of(outputs.registry_project, env)
    if project is None and on_node:
        raise UserError(
            "--register_model: no project to register in: pass --registry_project or set "
            "GOOGLE_CLOUD_PROJECT (Vertex AI sets CLOUD_ML_PROJECT_ID in its jobs)"
        )
    registration = Registration(
        model_uri=config.locations.model.rstrip("/"),
        name=outputs.register_model,
        serving_image=outputs.serving_image,
        place=VertexPlace(
            project or UNKNOWN_PROJECT,
            region_of(outputs.registry_region, env),
            outputs.registry_api_endpoint,
        ),
        base_model=hub_id(config.model.model_name_or_path),
        metric=metric,
        version_aliases=tuple(outputs.version_alias),
        deployment_timeout_s=outputs.deployment_timeout_s,
    )
    region_known = on_node or bool(outputs.registry_region or env.get("CLOUD_ML_REGION"))
    try:
        check_before_requests(registration, region_known)
    except UserError as error:
        raise UserError(f"--register_model {outputs.register_model}: {error}") from None
    return registration


def registered_on_restart(
    ended: RunAlreadyEnded, config: RunConfig, env: Mapping[str, str]
) -> RunAlreadyEnded:
    """A restart that finds the model delivered (exit 0) registers it, when the run asks: the
    attempt that delivered it may have been refused by the registry, and `register()` sends
    nothing for a model registered before. The chief alone; the line grows by the outcome."""
    if ended.exit_code != 0 or config.topology.node_rank != 0:
        return ended
    registration = run_registration(config, env)
    if registration is None:
        return ended
    from trainer.registry.registration import RegistrationFailed, register

    try:
        done = register(registration)
    except RegistrationFailed as failure:
        return RunAlreadyEnded(
            f"{ended.line}\nerror: registering it in the Vertex AI Model Registry failed "
            f"({failure}); retry with: {registration.retry_command()}",
            1,
        )
    return RunAlreadyEnded(f"{ended.line}\n{done.line(registration.name)}", 0)
