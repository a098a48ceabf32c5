"""Hub ids are checked before launch: against a loopback Hub, through the real client.

The server below answers huggingface_hub's metadata routes (`/api/models/ID`,
`/api/datasets/ID`) the way the Hub does: 200 with JSON for a repository that exists, 404
with `X-Error-Code: RepoNotFound` for one that does not, 401 for one the token cannot read.
`HF_ENDPOINT` points the client at it; every request is recorded.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import free_port, warm_hub_cache
from tests.support.helpers import launch_is_a_tripwire, use_hub_at
from trainer.common.errors import UserError
from trainer.jobspec import __main__ as jobspec
from trainer.launcher import main as launch
from trainer.preflight.hub_checks import check_hub_ids, hub_cache_dir, hub_ids

AGENT_REGISTRY = "/api/agent-harnesses"
"""huggingface_hub asks this once per process, best-effort, for its user-agent string (a
404 means "no agent"): not a question about the ids."""
EXISTING = {"/api/models/org/model", "/api/datasets/org/speech"}
PRIVATE = {"/api/models/org/private", "/api/datasets/org/private"}


class FakeHub(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _HubHandler)
        self.requests: list[tuple[str, str | None]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _HubHandler(BaseHTTPRequestHandler):
    server: FakeHub

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path != AGENT_REGISTRY:
            self.server.requests.append((path, self.headers.get("Authorization")))
        repo_id = path.split("/", 3)[-1]
        if path in EXISTING:
            self._reply(200, {"id": repo_id, "sha": "0" * 40, "private": False})
        elif path in PRIVATE:
            self._reply(401, {"error": "Invalid username or password."})
        else:
            self._reply(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})

    def _reply(self, status: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def hub():
    server = FakeHub()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def online(hub, tmp_path, monkeypatch):
    """An environment that may ask the (loopback) Hub, with an empty cache of its own, and
    this process online as that environment says."""
    use_hub_at(monkeypatch, hub.url)
    return {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_test", "HF_HUB_CACHE": str(tmp_path / "hub")}


def test_existing_ids_are_one_metadata_call_each_with_the_token(hub, online):
    check_hub_ids([("model", "org/model"), ("dataset", "org/speech")], online)
    assert hub.requests == [
        ("/api/models/org/model", "Bearer hf_test"),
        ("/api/datasets/org/speech", "Bearer hf_test"),
    ]


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([("dataset", "mozilla-foundation/common_voice_11_0")],
         "Hub dataset mozilla-foundation/common_voice_11_0 does not exist at http://127.0.0.1"),
        ([("model", "org/model"), ("model", "org/typo")], "Hub model org/typo does not exist"),
        ([("dataset", "org/private")], "refused access to dataset org/private (HTTP 401)"),
    ],
)  # fmt: skip
def test_missing_or_refused_ids_are_one_line(hub, online, ids, message):
    with pytest.raises(UserError) as error:
        check_hub_ids(ids, online)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_an_unreachable_hub_says_how_to_skip_the_check(online):
    online["HF_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(UserError) as error:
        check_hub_ids([("model", "org/model")], online)
    message = str(error.value)
    assert message.startswith("Cannot reach the Hugging Face Hub at http://127.0.0.1:")
    assert "HF_HUB_OFFLINE=1" in message and "--skip_hub_check" in message


def test_cached_ids_need_no_network_online_or_offline(hub, online, tmp_path):
    cache = tmp_path / "hub"
    warm_hub_cache(cache, "model", "org/gone")  # served from the cache though the Hub has none
    check_hub_ids([("model", "org/gone")], online)
    check_hub_ids([("model", "org/gone")], {**online, "HF_HUB_OFFLINE": "1"})
    assert hub.requests == []


def test_offline_without_the_files_fails_without_asking(hub, online):
    with pytest.raises(UserError, match=r"not in the local Hugging Face cache .*HF_HUB_OFFLINE=1"):
        check_hub_ids([("dataset", "org/speech")], {**online, "HF_HUB_OFFLINE": "1"})
    with pytest.raises(UserError, match=r"cache .*HF_DATASETS_OFFLINE=1"):
        check_hub_ids([("dataset", "org/speech")], {**online, "HF_DATASETS_OFFLINE": "true"})
    assert hub.requests == []


def test_the_runs_cache_dir_counts_as_a_cache(hub, online, tmp_path):
    warm_hub_cache(tmp_path / "mine", "model", "org/gone")
    check_hub_ids([("model", "org/gone")], online, extra_cache=str(tmp_path / "mine"))
    assert hub.requests == []


def test_local_paths_and_bucket_uris_are_not_hub_ids(tmp_path):
    assert hub_ids(str(tmp_path), "gs://bucket/data/cv-sr") == []
    assert hub_ids("./model", "/gcs/bucket/data") == []
    assert hub_ids("openai/whisper-small", None) == [("model", "openai/whisper-small")]


def test_cache_location_follows_the_libraries_variables(tmp_path):
    assert hub_cache_dir({"HF_HUB_CACHE": str(tmp_path)}) == tmp_path
    assert hub_cache_dir({"HF_HOME": str(tmp_path)}) == tmp_path / "hub"
    assert hub_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "huggingface" / "hub"


@pytest.fixture
def ask_the_fake_hub(hub, monkeypatch):
    """This process leaves offline mode and talks to the loopback Hub instead."""
    use_hub_at(monkeypatch, hub.url)
    return hub


def test_launcher_refuses_a_gone_model_before_launch(
    ask_the_fake_hub, demo_assets, monkeypatch, capsys, tmp_path
):
    monkeypatch.chdir(tmp_path)
    launch_is_a_tripwire(monkeypatch, lambda *a: pytest.fail("launched"))
    args = ["--model_name_or_path", "org/whisper-gone", "--dataset_name",
            str(demo_assets.dataset_dir), "--text_column_name", "transcription"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        launch.main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Hub model org/whisper-gone does not exist at http://127.0.0.1")
    assert err.count("\n") == 1
    assert ask_the_fake_hub.requests == [("/api/models/org/whisper-gone", None)]

    launch.main([*args, "--skip_hub_check", "--dry-run"])  # skipped: nothing asked
    assert json.loads(capsys.readouterr().out)["topology"]["role"] == "chief"
    assert len(ask_the_fake_hub.requests) == 1


def test_jobspec_refuses_a_dataset_the_hub_no_longer_serves(ask_the_fake_hub, tmp_path, capsys):
    """The seed model is in the (test session's) cache; the dataset is asked about."""
    argv = ["--dataset_name", "mozilla-foundation/common_voice_11_0", "--dest", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_info:
        jobspec.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Hub dataset mozilla-foundation/common_voice_11_0 does not exist")
    assert not list(tmp_path.iterdir()), "nothing is written"
    assert [path for path, _ in ask_the_fake_hub.requests] == [
        "/api/datasets/mozilla-foundation/common_voice_11_0"
    ]
    jobspec.main([*argv, "--skip_hub_check"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "hptuning.yaml"]
