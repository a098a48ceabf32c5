"""The record that a delivered model is registered, so that registering it again (a retried
command, a restarted chief) answers "already registered" instead of adding a version.

It is `MODEL.registration.json` beside the model's folder, not in it: the folder is what its
manifest lists and what Vertex AI copies to every serving replica, and stays exactly what the
run delivered. To register the same model under the same name again on purpose, delete it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from trainer.registry.upload import VertexPlace
from trainer.storage.store import Store, open_store

RECORD_SUFFIX = ".registration.json"


@dataclass(frozen=True)
class RecordedRegistration:
    project: str
    region: str
    name: str
    resource_name: str
    version_id: str


class RegistrationRecord:
    """The registrations of the model at `model_uri` (gs://BUCKET/PATH), by name and place."""

    def __init__(self, model_uri: str) -> None:
        folder, _, leaf = model_uri.rstrip("/").rpartition("/")
        self.store: Store = open_store(folder)
        self.file = f"{leaf}{RECORD_SUFFIX}"
        self.uri = f"{folder}/{self.file}"

    def entries(self) -> list[RecordedRegistration]:
        text = self.store.read_text(self.file)
        found = json.loads(text)["registrations"] if text else []
        return [RecordedRegistration(**entry) for entry in found]

    def find(self, place: VertexPlace, name: str) -> RecordedRegistration | None:
        wanted = (place.project, place.region, name)
        return next((e for e in self.entries() if (e.project, e.region, e.name) == wanted), None)

    def add(self, entry: RecordedRegistration) -> None:
        entries = [*self.entries(), entry]
        content = {"registrations": [asdict(e) for e in entries]}
        self.store.write_text(self.file, json.dumps(content, indent=1))
