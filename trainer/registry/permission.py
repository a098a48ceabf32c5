"""Whether the job's credentials may register a model, asked before anything trains: Vertex
AI's model upload has no dry run, but Cloud Resource Manager's `projects.testIamPermissions`
answers which of the permissions asked the caller holds on a project, changing nothing and
needing no permission itself
(https://cloud.google.com/resource-manager/reference/rest/v1/projects/testIamPermissions).

Asked by the chief's launcher, with the credentials the job will register with (a job
spec's check runs with the submitter's, which prove nothing about the job's service
account). A missing permission is one line before launch; a question that gets no answer
proves nothing either way, so it is a `warning:` and the run goes on.

With `--registry_api_endpoint` on this machine's loopback (the tests' registry), the
question goes to that address, without credentials, as the registration itself does.
"""

from __future__ import annotations

import sys

from trainer.common.errors import UserError
from trainer.registry.upload import VertexPlace

NEEDED = ("aiplatform.models.upload", "aiplatform.models.list")
"""What `register()` does: list the models of its display name, upload one."""
RESOURCE_MANAGER = "https://cloudresourcemanager.googleapis.com"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
TIMEOUT_SECONDS = 30


def check_register_permission(place: VertexPlace) -> None:
    """UserError when the credentials lack a permission the registration needs in
    `place.project`; a `warning:` line when the question gets no answer."""
    import requests
    from google.auth.exceptions import GoogleAuthError

    try:
        granted = granted_permissions(place)
    except GoogleAuthError as error:
        raise UserError(
            f"--register_model: no credentials to register the model with ({error}): run "
            "gcloud auth application-default login, or leave --register_model out"
        ) from None
    except (requests.RequestException, ValueError) as error:
        print(f"warning: --register_model: whether these credentials may register a model in "
              f"{place.project} could not be asked ({type(error).__name__}); the run goes "
              "on", file=sys.stderr, flush=True)  # fmt: skip
        return
    missing = [permission for permission in NEEDED if permission not in granted]
    if missing:
        raise UserError(
            f"--register_model: these credentials lack {' and '.join(missing)} in project "
            f"{place.project}: grant the job's service account roles/aiplatform.user there "
            "(or leave --register_model out); nothing was trained"
        )


def granted_permissions(place: VertexPlace) -> list[str]:
    """Which of NEEDED the caller holds in the project, as Resource Manager answers."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.auth.transport.requests import AuthorizedSession

    if place.on_loopback:
        endpoint = (
            place.api_endpoint if "://" in place.api_endpoint else f"http://{place.api_endpoint}"
        )
        credentials = AnonymousCredentials()
    else:
        endpoint, (credentials, _) = RESOURCE_MANAGER, google.auth.default(scopes=[SCOPE])
    response = AuthorizedSession(credentials).post(
        f"{endpoint}/v1/projects/{place.project}:testIamPermissions",
        json={"permissions": list(NEEDED)},
        timeout=TIMEOUT_SECONDS,
    )
    response.raise_for_status()
    return response.json().get("permissions", [])
