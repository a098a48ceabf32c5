"""`python -m trainer.ray_submit --address ADDRESS [recipe.yaml] [flags]`: send
`python -m trainer.ray [recipe.yaml] [flags]` to a Ray cluster as a job, from outside it,
and stream its logs until it ends; the exit code is the job's (0 succeeded, 1 otherwise).

ADDRESS: vertex_ray://<dashboard address> (Ray on Vertex AI; needs the `ray` extra, which
brings google-cloud-aiplatform[ray]), http://host:8265 (a dashboard), or ray://host:10001.
The project goes as the job's working_dir; variables named with --env_var go in its
runtime_env, their values never printed. Before the job, a probe job with the same
runtime_env reports which of the project's dependencies the cluster's Python has: a cluster
on a stock image (no transformers, no DeepSpeed) is refused in one line, not left to fail
with a traceback in the job's log.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement

from trainer.command_line.parser import FlagParser
from trainer.common.errors import UserError
from trainer.common.flag_fields import flag

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DISTRIBUTION = "vertex-hf-trainer"
PROBE_MARK = "trainer-probe "
PROBE = f"""
import importlib.metadata as metadata, json, sys
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
print({PROBE_MARK!r} + json.dumps({{name: version(name) for name in sys.argv[1:]}}))
"""
"""Run by the cluster's `python` (the one the job's entrypoint gets): the installed version
of each distribution named, None for one not installed. Standard library only."""
EXCLUDES = [".git", ".venv", "outputs", "**/__pycache__", ".pytest_cache", ".ci-cache"]


@dataclass
class SubmitArguments:
    address: str = field(
        metadata={"help": "vertex_ray://DASHBOARD, http://HOST:8265 or ray://HOST:10001."}
    )
    env_var: list[str] = flag(
        ["HF_TOKEN"], "Variables of this shell passed to the job (values not printed)."
    )


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        options, job_argv = FlagParser([SubmitArguments]).parse_known_args(argv)
        client = connect(options.address)
        job_env = runtime_env(options.env_var, os.environ)
        check_cluster_python(client, job_env, required_distributions())
        job_id = submit(
            client,
            entrypoint=" ".join(["python", "-m", "trainer.ray", *map(shlex.quote, job_argv)]),
            runtime_env=job_env,
        )
    except UserError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)
    print(f"submitted Ray job {job_id} to {options.address}", flush=True)
    asyncio.run(stream_logs(client, job_id))
    status = wait_for_end(client, job_id)
    print(f"Ray job {job_id}: {status}", flush=True)
    sys.exit(0 if status == "SUCCEEDED" else 1)


def connect(address: str):
    """A job client for the cluster, whose Ray must be this one: UserError otherwise."""
    import ray
    from ray.job_submission import JobSubmissionClient

    if not address.startswith(("vertex_ray://", "http://", "https://", "ray://")):
        raise UserError(f"--address {address}: give vertex_ray://, http:// or ray://.")
    if address.startswith("ray://"):  # the job API is on the dashboard, not the client port
        address = "http://" + address.removeprefix("ray://").rsplit(":", 1)[0] + ":8265"
    try:
        client = JobSubmissionClient(address)
    except (ConnectionError, ValueError, RuntimeError) as error:
        raise UserError(f"no Ray cluster at {address}: {' '.join(str(error).split())}") from None
    response = client._do_request("GET", "/api/version")
    cluster_ray = response.json().get("ray_version") if response.ok else None
    if cluster_ray and cluster_ray != ray.__version__:
        raise UserError(
            f"the Ray cluster at {address} runs Ray {cluster_ray}, this client Ray "
            f"{ray.__version__}: install ray=={cluster_ray} here."
        )
    return client


AGENT_WAIT_SECONDS = 120.0
"""How long a submission waits for a job agent: a cluster that was just started answers "No
available agent to submit job, please try again later" until its dashboard has found its
nodes' agents (seconds, more on a loaded head)."""


def submit(client, clock=time.monotonic, sleep=time.sleep, **job) -> str:
    """`client.submit_job(**job)`, tried again while the cluster has no job agent ready;
    UserError if it has none after AGENT_WAIT_SECONDS."""
    deadline = clock() + AGENT_WAIT_SECONDS
    while True:
        try:
            return client.submit_job(**job)
        except RuntimeError as error:
            if "try again later" not in str(error) or clock() > deadline:
                raise UserError(
                    f"the Ray cluster refused the job: {' '.join(str(error).split())}"
                ) from None
        sleep(2.0)


def runtime_env(names: list[str], env) -> dict:
    """The project as working_dir, and the named variables that are set here."""
    passed = {name: env[name] for name in names if name in env}
    return {"working_dir": str(PROJECT_ROOT), "excludes": EXCLUDES, "env_vars": passed}


def required_distributions() -> list[Requirement]:
    """What this package needs in the Python that runs it (its extras aside): torch,
    DeepSpeed, transformers, datasets, ...; the job brings the package's own code."""
    listed = importlib.metadata.requires(DISTRIBUTION) or []
    return [req for req in map(Requirement, listed) if req.marker is None]


def check_cluster_python(client, job_env: dict, required: list[Requirement]) -> None:
    """One small job, run as the real one will be (same `python`, same runtime_env), reports
    the versions installed there; UserError naming what is missing or out of range."""
    names = [req.name for req in required]
    probe = submit(
        client,
        entrypoint=" ".join(["python", "-c", shlex.quote(PROBE), *names]),
        runtime_env=job_env,
    )
    status = wait_for_end(client, probe, poll=0.25)
    logs = client.get_job_logs(probe)
    reports = [line for line in logs.splitlines() if line.startswith(PROBE_MARK)]
    if status != "SUCCEEDED" or not reports:
        last = (logs.strip().splitlines() or ["no output"])[-1]
        raise UserError(
            f"the Ray cluster's python could not report its packages (a probe job {status}: "
            f"{last}); {CLUSTER_FIX}"
        )
    refusal = missing_packages(required, json.loads(reports[-1].removeprefix(PROBE_MARK)))
    if refusal:
        raise UserError(f"the Ray cluster's python {refusal}; {CLUSTER_FIX}")


CLUSTER_FIX = (
    "run the job on a cluster made with the project's Ray image (docker/Dockerfile.ray, "
    "docs/ray.md), or give the job a Ray runtime environment that installs them (its "
    "`pip`, as `ray job submit --runtime-env-json` takes it)."
)


def missing_packages(required: list[Requirement], installed: dict[str, str | None]) -> str:
    """'lacks transformers, deepspeed; has torch 2.5.1 (needs <2.14,>=2.13)' for what the
    probe's report misses; empty when every requirement is met."""
    missing = [req.name for req in required if installed.get(req.name) is None]
    wrong = [
        f"{req.name} {installed[req.name]} (needs {req.specifier})"
        for req in required
        if installed.get(req.name) is not None
        and not req.specifier.contains(installed[req.name], prereleases=True)
    ]
    parts = ([f"lacks {', '.join(missing)}"] if missing else []) + (
        [f"has {', '.join(wrong)}"] if wrong else []
    )
    return "; ".join(parts)


async def stream_logs(client, job_id: str) -> None:
    async for lines in client.tail_job_logs(job_id):
        print(lines, end="", flush=True)


def wait_for_end(client, job_id: str, poll: float = 1.0) -> str:
    while True:
        status = client.get_job_status(job_id)
        if status.is_terminal():
            return str(status.value)
        time.sleep(poll)


if __name__ == "__main__":
    main()
