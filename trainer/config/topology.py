"""Where this replica stands in the job, derived from Vertex AI's environment.

Vertex AI starts the same container on every replica of every worker pool and describes the
cluster in `CLUSTER_SPEC` (JSON). Only workerpool0 (the chief, one replica) and workerpool1
(the other training nodes) run this image; workerpool2 holds parameter or Reduction Server
replicas and workerpool3 evaluators, which run other images. Vertex's `RANK`, `WORLD_SIZE`,
`MASTER_ADDR` and `MASTER_PORT` count NODES, not processes, so they are never process ranks
here. Everything here is a pure function of its arguments (no I/O, no torch), tested with plain
dicts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from trainer.common.errors import UserError
from trainer.settings.run_config import Topology

VERTEX_RENDEZVOUS_PORT = 2222
"""The port Vertex AI puts after every host in CLUSTER_SPEC."""

LOCAL_RENDEZVOUS_PORT = 29500
"""torchrun's default port, used when the job has a single node and no CLUSTER_SPEC."""

LOCAL_ADDRESS = "127.0.0.1"
"""The chief's rendezvous address on the chief itself (see `resolve_topology`)."""

CHIEF_POOL = "workerpool0"
WORKER_POOL = "workerpool1"
FOREIGN_POOLS = {
    "workerpool2": "parameter servers or Reduction Server replicas",
    "workerpool3": "evaluators",
}


def resolve_topology(
    env: Mapping[str, str],
    gpu_count: int,
    nproc_per_node: int | None = None,
    master_port: int | None = None,
) -> Topology:
    """Build the topology from the environment, the local GPU count and the user's overrides.

    Processes per node default to one per GPU (one on a CPU-only node); `nproc_per_node`
    overrides that, never beyond the GPUs present. `master_port` overrides the port of the
    chief's address (every node must get the same value). The chief rendezvouses at its local
    address, the workers at the chief's name from CLUSTER_SPEC: on Vertex AI that name resolves
    through a per-replica Service, which the chief need not (and, while starting, may not yet)
    reach itself. Vertex AI's own PyTorch launcher does the same; the rendezvous store listens
    on every interface, so the workers still find it under the Service name."""
    procs = _processes_per_node(gpu_count, nproc_per_node)
    if master_port is not None and not 0 < master_port < 65536:
        raise UserError(f"--master_port {master_port} is not a TCP port (1-65535).")

    raw_spec = env.get("CLUSTER_SPEC", "").strip()
    if not raw_spec:
        return Topology(
            num_nodes=1,
            node_rank=0,
            master_addr=LOCAL_ADDRESS,
            master_port=master_port or LOCAL_RENDEZVOUS_PORT,
            nproc_per_node=procs,
            role="chief",
        )

    cluster, pool, index = _parse_cluster_spec(raw_spec)
    chief_host, chief_port = _split_address(cluster[CHIEF_POOL][0], pool_name=CHIEF_POOL)
    workers = cluster.get(WORKER_POOL, [])
    return Topology(
        num_nodes=1 + len(workers),
        node_rank=0 if pool == CHIEF_POOL else index + 1,
        master_addr=LOCAL_ADDRESS if pool == CHIEF_POOL else chief_host,
        master_port=master_port or chief_port,
        nproc_per_node=procs,
        role="chief" if pool == CHIEF_POOL else "worker",
    )


GPUS_PER_REPLICA_VARIABLE = "TRAINER_GPUS_PER_REPLICA"
"""Set by `python -m trainer.jobspec` in every worker pool's container env (and so in
config.yaml) to the pool's acceleratorCount: what this node must have. Vertex AI's own
CLUSTER_SPEC does not carry it (see `requested_accelerators`)."""


