"""Which task a command line without `--task` means, from what the model and data say.

An example script chooses its task by its file name, so copied command lines carry no
`--task`; planning them as the default task (Whisper) would fail late or train the wrong
thing. Every task is asked, in the registry's order (trainer/tasks/registry.py): whether the
model's `config.json` (local, or in the Hugging Face cache) is for it, whether the model is its
default model, whether a local dataset's files are in its layout. When none answers and the
model is a Hub id, its config.json is asked of the Hub (into the cache, where the model's plan
reads it next): the resolution's one network request, one attempt of at most
`HUB_TIMEOUT_SECONDS`. A Hub model whose config.json cannot be had (offline,
`--skip_hub_check`, the Hub unreachable) is refused with a line asking for `--task`, not
guessed, and so is a model whose config.json no task claims (a causal language model). The
answer comes with the reason, for the notices of the run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from trainer.common.errors import UserError
from trainer.common.hub_access import (
    hub_cache_dir,
    hub_endpoint,
    offline_variable,
    transport_failure,
)
from trainer.data.sources import looks_like_path
from trainer.tasks.registry import (
    DEFAULT_TASK,
    refining_tasks,
    registered,
    task_names,
    task_of_model,
)

HUB_TIMEOUT_SECONDS = 10


def infer_task(
    model: str | None,
    dataset: str | None,
    cache_dir: str | None,
    env: Mapping[str, str],
    skip_hub_check: bool = False,
) -> tuple[str, str]:
    """(task, why): from the model's config.json here, else the task whose default model it
    is, else the dataset's files, else a Hub model's config.json from the Hub (UserError when
    it cannot be had), else the default task. UserError for a config.json no task claims."""
    config = model_config(model, cache_dir, env) if model else None
    found = (
        claimed(model, config, "config.json")
        or task_of_default_model(model)
        or task_of_dataset(dataset)
    )
    if found is None and config is None and model and is_hub_id(model):
        hub_config = hub_model_config(model, cache_dir, env, skip_hub_check)
        found = claimed(model, hub_config, "config.json on the Hub")
    found = refined(found, dataset)
    return found or (DEFAULT_TASK, "the default: neither the model's config.json nor the data say")


def refined(found: tuple[str, str] | None, dataset: str | None) -> tuple[str, str] | None:
    """A task that trains the found task's models further (`TaskSpec.serves_as`: preference
    tuning of a causal language model) when the local dataset is in its layout."""
    if found is None or not (dataset and looks_like_path(dataset) and Path(dataset).is_dir()):
        return found
    for spec in refining_tasks(found[0]):
        try:
            layout = spec.detect_layout(Path(dataset))
        except UserError:
            continue
        return (
            spec.name,
            f"{found[1]}, and {dataset} is a local {layout.builder} dataset of its layout",
        )
    return found


def task_of_default_model(model: str | None) -> tuple[str, str] | None:
    """(task, why) of the task whose default model `model` is (no Hub asked)."""
    owner = next((spec for spec in registered() if model and spec.default_model == model), None)
    return (owner.name, f"{model} is the default model of {owner.name}") if owner else None


def task_of_dataset(dataset: str | None) -> tuple[str, str] | None:
    """(task, why) of the first task whose layout a local dataset directory has."""
    if not (dataset and looks_like_path(dataset) and Path(dataset).is_dir()):
        return None
    for spec in registered():
        try:
            layout = spec.detect_layout(Path(dataset))
        except UserError:
            continue
        return spec.name, f"{dataset} is a local {layout.builder} dataset"
    return None


def claimed(model: str | None, config: dict | None, where: str) -> tuple[str, str] | None:
    """(task, why) of the task that claims the model's config.json; None for a config that
    names no model type or architecture (it says nothing); UserError naming the tasks there
    are when none claims it."""
    if not config or not model_kind(config):
        return None
    task = task_of_model(config)
    if task is None:
        kinds = [config.get("model_type"), *(config.get("architectures") or [])]
        kind = ", ".join(str(k) for k in kinds if k)
        raise UserError(
            f"{model}'s {where} says {kind}, which none of the tasks here trains "
            f"({', '.join(task_names())}): give --task if one of them fits."
        )
    return task, f"{model}'s {where} says {model_kind(config)}"


def model_kind(config: dict) -> str:
    return config.get("model_type") or ", ".join(config.get("architectures") or [])


def is_hub_id(model: str) -> bool:
    """`org/name` or `name`, not a local path or gs://."""
    return not looks_like_path(model) and model.count("/") <= 1


def hub_model_config(
    model: str, cache_dir: str | None, env: Mapping[str, str], skip_hub_check: bool
) -> dict:
    """A Hub model's config.json, downloaded into the cache (as `from_pretrained` would);
    UserError asking for `--task` when the Hub may not or cannot be asked."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    ask_for_task = "add " + " or ".join(f"--task {name}" for name in task_names())
    closed = "--skip_hub_check" if skip_hub_check else offline_variable("model", env)
    if closed:
        raise UserError(
            f"No --task, and {model} is not in the local Hugging Face cache: its config.json, "
            f"which would tell the task, cannot be asked of the Hub ({closed}); {ask_for_task}."
        )
    endpoint = hub_endpoint(env)
    token = env.get("HF_TOKEN") or None
    try:
        # One attempt first: hf_hub_download retries an unreachable Hub for minutes.
        url = hf_hub_url(model, "config.json", endpoint=endpoint)
        get_hf_file_metadata(url, token=token, timeout=HUB_TIMEOUT_SECONDS, endpoint=endpoint)
        path = hf_hub_download(
            model, "config.json", cache_dir=cache_dir or hub_cache_dir(env), endpoint=endpoint,
            token=token, etag_timeout=HUB_TIMEOUT_SECONDS,
        )  # fmt: skip
        config = json.loads(Path(path).read_text())
    except Exception as error:  # noqa: BLE001 - any failure means "not known here"
        raise UserError(
            f"No --task, and the config.json of {model}, which would tell the task, cannot be "
            f"read from the Hub at {endpoint} ({transport_failure(error)}): check the id, or "
            f"{ask_for_task}."
        ) from None
    return config if isinstance(config, dict) else {}


def cached_config(model: str, cache_dir: str | None, env: Mapping[str, str]) -> Path | None:
    """A Hub model's config.json in the run's `--cache_dir` or the Hub cache, if there."""
    from huggingface_hub import try_to_load_from_cache

    caches = [cache for cache in (cache_dir, hub_cache_dir(env)) if cache]
    try:
        cached = [try_to_load_from_cache(model, "config.json", cache_dir=c) for c in caches]
    except ValueError:  # not a valid Hub id: the Hub check says so in one line
        return None
    found = [hit for hit in cached if isinstance(hit, str)]
    return Path(found[0]) if found else None


def model_config(model: str, cache_dir: str | None, env: Mapping[str, str]) -> dict | None:
    """The model's config.json from a local folder, the run's `--cache_dir` or the Hub cache
    (found as the Hub check finds it); None if not here."""
    path = Path(model).expanduser() / "config.json"
    if not path.is_file():
        path = cached_config(model, cache_dir, env) if is_hub_id(model) else None
    if path is None:
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None
