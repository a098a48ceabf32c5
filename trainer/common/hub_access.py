"""How this project reaches the Hugging Face Hub from a run's environment: the endpoint and
offline mode as the libraries read them, and a failed request in a few words. Shared by the
task's inference from a Hub model's config.json (trainer/config/task_inference.py) and the
Hub checks before launch (trainer/preflight/hub_checks.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

DEFAULT_ENDPOINT = "https://huggingface.co"
TRUE_VALUES = {"1", "true", "yes", "on"}


def hub_endpoint(env: Mapping[str, str]) -> str:
    """`HF_ENDPOINT`, else huggingface.co, as huggingface_hub reads it."""
    return (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_cache_dir(env: Mapping[str, str]) -> Path:
    """Where huggingface_hub keeps downloads, resolved from `env` as the library does."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return Path(env[name]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = env.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "huggingface" / "hub"


def offline_variable(kind: str, env: Mapping[str, str]) -> str | None:
    """The variable that puts the library loading `kind` offline, if one is set."""
    names = ["HF_HUB_OFFLINE"] + (["HF_DATASETS_OFFLINE"] if kind == "dataset" else [])
    return next((n for n in names if env.get(n, "").strip().lower() in TRUE_VALUES), None)


def transport_failure(error: Exception) -> str:
    """The exception's type and the first line of its message, for one error line."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
