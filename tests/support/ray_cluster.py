"""A real two-node Ray cluster on this machine, for the Ray tests: `ray start --head` and a
second `ray start --address` joining it, each in its own directory (as separate machines
share no disk) with its own CPUs, both stopped with everything they started."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.helpers import free_port, trainer_env, wait_until

RAY = str(Path(sys.executable).with_name("ray"))


@dataclass
class RayCluster:
    address: str
    """host:port of the head's GCS, what `python -m trainer.ray --address` takes."""
    dashboard: str
    """http://host:port of the head's dashboard, what job submission takes."""
    nodes: list[subprocess.Popen]
    env: dict[str, str]
    temp_dir: Path
    """The head's `--temp-dir`: short, under /tmp, since Ray's socket paths inside it must
    fit an AF_UNIX address (107 bytes), which a pytest-xdist tmp_path may not leave room for."""

    def stop(self) -> None:
        """Kill each `ray start --block` with its whole process group (raylet, GCS,
        dashboard, workers): nothing is left behind, and no other Ray is touched."""
        for node in reversed(self.nodes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
            node.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def start_ray_cluster(root: Path, cache_dir: Path, cpus_per_node: int = 1) -> RayCluster:
    """Head and worker node, `cpus_per_node` CPUs each, started in `root/node0` and
    `root/node1` (a Ray worker's files go to its node's directory: RAY_CHDIR_TO_TRIAL_DIR=0).

    The nodes' environment is the trainer's test environment (cache, offline Hub): Ray
    workers inherit their node's environment, not the driver's.

    The head starts its dashboard (job submission's server) as Ray does by default, not
    with `--include-dashboard true`: Ray gives a dashboard a fixed 20 s to register
    (`ray._private.services.start_api_server`) and, when it was asked for explicitly,
    kills the head if it is late, which a loaded 2-core machine often is. Started by
    default, a late dashboard goes on starting, and the cluster is ready once it answers
    (`alive_nodes` asks it)."""
    port, dashboard_port = free_port(), free_port()
    # `python` on the nodes is this environment's, as it is the image's on a real cluster
    # (a submitted job's entrypoint runs `python -m trainer.ray`).
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = trainer_env(cache_dir, RAY_CHDIR_TO_TRIAL_DIR="0", RAY_USAGE_STATS_ENABLED="0",
                      OMP_NUM_THREADS="1", PATH=path)  # fmt: skip
    common = ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", str(cpus_per_node),
              "--num-gpus", "0", "--disable-usage-stats"]  # fmt: skip
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-"))
    head = [RAY, "start", "--head", "--port", str(port), "--temp-dir", str(temp_dir),
            "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(dashboard_port), *common]  # fmt: skip
    worker = [RAY, "start", "--address", f"127.0.0.1:{port}", *common]
    nodes = [start_node(root, 0, head, env)]
    cluster = RayCluster(
        f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard_port}", nodes, env, temp_dir
    )
    try:  # a cluster that did not start leaves no node behind (a worker outlives its head)
        head_log = root / "ray-node0.log"
        wait_until(lambda: "Ray runtime started" in head_log.read_text()
                   or nodes[0].poll() is not None, 120, "the Ray head")  # fmt: skip
        assert nodes[0].poll() is None, head_log.read_text()
        nodes.append(start_node(root, 1, worker, env))
        wait_until(lambda: alive_nodes(cluster) == 2 or any(n.poll() is not None for n in nodes),
                   300, "both Ray nodes and the dashboard")  # fmt: skip
        assert all(node.poll() is None for node in nodes), head_log.read_text()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def alive_nodes(cluster: RayCluster) -> int:
    """Alive nodes, as `ray list nodes` says (a real client of the head's state API)."""
    done = subprocess.run([RAY, "list", "nodes", "--address", cluster.dashboard,
                           "--filter", "state=ALIVE"], capture_output=True, text=True,
                          env=cluster.env)  # fmt: skip
    return len(re.findall(r"\bALIVE\b", done.stdout))


def start_node(root: Path, rank: int, command: list[str], env: dict) -> subprocess.Popen:
    """`ray start --block` in `root/node{rank}`, output to `root/ray-node{rank}.log`, in its
    own process group (stopped with everything it started)."""
    node_dir = root / f"node{rank}"
    node_dir.mkdir(parents=True, exist_ok=True)
    with (root / f"ray-node{rank}.log").open("w") as log:
        return subprocess.Popen(command, cwd=node_dir, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
