"""`--secret NAME=projects/P/secrets/S/versions/V`: read each secret version once per node, at
start-up, before any training process exists, for the training processes' environment.

A job spec is readable by everyone who can list the project's jobs, so it holds references
only; the values come from Secret Manager with the job's service account (application default
credentials: on Vertex AI the job's `serviceAccount`, docs/deploy.md). A secret that cannot be
read is one `error:` line naming its resource, never a value. `SECRET_MANAGER_EMULATOR_HOST`
(`http://127.0.0.1:PORT`) points the client at a local server with anonymous credentials, as
`STORAGE_EMULATOR_HOST` does for Cloud Storage: the tests' fake (tests/secret_manager_fake.py)
answers the REST call the real client makes.
"""

from __future__ import annotations

from collections.abc import Mapping

from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import secretmanager

from trainer.common.errors import UserError
from trainer.common.secrets import parse_references

EMULATOR_VARIABLE = "SECRET_MANAGER_EMULATOR_HOST"

ACCESS_TIMEOUT_SECONDS = 60.0

NO_CREDENTIALS = (
    "no credentials: on Vertex AI give the job a serviceAccount; locally run gcloud auth "
    "application-default login"
)


def resolve_secrets(items: list[str], env: Mapping[str, str]) -> dict[str, str]:
    """`--secret` values -> {variable name: the secret's value}; UserError if one cannot be
    read. Nothing is asked when there are none (no client, no credentials needed)."""
    references = parse_references(items)
    if not references:
        return {}
    client = _client(env)
    return {name: _access(client, resource) for name, resource in references.items()}


def _client(env: Mapping[str, str]) -> secretmanager.SecretManagerServiceClient:
    """The Secret Manager client over REST: the REST transport accepts an endpoint with an
    `http://` scheme (transports/rest_base.py matches `^(?P<scheme>http(?:s)?://)?` and keeps
    it), which the emulator variable needs; gRPC would not reach a plain HTTP server."""
    endpoint = env.get(EMULATOR_VARIABLE)
    try:
        if endpoint:
            return secretmanager.SecretManagerServiceClient(
                credentials=AnonymousCredentials(),
                transport="rest",
                client_options={"api_endpoint": endpoint},
            )
        return secretmanager.SecretManagerServiceClient(transport="rest")
    except auth_exceptions.DefaultCredentialsError:
        raise UserError(f"--secret cannot read Secret Manager: {NO_CREDENTIALS}.") from None


def _access(client: secretmanager.SecretManagerServiceClient, resource: str) -> str:
    """One secret version's payload, as text. The call is Secret Manager's
    `GET https://secretmanager.googleapis.com/v1/{name=projects/*/secrets/*/versions/*}:access`
    (REST reference, projects.secrets.versions.access), whose response carries the payload
    as base64 in `payload.data`; the client decodes it to bytes."""
    try:
        response = client.access_secret_version(name=resource, timeout=ACCESS_TIMEOUT_SECONDS)
    except (api_exceptions.GoogleAPIError, auth_exceptions.GoogleAuthError, OSError) as error:
        raise UserError(
            f"could not read the secret {resource} from Secret Manager: {_why(error)}."
        ) from None
    try:
        return response.payload.data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(
            f"the secret {resource} is not UTF-8 text: an environment variable cannot hold it."
        ) from None


def _why(error: Exception) -> str:
    """What to do about a failed access, by kind; never the response's text."""
    if isinstance(error, api_exceptions.Forbidden):  # PermissionDenied is one
        return (
            "permission denied: grant the job's service account "
            "roles/secretmanager.secretAccessor on the secret (docs/deploy.md)"
        )
    if isinstance(error, api_exceptions.NotFound):
        return "not found: check the project, secret and version (gcloud secrets versions list)"
    if isinstance(error, auth_exceptions.DefaultCredentialsError):
        return NO_CREDENTIALS
    return f"{type(error).__name__} (is Secret Manager reachable from the node?)"
