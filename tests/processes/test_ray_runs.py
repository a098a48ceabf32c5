"""`python -m trainer.ray` and `python -m trainer.ray_submit` on a real two-node Ray cluster
started on this machine (tests/support/ray_cluster.py), and their refusals before anything
waits (how workers are planned is tests/unit/test_ray.py's)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    RESULT_LINE,
    complete_from,
    free_port,
    trainer_env,
    wait_until,
)
from tests.support.ray_cluster import RAY, start_ray_cluster
from trainer.storage.store import open_store

TINY_TRAINING = [
    *DEMO_SPEECH_FLAGS,
    "--per_device_train_batch_size", "4",
    "--eval_strategy", "no",
    "--logging_steps", "1",
    "--learning_rate", "1e-3",
    "--seed", "7",
]  # fmt: skip
TINY_RUN = [*TINY_TRAINING, "--output_dir", "out"]
STEP_LINE = re.compile(r"step (\d+)/(\d+) ")


def run(module: str, args: list[str], env: dict, cwd, timeout: float = 900):
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    return done.returncode, done.stdout, done.stderr


# Refusals without a cluster ------------------------------------------------------------


def test_no_cluster_at_the_address_is_one_error_line(tmp_path, demo_cache):
    address = f"127.0.0.1:{free_port()}"
    code, out, err = run("trainer.ray", ["--address", address], trainer_env(demo_cache), tmp_path)
    assert code == 2
    assert err.strip().splitlines() == [err.strip().splitlines()[-1]]
    assert err.startswith(f"error: no Ray cluster at {address}"), err


def test_submitting_to_no_dashboard_is_one_error_line(tmp_path, demo_cache):
    address = f"http://127.0.0.1:{free_port()}"
    code, out, err = run("trainer.ray_submit", ["--address", address],
                         trainer_env(demo_cache), tmp_path)  # fmt: skip
    assert code == 2
    assert [line for line in err.splitlines() if line.strip()][-1].startswith(
        f"error: no Ray cluster at {address}"
    ), err


# On a real cluster ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, demo_cache):
    started = start_ray_cluster(tmp_path_factory.mktemp("ray"), demo_cache)
    yield started
    started.stop()


@pytest.mark.slow
def test_more_workers_than_the_cluster_holds_fail_before_fit(cluster, tmp_path, demo_assets):
    code, out, err = run("trainer.ray", ["--address", cluster.address, "--num_workers", "3",
                                         *TINY_RUN], cluster.env, tmp_path)  # fmt: skip
    assert code == 2, out + err
    assert "error: 3 worker(s) of 1 CPU each cannot all be placed" in err
    assert "step " not in out


@pytest.mark.slow
def test_the_demo_trains_with_two_ray_workers(cluster, tmp_path, spoken_assets):
    """The demo as shipped (no model, no dataset: its recipe, its assets, its evaluation at
    step 0 and closing result line), on two Ray workers (one per node) instead of torchrun.
    Cut to 4 steps, evaluated and saved at the last: that the recipe's 280 steps learn
    English is tests/processes/test_demo_run.py's; here 4 steps lower the evaluation loss."""
    started = time.monotonic()
    code, out, err = run("trainer.ray", ["--address", cluster.address, "--num_workers", "2",
                                         "--max_steps", "4", "--eval_steps", "4",
                                         "--save_steps", "4", "--output_dir", "out"],
                         cluster.env, tmp_path)  # fmt: skip
    assert code == 0, (out + err)[-4000:]
    result = RESULT_LINE.search(out)
    assert result, out[-3000:]
    assert result.group(3) == "4" and result.group(4) == "24", result.group(0)
    losses = dict(re.findall(r"eval at step (\d+) \| loss ([\d.]+)", out + err))
    assert sorted(losses, key=int) == ["0", "4"], (out + err)[-3000:]
    assert float(losses["4"]) < float(losses["0"]), losses
    assert "world size" not in err
    first_step = re.search(r"time to first step: ([\d.]+) s", out)
    print(f"ray demo: {time.monotonic() - started:.0f} s in all; {first_step.group(0)}")


