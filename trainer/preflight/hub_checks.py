"""Check that the Hugging Face Hub still serves the model and dataset a run names.

A Hub id that no longer exists (or a dataset taken down) otherwise fails only after every node
started, pulled the image and loaded the model, and Vertex AI retries the job. One metadata
call per id (`HfApi.model_info` / `dataset_info`, no download) settles it in a second, before
anything is launched or written. No call is made for a local path or an id already in the local
cache (what `from_pretrained` and `load_dataset` would use). With `HF_HUB_OFFLINE=1` the
network is never asked: an id must be cached. `HF_ENDPOINT` and `HF_TOKEN` are honoured like
the libraries do; `--skip_hub_check` turns the check off.

With `--push_to_hub` the run also writes to the Hub, from the Trainer's start on
(`create_repo`). `check_hub_writes` asks the Hub `whoami` with the token the Trainer will use
(`--hub_token`, else `HF_TOKEN`, else `hf auth login`'s), so that no token, a refused or
read-only one, and an unreachable Hub fail here too; not skipped by `--skip_hub_check` or
offline mode: a run that pushes needs the Hub, so the way out is to leave `--push_to_hub` off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from trainer.common.errors import UserError
from trainer.common.hub_access import (
    hub_cache_dir,
    hub_endpoint,
    offline_variable,
    transport_failure,
)
from trainer.data.sources import looks_like_path

HUB_TIMEOUT_SECONDS = 15
SKIP_HINT = (
    "to launch without this check, set HF_HUB_OFFLINE=1 with the files in the local cache "
    "or pass --skip_hub_check"
)


def hub_ids(model: str | None, dataset: str | None) -> list[tuple[str, str]]:
    """(repo type, id) of the Hub repositories named; local paths and gs:// are not."""
    named = [("model", model), ("dataset", dataset)]
    return [(kind, name) for kind, name in named if name and not looks_like_path(name)]


def is_cached(kind: str, repo_id: str, cache_dirs: Iterable[Path]) -> bool:
    """True when a snapshot of the repository is in one of the caches."""
    from huggingface_hub.file_download import repo_folder_name

    folder = repo_folder_name(repo_id=repo_id, repo_type=kind)
    for cache in cache_dirs:
        snapshots = cache / folder / "snapshots"
        if snapshots.is_dir() and any(snapshots.iterdir()):
            return True
    return False


def check_hub_ids(
    ids: list[tuple[str, str]], env: Mapping[str, str], extra_cache: str | None = None
) -> None:
    """Raise a one-line UserError for the first id the Hub does not serve (or cannot be
    asked about); `extra_cache` is the run's `--cache_dir`, where models may also be."""
    caches = [hub_cache_dir(env)] + ([Path(extra_cache).expanduser()] if extra_cache else [])
    for kind, repo_id in ids:
        if is_cached(kind, repo_id, caches):
            continue
        offline = offline_variable(kind, env)
        if offline:
            raise UserError(
                f"Hub {kind} {repo_id} is not in the local Hugging Face cache ({caches[0]}) "
                f"and offline mode ({offline}=1) forbids fetching it: download it first, "
                "give a local path, or pass --skip_hub_check."
            )
        ask_hub(kind, repo_id, env)


def ask_hub(kind: str, repo_id: str, env: Mapping[str, str]) -> None:
    """One metadata request; every failure becomes one line saying what to do."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    endpoint = hub_endpoint(env)
    api = HfApi(endpoint=endpoint, token=env.get("HF_TOKEN") or None)
    lookup = api.model_info if kind == "model" else api.dataset_info
    try:
        lookup(repo_id, timeout=HUB_TIMEOUT_SECONDS)
    except RepositoryNotFoundError:
        raise UserError(
            f"Hub {kind} {repo_id} does not exist at {endpoint} (or is private and HF_TOKEN "
            f"gives no access): check the id, or copy the {kind} to your bucket and give its "
            "path."
        ) from None
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "?"
        if status in (401, 403):
            raise UserError(
                f"The Hub at {endpoint} refused access to {kind} {repo_id} (HTTP {status}): it "
                "is private or gated; give the run an HF_TOKEN that can read it (never in a job "
                f"spec), or copy the {kind} to your bucket and give its path."
            ) from None
        raise UserError(
            f"The Hub at {endpoint} answered HTTP {status} about {kind} {repo_id}; {SKIP_HINT}."
        ) from None
    except Exception as error:  # noqa: BLE001 - any transport failure means "not reachable"
        raise UserError(
            f"Cannot reach the Hugging Face Hub at {endpoint} to check {kind} {repo_id} "
            f"({transport_failure(error)}); {SKIP_HINT}."
        ) from None


def check_hub_writes(push_to_hub: bool, hub_token: str | None, env: Mapping[str, str]) -> None:
    """With `push_to_hub`, raise a one-line UserError unless the Hub answers `whoami` for a
    token that may write."""
    if not push_to_hub:
        return
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError

    endpoint = hub_endpoint(env)
    offline = offline_variable("model", env)
    if offline:
        raise UserError(
            f"--push_to_hub writes to the Hub at {endpoint}, which offline mode ({offline}=1) "
            f"forbids: leave --push_to_hub out, or unset {offline}."
        )
    token = hub_token or env.get("HF_TOKEN") or get_token()
    if not token:
        raise UserError(
            "--push_to_hub needs a Hub token with write access: set HF_TOKEN for the run "
            "(never in a job spec), pass --hub_token, or log in with hf auth login."
        )
    try:
        who = HfApi(endpoint=endpoint, token=token).whoami()
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "?"
        raise UserError(
            f"The Hub at {endpoint} refused the token for --push_to_hub (HTTP {status}): "
            "give the run a valid token with write access (HF_TOKEN or --hub_token)."
        ) from None
    except Exception as error:  # noqa: BLE001 - any transport failure means "not reachable"
        raise UserError(
            f"Cannot reach the Hugging Face Hub at {endpoint} for --push_to_hub "
            f"({transport_failure(error)}): the run writes to it from its start; leave "
            "--push_to_hub out or make the Hub reachable."
        ) from None
    role = who.get("auth", {}).get("accessToken", {}).get("role")
    if role == "read":
        raise UserError(
            f"--push_to_hub: the token of {who.get('name', '?')} at {endpoint} is read-only; "
            "give the run a token with write access (HF_TOKEN or --hub_token)."
        )
