"""The Ray cluster, checked before anything waits on it: reachable, running this Ray
version, and able to hold the workers asked for. Ray itself would wait for ever for
resources no node has, so what cannot fit is refused here, in one line."""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace

import ray

from trainer.common.errors import UserError
from trainer.ray.ray_flags import RayArguments

CONNECT_TIMEOUT_SECONDS = 5
"""How long the head's port may take to accept a connection before it counts as absent."""

PASSED_ENV = ("TRAINER_", "HF_", "AIP_", "STORAGE_EMULATOR_HOST", "TORCH_EXTENSIONS_DIR")
"""Variables of this process that the Ray workers get too (prefixes): where the cache and
the demo's assets are, Hub settings and token, Vertex AI's output locations. Values go to
Ray's runtime environment, never to the log."""


def head_address(address: str, env) -> str:
    """The address to connect to: `auto` means $RAY_ADDRESS when set (a submitted job)."""
    return env.get("RAY_ADDRESS", address) if address == "auto" else address


def check_reachable(address: str) -> None:
    """A host:port (or ray://host:port) must accept a TCP connection within seconds:
    `ray.init` retries an absent head for a minute before it fails."""
    if address == "auto":
        return  # ray.init finds this node's cluster at once, or says there is none
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not port.isdigit():
        raise UserError(f"--address {address}: give host:port, ray://host:port or auto.")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_SECONDS).close()
    except OSError as error:
        raise UserError(f"no Ray cluster at {address} ({error}).") from None


def connect(address: str, env) -> None:
    """Join the cluster as this job's driver; UserError for no cluster or another Ray."""
    check_reachable(address)
    # A submitted job's runtime_env already reaches every worker (Ray refuses a second one
    # naming the same variables, and its refusal prints their values).
    in_job = "RAY_JOB_CONFIG_JSON_ENV_VAR" in env
    passed = {} if in_job else {k: v for k, v in env.items() if k.startswith(PASSED_ENV)}
    try:
        ray.init(
            address=address,
            runtime_env={"env_vars": passed} if passed else None,
            log_to_driver=True,
            logging_level="WARNING",
        )
    except ConnectionError as error:
        raise UserError(f"no Ray cluster at {address}: {error}") from None
    except RuntimeError as error:
        if "version mismatch" in str(error).lower():
            raise UserError(
                f"the Ray cluster at {address} runs another Ray or Python version than this "
                f"process (Ray {ray.__version__}): {' '.join(str(error).split())}"
            ) from None
        raise


@dataclass(frozen=True)
class Workers:
    """What the run asks of the cluster: `count` workers, each with these resources."""

    count: int
    use_gpu: bool
    cpus: float
    gpus: float

    def resources(self) -> dict[str, float]:
        return {"CPU": self.cpus, **({"GPU": self.gpus} if self.use_gpu else {})}


def plan_workers(asked: RayArguments, nodes: list[dict[str, float]]) -> Workers:
    """The workers from the flags and the nodes' total resources (defaults from what the
    cluster has); UserError when they can never all be placed, node by node."""
    use_gpu = uses_gpus(asked.use_gpu, nodes)
    workers = Workers(count=0, use_gpu=use_gpu, cpus=asked.cpus_per_worker,
                      gpus=asked.gpus_per_worker if use_gpu else 0.0)  # fmt: skip
    fits = sum(fitting(node, workers.cpus, workers.gpus) for node in nodes)
    count = asked.num_workers
    if count is None:  # one per GPU, or one per node that has CPUs
        count = fits if use_gpu else sum(fitting(node, workers.cpus, 0) > 0 for node in nodes)
    if not 1 <= count <= fits:
        raise UserError(
            f"{count} worker(s) of {describe(workers)} each cannot all be placed: the "
            f"cluster's nodes ({', '.join(map(describe_node, nodes))}) hold {fits}. Ask for "
            "fewer (--num_workers) or smaller workers (--cpus_per_worker, --gpus_per_worker)."
        )
    return replace(workers, count=count)


def uses_gpus(asked: bool | None, nodes: list[dict[str, float]]) -> bool:
    """--use_gpu, by default whether the cluster has GPUs; UserError if it has none."""
    cluster_gpus = sum(node.get("GPU", 0) for node in nodes)
    if asked and cluster_gpus == 0:
        raise UserError("--use_gpu true, but the Ray cluster has no GPU.")
    return cluster_gpus > 0 if asked is None else asked


def describe(workers: Workers) -> str:
    return f"{workers.cpus:g} CPU" + (f" and {workers.gpus:g} GPU" if workers.use_gpu else "")


def describe_node(node: dict[str, float]) -> str:
    return f"{node.get('CPU', 0):g} CPU/{node.get('GPU', 0):g} GPU"


def fitting(node: dict[str, float], cpus: float, gpus: float) -> int:
    """How many workers of `cpus` CPUs and `gpus` GPUs this node's totals hold."""
    limits = [node.get("CPU", 0) / cpus]
    if gpus:
        limits.append(node.get("GPU", 0) / gpus)
    return int(min(limits))


def node_resources() -> list[dict[str, float]]:
    """Each live node's total resources (what it can ever offer, busy or not)."""
    return [node["Resources"] for node in ray.nodes() if node["Alive"]]
