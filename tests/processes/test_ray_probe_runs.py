"""trainer.ray_submit's check of the cluster's Python, run by real interpreters: a bare one (the
standard library only, as on a stock Ray image's node) and this one, by hand and as the probe
job a shell runs for Ray's job API on loopback. (The whole submission on a real cluster:
tests/processes/test_ray_runs.py, slow.)"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.helpers import answer_json
from trainer import ray_submit
from trainer.common.errors import UserError


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A Python with the standard library only, as on a stock Ray image's node without the
    project's dependencies."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv / "bin" / "python"


def probe_report(python: Path, required) -> dict:
    """What ray_submit's probe job prints, run by `python` as the cluster's shell would."""
    names = [req.name for req in required]
    done = subprocess.run([str(python), "-c", ray_submit.PROBE, *names], capture_output=True,
                          text=True, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().removeprefix(ray_submit.PROBE_MARK))


def test_a_cluster_python_without_the_dependencies_is_named_in_the_refusal(bare_python):
    required = ray_submit.required_distributions()
    names = [req.name for req in required]
    assert {"torch", "transformers", "deepspeed"} <= set(names)
    report = probe_report(bare_python, required)
    assert report == dict.fromkeys(names)
    assert ray_submit.missing_packages(required, report) == f"lacks {', '.join(names)}"


def test_this_pythons_dependencies_pass_and_one_out_of_range_is_named_with_the_range():
    required = ray_submit.required_distributions()
    here = probe_report(Path(sys.executable), required)
    assert ray_submit.missing_packages(required, here) == ""
    stock = here | {"torch": "2.5.1+cu121", "transformers": None}  # a stock Ray image's
    torch = next(req for req in required if req.name == "torch")
    assert ray_submit.missing_packages(required, stock) == (
        f"lacks transformers; has torch 2.5.1+cu121 (needs {torch.specifier})"
    )


class ShellJobsApi(http.server.BaseHTTPRequestHandler):
    """Ray's job REST API as a cluster answers it, each job's entrypoint run by a shell whose
    PATH starts with `bin` (the cluster's `python`), to its end, when it is submitted."""

    bin: Path
    jobs: dict[str, dict] = {}

    def do_GET(self):
        import ray

        parts = self.path.strip("/").split("/")  # api, version | api, jobs, ID[, logs]
        if parts[1] == "version":
            self._answer({"ray_version": ray.__version__, "version": "4"})
        elif len(parts) == 4:
            self._answer({"logs": self.jobs[parts[2]]["logs"]})
        else:
            job = self.jobs[parts[2]]
            self._answer({key: job[key] for key in ("type", "status", "entrypoint")})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        path = f"{self.bin}:{os.environ['PATH']}"
        done = subprocess.run(body["entrypoint"], shell=True, capture_output=True, text=True,
                              env={**os.environ, "PATH": path})  # fmt: skip
        job_id = f"raysubmit_{len(self.jobs)}"
        self.jobs[job_id] = {
            "type": "SUBMISSION",
            "entrypoint": body["entrypoint"],
            "status": "SUCCEEDED" if done.returncode == 0 else "FAILED",
            "logs": done.stdout + done.stderr,
        }
        self._answer({"submission_id": job_id, "job_id": job_id})

    def _answer(self, payload: dict, status: int = 200) -> None:
        answer_json(self, status, payload)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("python", ["bare", "this"])
def test_the_probe_job_reports_the_cluster_pythons_packages(python, bare_python):
    """The probe job, submitted by the real client to the job API on loopback and run by the
    cluster's `python` as Ray runs an entrypoint: a Python without the dependencies is refused
    in one line naming them and both ways to a Python that has them; this Python passes. (The
    whole submission on a real cluster: tests/processes/test_ray_runs.py, slow.)"""
    ShellJobsApi.bin = (bare_python if python == "bare" else Path(sys.executable)).parent
    ShellJobsApi.jobs = {}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ShellJobsApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = ray_submit.connect(f"http://127.0.0.1:{server.server_address[1]}")
        required = ray_submit.required_distributions()
        job_env = ray_submit.runtime_env(["HF_TOKEN"], {})
        del job_env["working_dir"], job_env["excludes"]  # no upload: the API has no packages
        if python == "this":
            ray_submit.check_cluster_python(client, job_env, required)
            return
        with pytest.raises(UserError) as refusal:
            ray_submit.check_cluster_python(client, job_env, required)
    finally:
        server.shutdown()
    names = ", ".join(req.name for req in required)
    assert str(refusal.value) == f"the Ray cluster's python lacks {names}; {ray_submit.CLUSTER_FIX}"
    assert "docker/Dockerfile.ray" in str(refusal.value) and "runtime" in str(refusal.value)
    assert [job["status"] for job in ShellJobsApi.jobs.values()] == ["SUCCEEDED"]