@pytest.mark.slow
def test_a_killed_worker_is_replaced_and_the_run_resumes_as_if_uninterrupted(
    cluster, tmp_path, demo_assets
):
    """Kill the rank-1 worker's process once checkpoint-5 is complete (15 steps still to go:
    20 steps take about 15 s, and a later kill could land after training): Ray starts the
    workers again, they resume from the newest complete checkpoint, and the model ends
    with the weights of a run never interrupted."""
    from safetensors.torch import load_file

    args = [*TINY_RUN, "--model_name_or_path", str(demo_assets.model_dir),
            "--dataset_name", str(demo_assets.dataset_dir), "--max_steps", "20",
            "--save_steps", "5", "--save_total_limit", "2", "--num_workers", "2",
            "--address", cluster.address]  # fmt: skip
    reference = tmp_path / "reference"
    reference.mkdir()
    code, out, err = run("trainer.ray", [*args, "--checkpoint_dir", str(reference / "ckpt"),
                                         "--model_dir", str(reference / "model")],
                         cluster.env, reference)  # fmt: skip
    assert code == 0, (out + err)[-3000:]

    killed = tmp_path / "killed"
    killed.mkdir()
    store = open_store(str(killed / "ckpt"))
    log = (killed / "driver.log").open("w")
    driver = subprocess.Popen(
        [sys.executable, "-m", "trainer.ray", *args, "--checkpoint_dir", str(killed / "ckpt"),
         "--model_dir", str(killed / "model")],
        cwd=killed, env=cluster.env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_until(lambda: complete_from(store, 5) or driver.poll() is not None, 600,
                   "a complete checkpoint of step 5 or later")  # fmt: skip
        assert driver.poll() is None, (killed / "driver.log").read_text()[-4000:]
        pid = train_worker_pid(cluster, world_rank=1)
        os.kill(pid, 9)
        driver.wait(timeout=900)
    finally:
        if driver.poll() is None:
            driver.kill()
    output = (killed / "driver.log").read_text()
    assert driver.returncode == 0, output[-4000:]
    resumed = re.findall(r"resuming from out/checkpoint-(\d+)", output)
    assert resumed and int(resumed[-1]) >= 5, output[-4000:]
    after = [int(s) for s, _ in STEP_LINE.findall(output.split("resuming from")[-1])]
    if int(resumed[-1]) < 20:
        assert min(after) == int(resumed[-1]) + 1, "nothing trained twice past the checkpoint"
    else:  # on a loaded machine the kill can land after the last checkpoint: none trained
        assert after == [] and "checkpoint-20 holds the last step" in output, output[-4000:]
    expected = load_file(reference / "model" / "model.safetensors")
    got = load_file(killed / "model" / "model.safetensors")
    worst = max((expected[k] - got[k]).abs().max().item() for k in expected)
    assert worst < 1e-5, f"resumed weights differ from the uninterrupted run by {worst}"
    print(f"killed worker pid {pid}; resumed from checkpoint-{resumed[-1]}; max diff {worst:.3g}")


def train_worker_pid(cluster, world_rank: int) -> int:
    """The process of the Ray Train worker of `world_rank`, from Ray's state API (the
    workers are started in rank order, so the actors' pids sort the same way)."""
    done = subprocess.run([RAY, "list", "actors", "--address", cluster.dashboard,
                           "--filter", "class_name=RayTrainWorker", "--filter", "state=ALIVE",
                           "--format", "json"], capture_output=True, text=True,
                          env=cluster.env, check=True)  # fmt: skip
    pids = sorted(actor["pid"] for actor in json.loads(done.stdout))
    assert len(pids) == 2, done.stdout
    return pids[world_rank]


@pytest.mark.slow
def test_a_job_submitted_from_outside_runs_and_its_logs_come_back(cluster, tmp_path, demo_assets):
    env = {**cluster.env, "HF_TOKEN": "hf_not_printed_anywhere"}
    code, out, err = run("trainer.ray_submit", [
        "--address", cluster.dashboard, *TINY_TRAINING, "--max_steps", "2", "--num_workers", "1",
        "--model_name_or_path", str(demo_assets.model_dir),
        "--dataset_name", str(demo_assets.dataset_dir),
        "--output_dir", str(tmp_path / "job-out"),
        "--ray_storage_path", str(tmp_path / "ray-results")], env, tmp_path)  # fmt: skip
    assert code == 0, (out + err)[-4000:]
    job = re.search(r"submitted Ray job (\S+)", out).group(1)
    assert f"Ray job {job}: SUCCEEDED" in out
    assert "step 2/2" in out and "hf_not_printed_anywhere" not in out + err
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard)
    assert str(client.get_job_status(job).value) == "SUCCEEDED"
    assert "step 2/2" in client.get_job_logs(job)


@pytest.mark.slow
def test_a_cluster_python_without_the_dependencies_is_refused_before_the_job(
    cluster, tmp_path, demo_assets
):
    """The job's `python` is a standard-library-only one (first on the job's PATH, as on a
    stock Ray image): one probe job reports what it lacks, and the run's job is never
    submitted."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard)
    before = {job.submission_id for job in client.list_jobs()}
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    env = {**cluster.env, "PATH": f"{bare / 'bin'}{os.pathsep}{cluster.env['PATH']}"}
    code, out, err = run("trainer.ray_submit", [
        "--address", cluster.dashboard, "--env_var", "PATH", *TINY_TRAINING,
        "--model_name_or_path", str(demo_assets.model_dir),
        "--dataset_name", str(demo_assets.dataset_dir),
        "--output_dir", str(tmp_path / "job-out")], env, tmp_path)  # fmt: skip
    assert code == 2, (out + err)[-4000:]
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("error: the Ray cluster's python lacks torch, deepspeed, transformers, ")
    ), err
    assert "docker/Dockerfile.ray" in err and "submitted Ray job" not in out
    new = [job for job in client.list_jobs() if job.submission_id not in before]
    assert [job.entrypoint.split()[:2] for job in new] == [["python", "-c"]], "the probe only"
