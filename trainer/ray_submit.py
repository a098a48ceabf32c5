"""`python -m trainer.ray_submit --address ADDRESS [recipe.yaml] [flags]`: send
`python -m trainer.ray [recipe.yaml] [flags]` to a Ray cluster as a job, from outside it,
and stream its logs until it ends; the exit code is the job's (0 succeeded, 1 otherwise).

ADDRESS: vertex_ray://<dashboard address> (Ray on Vertex AI; needs the `ray` extra, which
brings google-cloud-aiplatform[ray]), http://host:8265 (a dashboard), or ray://host:10001.
The project goes as the job's working_dir; variables named with --env_var go in its
runtime_env, their values never printed.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainer.command_line.parser import FlagParser
from trainer.common.errors import UserError
from trainer.common.flag_fields import flag

PROJECT_ROOT = Path(__file__).resolve().parent.parent
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
        job_id = client.submit_job(
            entrypoint=" ".join(["python", "-m", "trainer.ray", *map(shlex.quote, job_argv)]),
            runtime_env=runtime_env(options.env_var, os.environ),
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


def runtime_env(names: list[str], env) -> dict:
    """The project as working_dir, and the named variables that are set here."""
    passed = {name: env[name] for name in names if name in env}
    return {"working_dir": str(PROJECT_ROOT), "excludes": EXCLUDES, "env_vars": passed}


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
