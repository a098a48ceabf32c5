"""`register()`: a delivered model into the Vertex AI Model Registry, once.

The order is the cheap checks first: the URI, the name and the serving environment before any
request; then what the model says about itself (its manifest and config.json, read where it
was delivered); then the record beside it (registered already: nothing is sent); only then the
registry. Anything the registry or storage answers wrongly (403, a quota, a name the service
refuses, an outage past the SDK's retries) is `RegistrationFailed`, whose line says that the
model is kept and how to retry; the delivered model is never touched.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import requests
from google.api_core.exceptions import GoogleAPICallError, RetryError
from google.auth.exceptions import GoogleAuthError

from trainer.common.errors import StorageUnavailable
from trainer.registry.delivered_facts import read_delivered_model
from trainer.registry.labels import check_name_and_labels
from trainer.registry.registration_record import RecordedRegistration, RegistrationRecord
from trainer.registry.registration_request import (
    Registration,
    check_before_requests,
    registry_labels,
)
from trainer.registry.upload import connect, upload_model
from trainer.storage.failure_kinds import brief
from trainer.storage.store import TransferError, open_store

READ_PREFIXES_VARIABLE = "SERVE_GCS_READ_PREFIXES"
"""trainer/serve's variable for the gs:// prefixes instances may name (docs/serving.md)."""
REGISTRY_ERRORS = (GoogleAPICallError, RetryError, GoogleAuthError, requests.RequestException,
                   StorageUnavailable, TransferError)  # fmt: skip
"""What the registry and storage raise for a request they refused or never answered."""


class RegistrationFailed(Exception):
    """The registry (or storage) refused or did not answer; the model is kept."""


@dataclass(frozen=True)
class Registered:
    resource_name: str
    version_id: str
    already: bool = False
    """Registered by an earlier call (its record beside the model): nothing was sent now."""
    new_model: bool = True

    @property
    def versioned_name(self) -> str:
        return f"{self.resource_name}@{self.version_id}"

    def line(self, name: str) -> str:
        """What was registered under display name `name`, and how it came to be."""
        if self.already:
            return (f"already registered: {self.versioned_name} ({name}, version "
                    f"{self.version_id}; nothing sent)")  # fmt: skip
        how = "a new model" if self.new_model else f"a new version of {name}"
        return f"registered: {self.versioned_name} ({how}, version {self.version_id})"


def register(registration: Registration) -> Registered:
    """Register the delivered model (see the module's docstring); UserError for bad input,
    RegistrationFailed when the registry or storage fails."""
    uri = check_before_requests(registration)
    try:
        return registered_once(registration, uri)
    except REGISTRY_ERRORS as error:
        raise RegistrationFailed(brief(error)) from error


def registered_once(registration: Registration, uri: str) -> Registered:
    delivered = read_delivered_model(open_store(uri))
    base_model = registration.base_model or delivered.adapter_base
    labels = check_name_and_labels(
        registration.name,
        registry_labels(delivered.task, base_model, registration.metric,
                        registration.serving_image),
    )  # fmt: skip
    record = RegistrationRecord(uri)
    earlier = record.find(registration.place, registration.name)
    if earlier is not None:
        return Registered(earlier.resource_name, earlier.version_id, already=True)
    connect(registration.place)
    # the server reads gs:// instances under the model's own bucket unless told otherwise
    readable = {READ_PREFIXES_VARIABLE: "gs://" + uri.removeprefix("gs://").split("/")[0] + "/"}
    uploaded = upload_model(
        registration.place, registration.name, uri, registration.serving_image,
        readable | dict(registration.serving_env), labels,
        registration.version_aliases, registration.deployment_timeout_s,
        invoke_routes=registration.invoke_routes,
    )  # fmt: skip
    place = registration.place
    entry = RecordedRegistration(place.project, place.region, registration.name,
                                 uploaded.resource_name, uploaded.version_id)  # fmt: skip
    try:
        record.add(entry)
    except REGISTRY_ERRORS as error:
        print(f"warning: registered, but recording it in {record.uri} failed "
              f"({brief(error)}): registering this model again would add another version",
              file=sys.stderr)  # fmt: skip
    return Registered(uploaded.resource_name, uploaded.version_id, new_model=uploaded.new_model)