def requested_accelerators(env: Mapping[str, str]) -> int | None:
    """GPUs this replica's worker pool asked for: what the launcher must see before it plans a
    smaller world than the job pays for. The job spec's env (`TRAINER_GPUS_PER_REPLICA`) says
    it first; else CLUSTER_SPEC's "job" is read, in case Vertex AI ever carries
    `worker_pool_specs[i].machine_spec.accelerator_count` there (proto or REST spelling, object
    or JSON string): in the CLUSTER_SPEC published with the Vertex SDK (python-aiplatform
    tests/unit/aiplatform/test_cloud_profiler.py) "job" is a JSON string without worker pools.
    None when neither says: the topology is what must be valid."""
    given = env.get(GPUS_PER_REPLICA_VARIABLE, "").strip()
    if given:
        if not given.isdigit():
            raise UserError(
                f"{GPUS_PER_REPLICA_VARIABLE}={given} is not a GPU count (a whole number); "
                "it is written by python -m trainer.jobspec as the pool's acceleratorCount."
            )
        return int(given)
    try:
        spec = json.loads(env.get("CLUSTER_SPEC", "").strip() or "{}")
        job = spec.get("job") or {}
        job = json.loads(job) if isinstance(job, str) else job
        pool_number = int(str(spec["task"]["type"]).removeprefix("workerpool"))
        pools = _either(job, "worker_pool_specs", "workerPoolSpecs") or []
        machine = _either(pools[pool_number], "machine_spec", "machineSpec") or {}
        count = _either(machine, "accelerator_count", "acceleratorCount")
        return None if count is None else int(count)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        return None


def _either(mapping: Mapping, *names: str):
    return next((mapping[name] for name in names if name in mapping), None)


def _processes_per_node(gpu_count: int, requested: int | None) -> int:
    if requested is None:
        return max(gpu_count, 1)
    if requested < 1:
        raise UserError(f"--nproc_per_node must be at least 1, got {requested}.")
    if gpu_count and requested > gpu_count:
        raise UserError(
            f"--nproc_per_node {requested} asks for more processes than the {gpu_count} GPU(s) "
            "on this node; use at most one process per GPU."
        )
    return requested


def _parse_cluster_spec(raw_spec: str) -> tuple[dict[str, list[str]], str, int]:
    """Return (cluster pools, this replica's pool, its index), checked for consistency."""
    try:
        spec = json.loads(raw_spec)
    except json.JSONDecodeError as error:
        raise UserError(f"CLUSTER_SPEC is not valid JSON ({error}).") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict):
        raise UserError('CLUSTER_SPEC has no "cluster" object mapping worker pools to addresses.')
    cluster = spec["cluster"]
    _check_pools(cluster)
    pool, index = _this_replica(spec.get("task"))
    replicas = len(cluster.get(pool, []))
    if not 0 <= index < replicas:
        raise UserError(
            f"CLUSTER_SPEC says this replica is {pool} index {index}, "
            f"but {pool} lists {replicas} replica(s)."
        )
    return cluster, pool, index


def _check_pools(cluster: dict) -> None:
    for name, addresses in cluster.items():
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise UserError(f'CLUSTER_SPEC pool "{name}" must be a list of "host:port" strings.')
    chief = cluster.get(CHIEF_POOL)
    if not chief:
        raise UserError(f'CLUSTER_SPEC has no "{CHIEF_POOL}": every job needs a chief.')
    if len(chief) != 1:
        raise UserError(
            f'CLUSTER_SPEC "{CHIEF_POOL}" has {len(chief)} replicas; the chief pool must have '
            f'exactly 1 (put the other nodes in "{WORKER_POOL}").'
        )


def _this_replica(task: object) -> tuple[str, int]:
    """This replica's pool and index, from CLUSTER_SPEC's "task"."""
    if not isinstance(task, dict) or "type" not in task:
        raise UserError('CLUSTER_SPEC has no "task" object saying which replica this is.')
    pool = task["type"]
    if pool in FOREIGN_POOLS:
        raise UserError(
            f"This replica is in {pool} ({FOREIGN_POOLS[pool]}), which must run its own image; "
            f"this training image runs only in {CHIEF_POOL} and {WORKER_POOL}."
        )
    if pool not in (CHIEF_POOL, WORKER_POOL):
        raise UserError(f'CLUSTER_SPEC task type "{pool}" is not a Vertex AI worker pool.')
    index = task.get("index", 0)
    if not isinstance(index, int) or isinstance(index, bool):
        raise UserError(f'CLUSTER_SPEC task index must be an integer, got "{index}".')
    return pool, index


def _split_address(address: str, pool_name: str) -> tuple[str, int]:
    host, sep, port_text = address.rpartition(":")
    if not sep:
        return address, VERTEX_RENDEZVOUS_PORT
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UserError(f'CLUSTER_SPEC address "{address}" in {pool_name} is not "host:port".')
    return host, int(port_text)
