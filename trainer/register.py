"""`python -m trainer.register MODEL_URI --name NAME --serving_image IMAGE`: register a model
a run delivered in the Vertex AI Model Registry (docs/serving.md, "Registering the model").

A new model, or, when a model of that display name exists, a new version of it (made the
default); a model registered before under that name is not registered twice. Prints
`registered: projects/P/locations/R/models/ID@VERSION ...`. Bad input is one `error:` line
and exit 2 before any request; a registry or storage that refuses or does not answer is one
`error:` line saying the model is kept, with the command to retry, and exit 1.

The serving image must be named: the package does not know the commit it was built from,
so it cannot name cloudbuild.yaml's `IMAGE-serve:COMMIT` push by itself.
"""

from __future__ import annotations

import argparse
import os

from trainer.common.errors import UserError, exit_with_error
from trainer.registry.registration_request import Registration, check_before_requests
from trainer.registry.run_registration import DEFAULT_REGION, project_of, region_of
from trainer.registry.upload import VertexPlace


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer.register",
        description="Register a delivered model in the Vertex AI Model Registry (a new "
        "version when NAME exists).",
    )
    p.add_argument("model_uri", metavar="MODEL_URI", help="the delivered model's gs:// folder")
    p.add_argument("--name", required=True, help="the model's display name in the registry")
    p.add_argument("--serving_image", required=True,
                   help="the serving image, pinned: REGION-docker.pkg.dev/PROJECT/REPO/"
                        "vertex-hf-trainer-serve:COMMIT (cloudbuild.yaml)")  # fmt: skip
    p.add_argument("--project", help="default: $GOOGLE_CLOUD_PROJECT, else $CLOUD_ML_PROJECT_ID")
    p.add_argument("--region", help=f"default: $CLOUD_ML_REGION, else {DEFAULT_REGION}")
    p.add_argument("--base_model", help="the base checkpoint, for its label (a merged LoRA "
                   "model names its own)")  # fmt: skip
    p.add_argument("--metric", metavar="NAME=VALUE",
                   help="the final metric and its value, for their labels")  # fmt: skip
    p.add_argument("--serving_env", metavar="KEY=VALUE", action="append", default=[],
                   help="a serving container variable (repeatable)")  # fmt: skip
    p.add_argument("--version_alias", action="append", default=[],
                   help="a version alias (repeatable): [a-z][a-zA-Z0-9-]{0,126}[a-z0-9], "
                        "e.g. production")  # fmt: skip
    p.add_argument("--deployment_timeout_s", type=int,
                   help="how long a deployment may wait for the model to load and health "
                        "to say ready (deploymentTimeout, up to 7200; default: Vertex "
                        "AI's)")  # fmt: skip
    p.add_argument("--invoke_routes", action="store_true",
                   help="serve every route through invoke on a dedicated endpoint (the "
                        "/v1/ OpenAI routes; invokeRoutePrefix /*): :predict and "
                        ":rawPredict are then refused")  # fmt: skip
    p.add_argument("--api_endpoint",
                   help="the Vertex AI API's address (a private endpoint; tests: a loopback "
                        "server, spoken to without credentials)")  # fmt: skip
    return p


def key_value(flag: str, text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not key or not equals or not value:
        raise UserError(f"{flag} {text!r} is not KEY=VALUE")
    return key, value


def registration_of(args: argparse.Namespace, env) -> Registration:
    """The Registration the flags ask for, checked as far as it can be without a request, or
    UserError."""
    project = project_of(args.project, env)
    if not project:
        raise UserError("no project: pass --project or set GOOGLE_CLOUD_PROJECT")
    region = region_of(args.region, env)
    registration = Registration(
        model_uri=args.model_uri,
        name=args.name,
        serving_image=args.serving_image,
        place=VertexPlace(project, region, args.api_endpoint),
        base_model=args.base_model,
        metric=key_value("--metric", args.metric) if args.metric else None,
        serving_env=dict(key_value("--serving_env", item) for item in args.serving_env),
        version_aliases=tuple(args.version_alias),
        deployment_timeout_s=args.deployment_timeout_s,
        invoke_routes=args.invoke_routes,
    )
    check_before_requests(registration)
    return registration


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        registration = registration_of(args, os.environ)
    except UserError as error:
        exit_with_error(str(error), 2)
    # the SDK, transformers and torch load here, once the command line is known good
    from trainer.registry.registration import RegistrationFailed, register

    try:
        done = register(registration)
    except UserError as error:  # what the model's folder says: incomplete, or no task
        exit_with_error(str(error), 2)
    except RegistrationFailed as failure:
        exit_with_error(f"the model at {registration.model_uri} is kept; registering it failed: "
               f"{failure}; retry with: {registration.retry_command()}", 1)  # fmt: skip
    print(done.line(args.name), flush=True)


if __name__ == "__main__":
    main()
