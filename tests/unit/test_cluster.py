"""Topology from Vertex AI's environment: plain dicts in, plain data out."""

import json

import pytest

from trainer.common.errors import UserError
from trainer.config.topology import resolve_topology


def cluster_spec(task_type, index=0, workers=2, extra_pools=None, **extra):
    """CLUSTER_SPEC shaped like Vertex AI's documentation (reduction server pool included)."""
    cluster = {
        "workerpool0": ["cmle-training-workerpool0-ab-0:2222"],
        "workerpool1": [f"cmle-training-workerpool1-ab-{i}:2222" for i in range(workers)],
        "workerpool2": [
            "cmle-training-workerpool2-ab-0:2222",
            "cmle-training-workerpool2-ab-1:2222",
        ],
        **(extra_pools or {}),
    }
    spec = {
        "cluster": cluster,
        "environment": "cloud",
        "task": {"type": task_type, "index": index, "trial": "1"},
        "job": {"worker_pool_specs": [{"replica_count": 1}]},
        **extra,
    }
    return {"CLUSTER_SPEC": json.dumps(spec)}


def test_no_cluster_spec_is_one_local_node():
    topology = resolve_topology({}, gpu_count=0)
    assert (topology.num_nodes, topology.node_rank, topology.role) == (1, 0, "chief")
    assert (topology.master_addr, topology.master_port) == ("127.0.0.1", 29500)
    assert topology.nproc_per_node == 1
    assert topology.world_size == 1


def test_chief_is_rank_zero_and_rendezvous_is_its_local_address():
    """The chief's name in CLUSTER_SPEC is a Service the workers use; the chief itself
    rendezvouses locally, as Vertex AI's own PyTorch launcher does."""
    topology = resolve_topology(cluster_spec("workerpool0"), gpu_count=8)
    assert topology.node_rank == 0
    assert topology.role == "chief"
    assert topology.num_nodes == 3
    assert topology.master_addr == "127.0.0.1"
    assert topology.master_port == 2222
    assert topology.world_size == 24


@pytest.mark.parametrize("index", [0, 1])
def test_worker_rank_is_index_plus_one(index):
    topology = resolve_topology(cluster_spec("workerpool1", index=index), gpu_count=4)
    assert topology.node_rank == index + 1
    assert topology.role == "worker"
    assert topology.master_addr == "cmle-training-workerpool0-ab-0"
    assert topology.nproc_per_node == 4


def test_vertex_node_level_rank_and_world_size_are_ignored():
    env = {**cluster_spec("workerpool1", index=1), "RANK": "2", "WORLD_SIZE": "3"}
    topology = resolve_topology(env, gpu_count=8)
    assert topology.world_size == 24  # processes, not Vertex's node count
    assert topology.node_rank == 2


def test_single_replica_spec_without_workers():
    env = {
        "CLUSTER_SPEC": json.dumps(
            {"cluster": {"workerpool0": ["host:2222"]}, "task": {"type": "workerpool0", "index": 0}}
        )
    }
    topology = resolve_topology(env, gpu_count=1)
    assert (topology.num_nodes, topology.node_rank) == (1, 0)


def test_overrides_for_processes_and_port():
    topology = resolve_topology(
        cluster_spec("workerpool0"), gpu_count=8, nproc_per_node=2, master_port=3333
    )
    assert topology.nproc_per_node == 2
    assert topology.master_port == 3333
    assert resolve_topology({}, gpu_count=0, nproc_per_node=2).world_size == 2


@pytest.mark.parametrize(
    ("env", "gpus", "nproc", "message"),
    [
        ({"CLUSTER_SPEC": "{not json"}, 0, None, "not valid JSON"),
        ({"CLUSTER_SPEC": json.dumps({"task": {}})}, 0, None, 'no "cluster"'),
        (
            {
                "CLUSTER_SPEC": json.dumps(
                    {"cluster": {"workerpool1": ["a:1"]}, "task": {"type": "workerpool1"}}
                )
            },
            0,
            None,
            "needs a chief",
        ),
        (
            {
                "CLUSTER_SPEC": json.dumps(
                    {"cluster": {"workerpool0": ["a:1", "b:1"]}, "task": {"type": "workerpool0"}}
                )
            },
            0,
            None,
            "exactly 1",
        ),
        ({"CLUSTER_SPEC": json.dumps({"cluster": {"workerpool0": ["a:1"]}})}, 0, None, 'no "task"'),
        (cluster_spec("workerpool2"), 0, None, "Reduction Server"),
        (
            cluster_spec("workerpool3", extra_pools={"workerpool3": ["e:2222"]}),
            0,
            None,
            "evaluators",
        ),
        (cluster_spec("workerpool7"), 0, None, "not a Vertex AI worker pool"),
        (cluster_spec("workerpool1", index=5), 0, None, "lists 2 replica"),
        (cluster_spec("workerpool1", index="0"), 0, None, "must be an integer"),
        (
            {
                "CLUSTER_SPEC": json.dumps(
                    {"cluster": {"workerpool0": ["host:port"]}, "task": {"type": "workerpool0"}}
                )
            },
            0,
            None,
            "host:port",
        ),
        (
            {
                "CLUSTER_SPEC": json.dumps(
                    {"cluster": {"workerpool0": "a:1"}, "task": {"type": "workerpool0"}}
                )
            },
            0,
            None,
            "must be a list",
        ),
        ({}, 4, 8, "more processes than the 4 GPU"),
        ({}, 0, 0, "at least 1"),
    ],
)
def test_bad_cluster_input_is_one_clear_error(env, gpus, nproc, message):
    with pytest.raises(UserError, match=message) as error:
        resolve_topology(env, gpu_count=gpus, nproc_per_node=nproc)
    assert "\n" not in str(error.value)


def test_bad_master_port():
    with pytest.raises(UserError, match="not a TCP port"):
        resolve_topology({}, gpu_count=0, master_port=70000)
