"""Which task a command line without `--task` means, from what the model and data say.

An example script chooses its task by its file name, so copied command lines carry no
`--task`; planning them as the default task (Whisper) would fail late or train the wrong
thing. The model's `config.json` (local, or in the Hugging Face cache) names its type and
architectures; a local dataset's files show audio, image folders or tables. When neither is
here and the model is a Hub id, its config.json is asked of the Hub (into the cache, where
the model's plan reads it next): the resolution's one network request. A Hub model whose
config.json cannot be had (offline, `--skip_hub_check`, the Hub unreachable) is refused with
a line asking for `--task`, not guessed. The answer comes with the reason, for the notices of
the run.
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
from trainer.tasks import DEFAULT_TASK, load_task, task_names
from trainer.tasks.model_tasks import task_of_model

HUB_TIMEOUT_SECONDS = 15

LAYOUT_ORDER = ("speech-recognition", "image-classification", "text-classification")
"""Tasks tried on a local dataset directory, most specific layout first (a Common Voice
directory holds .tsv tables too)."""


def infer_task(
    model: str | None,
    dataset: str | None,
    cache_dir: str | None,
    env: Mapping[str, str],
    skip_hub_check: bool = False,
) -> tuple[str, str]:
    """(task, why): from the model's config.json here, else the dataset's files, else a Hub
    model's config.json from the Hub (UserError when it cannot be had), else the default
    task."""
    config = model_config(model, cache_dir, env) if model else None
    task = task_of_model(config) if config is not None else None
    if task is not None:
        return task, f"{model}'s config.json says {model_kind(config)}"
    if dataset and looks_like_path(dataset) and Path(dataset).is_dir():
        for name in LAYOUT_ORDER:
            try:
                layout = load_task(name).detect_local_layout(Path(dataset))
            except UserError:
                continue
            return name, f"{dataset} is a local {layout.builder} dataset"
    if config is None and model and is_hub_id(model):
        config = hub_model_config(model, cache_dir, env, skip_hub_check)
        task = task_of_model(config)
        if task is not None:
            return task, f"{model}'s config.json on the Hub says {model_kind(config)}"
    return DEFAULT_TASK, "the default: neither the model's config.json nor the data say"


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
    from huggingface_hub import hf_hub_download

    ask_for_task = "add " + " or ".join(f"--task {name}" for name in task_names())
    closed = "--skip_hub_check" if skip_hub_check else offline_variable("model", env)
    if closed:
        raise UserError(
            f"No --task, and {model} is not in the local Hugging Face cache: its config.json, "
            f"which would tell the task, cannot be asked of the Hub ({closed}); {ask_for_task}."
        )
    endpoint = hub_endpoint(env)
    try:
        path = hf_hub_download(
            model, "config.json", cache_dir=cache_dir or hub_cache_dir(env), endpoint=endpoint,
            token=env.get("HF_TOKEN") or None, etag_timeout=HUB_TIMEOUT_SECONDS,
        )  # fmt: skip
        config = json.loads(Path(path).read_text())
    except Exception as error:  # noqa: BLE001 - any failure means "not known here"
        raise UserError(
            f"No --task, and the config.json of {model}, which would tell the task, cannot be "
            f"read from the Hub at {endpoint} ({transport_failure(error)}): check the id, or "
            f"{ask_for_task}."
        ) from None
    return config if isinstance(config, dict) else {}


def model_config(model: str, cache_dir: str | None, env: Mapping[str, str]) -> dict | None:
    """The model's config.json from a local folder, the run's `--cache_dir` or the Hub cache
    (found as the Hub check finds it); None if not here."""
    from huggingface_hub import try_to_load_from_cache

    path = Path(model).expanduser() / "config.json"
    if not path.is_file():
        if not is_hub_id(model):
            return None
        caches = [cache for cache in (cache_dir, hub_cache_dir(env)) if cache]
        try:
            cached = [try_to_load_from_cache(model, "config.json", cache_dir=c) for c in caches]
        except ValueError:  # not a valid Hub id: the Hub check says so in one line
            return None
        found = [hit for hit in cached if isinstance(hit, str)]
        if not found:
            return None
        path = Path(found[0])
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None
