"""config.yaml and hptuning.yaml: the generator's output, valid Vertex AI messages, and a
command line that every node of the job turns into the right launch plan (`trainer.jobspec`
and the launcher in-process). --python_package, which builds the checkout's sdist:
tests/processes/test_jobspec_runs.py."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from google.cloud.aiplatform_v1.types import CustomJobSpec, HyperparameterTuningJob
from google.protobuf import json_format

from tests.support.gcs_emulator import BUCKET
from tests.support.helpers import (
    CONFIG,
    HPTUNING,
    REPO_ROOT,
    jobspec_refusal,
    launch_is_a_tripwire,
    parse_strictly,
    trainer_env,
)
from tests.support.job_specs import rendered
from trainer.command_line.recipes import RECIPES_DIR
from trainer.config.topology import GPUS_PER_REPLICA_VARIABLE
from trainer.jobspec import __main__ as jobspec
from trainer.jobspec.custom_job import DEFAULT_ENV, DEFAULT_IMAGE, SPOT_SAVE_INTERVAL_MINUTES
from trainer.preflight import vertex_machines
from trainer.settings.run_config import Hardware
from trainer.storage.store import open_store


def test_checked_in_specs_are_the_generators_output_for_the_defaults():
    files = jobspec.render([])
    assert CONFIG.read_text() == files["config.yaml"], "regenerate: python -m trainer.jobspec"
    assert HPTUNING.read_text() == files["hptuning.yaml"], "regenerate: python -m trainer.jobspec"


def test_check_flag_reports_drift(tmp_path, capsys):
    with pytest.raises(SystemExit) as in_sync:
        jobspec.main(["--check", "--dest", str(REPO_ROOT)])
    assert in_sync.value.code == 0, capsys.readouterr().out
    (tmp_path / "config.yaml").write_text(CONFIG.read_text().replace("replicaCount: 1", "x: 1"))
    (tmp_path / "hptuning.yaml").write_text(HPTUNING.read_text())
    with pytest.raises(SystemExit) as drifted:
        jobspec.main(["--check", "--dest", str(tmp_path)])
    assert drifted.value.code == 1
    out = capsys.readouterr().out
    assert "config.yaml" in out and "hptuning.yaml" not in out


def test_checked_in_specs_parse_strictly_into_vertex_messages():
    job = parse_strictly(yaml.safe_load(CONFIG.read_text()), CustomJobSpec)
    tuning = parse_strictly(yaml.safe_load(HPTUNING.read_text()), HyperparameterTuningJob)
    chief, workers = job.worker_pool_specs
    assert (chief.replica_count, workers.replica_count) == (1, 1)
    assert chief.machine_spec.machine_type == "a2-highgpu-8g"
    assert chief.machine_spec.accelerator_count == 8
    assert chief.machine_spec.accelerator_type.name == "NVIDIA_TESLA_A100"
    assert chief.container_spec.image_uri == DEFAULT_IMAGE
    assert list(chief.container_spec.args) == ["whisper-small.yaml", "--deepspeed", "zero2"]
    pools = yaml.safe_load(CONFIG.read_text())["workerPoolSpecs"]
    assert pools[0] == {**pools[1], "replicaCount": 1}, "the chief is a worker, one replica"
    assert chief.disk_spec.boot_disk_size_gb >= 100
    assert job.base_output_directory.output_uri_prefix.startswith("gs://")
    assert job.scheduling.timeout.total_seconds() == 24 * 3600
    assert job.scheduling.restart_job_on_worker_restart
    assert "disableRetries" in yaml.safe_load(CONFIG.read_text())["scheduling"]
    assert not job.scheduling.disable_retries, "true would turn the restarts above off"
    assert tuning.trial_job_spec == job
    assert [(m.metric_id, m.goal.name) for m in tuning.study_spec.metrics] == [("wer", "MINIMIZE")]
    learning_rate, warmup = tuning.study_spec.parameters
    assert learning_rate.parameter_id == "learning_rate"
    assert learning_rate.scale_type.name == "UNIT_LOG_SCALE"
    assert learning_rate.double_value_spec.min_value < learning_rate.double_value_spec.max_value
    assert warmup.parameter_id == "warmup_steps" and warmup.integer_value_spec.max_value > 0
    assert 1 <= tuning.parallel_trial_count < tuning.max_trial_count


def test_a_misspelled_field_is_caught():
    spec = yaml.safe_load(CONFIG.read_text())
    spec["workerPoolSpecs"][1]["replicaCont"] = spec["workerPoolSpecs"][1].pop("replicaCount")
    with pytest.raises(json_format.ParseError, match="replicaCont"):
        parse_strictly(spec, CustomJobSpec)
    tuning = yaml.safe_load(HPTUNING.read_text())
    tuning["studySpec"]["metrics"][0]["metric_Id"] = "wer"
    with pytest.raises(json_format.ParseError, match="metric_Id"):
        parse_strictly(tuning, HyperparameterTuningJob)


@pytest.mark.parametrize(
    ("machine", "gpus"),
    [("n1-standard-4", 1), ("n1-standard-8", 2), ("n1-standard-16", 4), ("n1-standard-96", 4),
     ("g2-standard-4", 1), ("g2-standard-48", 4), ("a2-highgpu-8g", 8)],
)  # fmt: skip
def test_a_machine_gets_the_gpus_its_vcpus_can_feed_unless_asked(machine, gpus):
    def pools(*argv):
        job = rendered("--machine_type", machine, *argv)["config.yaml"]
        return {pool["machineSpec"]["acceleratorCount"] for pool in job["workerPoolSpecs"]}

    assert pools() == {gpus}
    offered = vertex_machines.GPU_MACHINES[machine][1]
    assert pools("--accelerator_count", str(offered[-1])) == {offered[-1]}  # an explicit ask


@pytest.mark.parametrize(
    "argv",
    [
        ["--nodes", "4", "--spot", "--machine_type", "a3-highgpu-8g", "--accept_tcp_between_nodes"],
        ["--spot", "--max_wait_hours", "3", "--save_interval_minutes", "5"],
        ["--nodes", "1", "--machine_type", "n1-standard-8", "--accelerator_count", "2"],
        ["--machine_type", "g2-standard-48", "--env", "NCCL_DEBUG=INFO", "EXTRA=1"],
        ["--deepspeed", "zero3", "--max_steps", "100", "--learning_rate", "3e-5"],
        ["--flex_start", "--max_wait_hours", "6", "--timeout_hours", "168"],
        ["--flex_start", "--machine_type", "g2-standard-96"],
        ["--image", "us-docker.pkg.dev/p/r/trainer@sha256:" + "ab" * 32],
        ["--machine_type", "a3-highgpu-8g", "--nodes", "1"],  # one node: NVLink only
        ["--machine_type", "a3-megagpu-8g", "--accept_tcp_between_nodes"],
        ["--recipe", "whisper-large-v3-lora.yaml", "--machine_type", "g2-standard-12"],
    ],
)
def test_generated_specs_parse_strictly_and_say_what_the_flags_asked(argv):
    specs = rendered(*argv)
    job = parse_strictly(specs["config.yaml"], CustomJobSpec)
    assert parse_strictly(specs["hptuning.yaml"], HyperparameterTuningJob).trial_job_spec == job
    options, training_flags = jobspec.parse_arguments(argv)
    gpu, count = vertex_machines.GPU_MACHINES[options.machine_type]
    pools = job.worker_pool_specs
    assert [pool.replica_count for pool in pools] == [1] + [options.nodes - 1] * (options.nodes > 1)
    for pool in pools:
        assert pool.machine_spec.machine_type == options.machine_type
        assert pool.machine_spec.accelerator_type.name == gpu
        expected_count = options.accelerator_count or vertex_machines.default_gpu_count(
            options.machine_type, count
        )
        assert pool.machine_spec.accelerator_count == expected_count
        args = list(pool.container_spec.args)
        expected_args = [options.recipe, "--deepspeed", options.deepspeed, *training_flags]
        if options.spot and "--save_interval_minutes" not in training_flags:
            expected_args += [
                "--save_interval_minutes",
                str(SPOT_SAVE_INTERVAL_MINUTES),
            ]  # a Spot job saves by time
        assert args == expected_args
        env = {item.name: item.value for item in pool.container_spec.env}
        expected_env = DEFAULT_ENV | dict(item.split("=", 1) for item in options.env)
        gpus = str(pool.machine_spec.accelerator_count)  # what the launcher must see
        assert env == expected_env | {GPUS_PER_REPLICA_VARIABLE: gpus}
        assert pool.container_spec.image_uri == options.image
    strategy = "SPOT" if options.spot else "FLEX_START" if options.flex_start else None
    assert job.scheduling.strategy.name == (strategy or "STRATEGY_UNSPECIFIED")
    # every job: a restarted worker restarts the whole job, and Vertex AI may retry it
    assert job.scheduling.restart_job_on_worker_restart and not job.scheduling.disable_retries
    if options.flex_start:  # Vertex AI's default wait is a day; 0 would mean no limit
        wait_hours = options.max_wait_hours if options.max_wait_hours is not None else 24
        assert job.scheduling.max_wait_duration.total_seconds() == wait_hours * 3600
    elif options.spot and options.max_wait_hours is not None:
        assert job.scheduling.max_wait_duration.total_seconds() == options.max_wait_hours * 3600
    else:
        assert not job.scheduling.max_wait_duration


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--accelerator_count", "4"], "a2-highgpu-8g offers 8 x NVIDIA_TESLA_A100, not "
         "--accelerator_count 4 (use a2-highgpu-4g)"),
        (["--nodes", "0"], "--nodes must be at least 1"),
        (["--base_output_dir", "/tmp/out"], "--base_output_dir must be a gs:// URI"),
        (["--machine_type", "g2-standard-8", "--accelerator_type", "NVIDIA_TESLA_T4"],
         "g2-standard-8 comes with NVIDIA_L4, not NVIDIA_TESLA_T4"),
        (["--machine_type", "a4-highgpu-8g"], "not in the GPU machine table"),
        (["--learning_rte", "1e-5"], "Unknown flag(s): --learning_rte"),
        (["--recipe", "mine.yaml"], "is not shipped in the image"),
        (["--deepspeed", "local.json"], "nor a /gcs/BUCKET/... path"),
        (["--env", "HF_TOKEN=hf_abc"], "HF_TOKEN looks like a secret"),
        (["--push_to_hub", "--hub_token", "hf_abc"], "--hub_token looks like a secret"),
        (["--image", "us-docker.pkg.dev/p/r/trainer:latest"], "is not pinned"),
        (["--image", "us-docker.pkg.dev/p/r/trainer"], "is not pinned"),
        (["--image", "localhost:5000/trainer"], "is not pinned"),
        (["--flex_start", "--spot"], "--flex_start and --spot are two scheduling strategies"),
        (["--flex_start", "--machine_type", "n1-standard-8"],
         "--flex_start needs L4, A100, H100 or H200 GPUs; n1-standard-8 has NVIDIA_TESLA_T4"),
        (["--flex_start", "--timeout_hours", "169"], "may run at most 168 hours"),
        (["--max_wait_hours", "6"], "--max_wait_hours only applies with --flex_start or --spot"),
        (["--flex_start", "--max_wait_hours", "-1"], "--max_wait_hours must be 0"),
        (["--spot", "--max_wait_hours", "-1"], "--max_wait_hours must be 0"),
        (["--spot", "--save_interval_minutes", "0"], "--save_interval_minutes must be more than 0"),
        (["--tensorboard", "projects/p/locations/l/tensorboards/1"],
         "--tensorboard needs --service_account"),
        (["--tensorboard", "my-board", "--service_account", "sa@p.iam.gserviceaccount.com"],
         "--tensorboard 'my-board' is not of the form projects/P/locations/L/tensorboards/ID"),
        (["--service_account", "trainer"], "--service_account 'trainer' is not of the form"),
        (["--network", "projects/my-project/global/networks/vpc"],
         "is not of the form projects/PROJECT_NUMBER/global/networks/NAME"),
        (["--reservation", "r1"], "is not of the form projects/P/zones/Z/reservations/NAME"),
        (["--reservation", "any", "--spot"], "--reservation and --spot"),
        (["--persistent_resource_id", "pool", "--flex_start"],
         "--persistent_resource_id and --flex_start"),
        (["--persistent_resource_id", "My_Pool"], "--persistent_resource_id 'My_Pool'"),
        (["--machine_type", "a3-megagpu-8g"],
         "--nodes 2 on a3-megagpu-8g: this image does not set up A3's GPUDirect-TCPX/TCPXO"),
        (["--machine_type", "a3-highgpu-8g", "--nodes", "4"], "pass --accept_tcp_between_nodes"),
        (["--dry-run"], "--dry-run in a job spec would make every node exit without training"),
    ],
)  # fmt: skip
def test_invalid_input_is_one_clear_error(argv, message, tmp_path, capsys):
    assert message in jobspec_refusal(argv, tmp_path, capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--machine_type", "n1-standard-8", "--bf16", "true"],
         "--bf16 needs an Ampere or newer GPU; this is Tesla T4"),
        (["--machine_type", "n1-standard-8", "--tf32", "true"], "--tf32 true needs an Ampere"),
        (["--metric_for_best_model", "f1"],
         "--metric_for_best_model f1 is not a metric of --task speech-recognition"),
        (["--report_to", "wandb"], "--report_to wandb: not installed in this image"),
        (["--deepspeed", "zero3", "--peft", "lora", "--load_in_8bit", "true"],
         "DeepSpeed cannot partition 8-bit weights"),
        (["--nodes", "2", "--machine_type", "g2-standard-12", "--accelerator_count", "1",
          "--nproc_per_node", "2"], "--nproc_per_node 2 asks for more processes than the 1 GPU"),
    ],
)  # fmt: skip
def test_a_job_its_nodes_would_refuse_is_refused_before_it_is_written(
    argv, message, tmp_path, capsys
):
    """The run resolved and checked as the chief's launcher will, on the spec's machines:
    what the nodes would refuse after Vertex AI provisioned them is one line here."""
    assert message in jobspec_refusal(argv, tmp_path, capsys)


def test_a_step_that_cannot_fit_the_machines_gpu_is_refused(tmp_path, capsys):
    """whisper-large-v3 fine-tuned in full on one L4 (24 GB) does not fit even with
    gradient checkpointing; with the recipe's LoRA it does (its config read from a model
    cache, as the launcher reads it)."""
    from tests.support.helpers import warm_hub_cache
    from trainer.tasks.speech_recognition.whisper_sizes import whisper_config

    cache = tmp_path / "models"
    warm_hub_cache(cache, "model", "openai/whisper-large-v3")
    snapshot = next((cache / "models--openai--whisper-large-v3" / "snapshots").iterdir())
    (snapshot / "config.json").write_text(whisper_config("large-v3").to_json_string())
    (tmp_path / "out").mkdir()
    machine = ["--recipe", "whisper-large-v3-lora.yaml", "--machine_type", "g2-standard-12",
               "--nodes", "1", "--cache_dir", str(cache)]  # fmt: skip
    error = jobspec_refusal([*machine, "--peft", "none"], tmp_path / "out", capsys)
    assert "a training step needs about" in error and "GiB NVIDIA L4" in error
    assert "what would fit: --peft lora (about" in error, error  # the recipe's own plan
    assert rendered(*machine)["config.yaml"]["workerPoolSpecs"], "LoRA fits: the job is written"


def test_a_deepspeed_json_in_the_bucket_is_checked_against_every_gpu_of_the_job(
    tmp_path, capsys, gcs
):
    """A JSON whose fixed train_batch_size suits 4 nodes but not 2 (8 A100s each, one
    example each): the nodes read it through the bucket's mount, the generator through
    Cloud Storage, and DeepSpeed's own comparison refuses the job of 2 nodes here."""
    folder = f"{BUCKET}/{os.urandom(4).hex()}"
    config = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 2}}  # fmt: skip
    open_store(f"gs://{folder}").write_text("ds.json", json.dumps(config))
    job = ["--deepspeed", f"/gcs/{folder}/ds.json", "--per_device_train_batch_size", "1",
           "--base_output_dir", f"gs://{folder}/run"]  # fmt: skip
    error = jobspec_refusal([*job, "--nodes", "2"], tmp_path, capsys)
    assert "ds train_batch_size=32 vs hf train_batch_size (calculated)=16" in error
    spec = rendered(*job, "--nodes", "4")["config.yaml"]
    assert f"/gcs/{folder}/ds.json" in spec["workerPoolSpecs"][0]["containerSpec"]["args"]
    missing = jobspec_refusal(["--deepspeed", f"/gcs/{folder}/none.json"], tmp_path, capsys)
    assert f"/gcs/{folder}/none.json does not exist: upload it first" in missing


PUBLISHED_JOB = json.dumps({"python_module": "", "package_uris": [], "job_args": []})


def vertex_cluster_spec(job: dict, pool: str, index: int, trial: str | None = None) -> str:
    """CLUSTER_SPEC as Vertex AI sets it on one replica of this job (Vertex AI docs,
    "Distributed training"), its "job" a JSON string without worker pools, as in the data
    published with the Vertex SDK (python-aiplatform test_cloud_profiler.py)."""
    cluster = {
        f"workerpool{number}": [
            f"cmle-training-workerpool{number}-3f1c9e2a-{replica}:2222"
            for replica in range(int(spec["replicaCount"]))
        ]
        for number, spec in enumerate(job["workerPoolSpecs"])
    }
    task = {"type": pool, "index": index} | ({"trial": trial} if trial else {})
    return json.dumps(
        {"cluster": cluster, "environment": "cloud", "task": task, "job": PUBLISHED_JOB}
    )


def vertex_env(job: dict, pool_number: int, index: int, trial: str | None = None) -> dict:
    """What Vertex AI puts in a replica's environment, plus the pool's own containerSpec.env."""
    base = job["baseOutputDirectory"]["outputUriPrefix"].rstrip("/") + "/"
    if trial:
        base += f"{trial}/"
    pool = job["workerPoolSpecs"][pool_number]
    return {
        "CLUSTER_SPEC": vertex_cluster_spec(job, f"workerpool{pool_number}", index, trial),
        "AIP_MODEL_DIR": f"{base}model/",
        "AIP_CHECKPOINT_DIR": f"{base}checkpoints/",
        "AIP_TENSORBOARD_LOG_DIR": f"{base}logs/",
        "CLOUD_ML_JOB_ID": "1234567890",
        # Node-level values the launcher must not pass on as process ranks.
        "RANK": str(pool_number and index + 1),
        "WORLD_SIZE": str(sum(int(p["replicaCount"]) for p in job["workerPoolSpecs"])),
        "MASTER_ADDR": "cmle-training-workerpool0-3f1c9e2a-0",
        "MASTER_PORT": "2222",
        **{item["name"]: item["value"] for item in pool["containerSpec"]["env"]},
    } | ({"CLOUD_ML_TRIAL_ID": trial} if trial else {})


@pytest.fixture
def recipe_data_in_bucket(gcs, common_voice_dir) -> str:
    """The seed recipe's gs:// dataset, put there as docs/storage.md says (in the emulator):
    every node's launcher fetches it and checks its layout, splits and columns."""
    from trainer.storage.store import _client

    uri = yaml.safe_load((RECIPES_DIR / "whisper-small.yaml").read_text())["dataset_name"]
    bucket = uri.removeprefix("gs://").split("/")[0]
    if _client().lookup_bucket(bucket) is None:
        _client().create_bucket(bucket)
    open_store(uri).upload(common_voice_dir)
    return uri


def test_every_node_of_the_checked_in_job_plans_the_same_cluster(
    tmp_path, demo_cache, monkeypatch, recipe_data_in_bucket
):
    """Run the launcher on each node exactly as Vertex AI would run config.yaml.

    Vertex runs the image with the pool's args and env, and the env carries the GPUs each
    pool asked for (CLUSTER_SPEC does not). The machine's GPUs are the one input
    faked here (this machine has none): the launcher is told it found the pool's A100s.
    """
    from trainer.launcher.prepare import prepare_launch

    job = yaml.safe_load(CONFIG.read_text())
    gpus = job["workerPoolSpecs"][0]["machineSpec"]["acceleratorCount"]
    a100s = Hardware(gpus, "NVIDIA A100-SXM4-40GB", (8, 0), 96)
    monkeypatch.setattr("trainer.node.machine.detect_hardware", lambda: a100s)
    nodes = [(pool, index) for pool, spec in enumerate(job["workerPoolSpecs"])
             for index in range(spec["replicaCount"])]  # fmt: skip
    plans = []
    for pool, index in nodes:
        cwd = tmp_path / f"workerpool{pool}-{index}"
        cwd.mkdir()
        monkeypatch.chdir(cwd)
        args = [*job["workerPoolSpecs"][pool]["containerSpec"]["args"], "--dry-run"]
        env = trainer_env(demo_cache, **vertex_env(job, pool, index))
        monkeypatch.setenv("TRAINER_CACHE_DIR", env["TRAINER_CACHE_DIR"])
        plans.append(prepare_launch(args, env).describe())

    assert sorted(plan["topology"]["node_rank"] for plan in plans) == list(range(len(nodes)))
    for plan, (pool, index) in zip(plans, nodes, strict=True):
        assert_vertex_plan(plan, pool, index, num_nodes=len(nodes), gpus=gpus)
    written = [path for node in tmp_path.iterdir() for path in node.iterdir()]
    assert not written, "a dry run writes nothing"


def test_the_checked_in_job_stops_on_a_node_whose_gpus_torch_cannot_use(
    demo_cache, monkeypatch, capsys
):
    """The same node with CUDA unusable (this machine: torch sees no GPU) gets one line:
    the pool's GPU count reaches the launcher through the job spec's env."""
    from trainer.launcher import main as launch

    job = yaml.safe_load(CONFIG.read_text())
    for name, value in trainer_env(demo_cache, **vertex_env(job, 1, 0)).items():
        monkeypatch.setenv(name, value)
    launch_is_a_tripwire(monkeypatch, lambda *a: pytest.fail("launched"))
    with pytest.raises(SystemExit) as exit_info:
        launch.main([*job["workerPoolSpecs"][1]["containerSpec"]["args"], "--dry-run"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: This node's worker pool asked for 8 GPU(s) but torch sees 0")


def test_a_tuning_trial_gets_its_parameters_after_the_recipe(
    demo_cache, monkeypatch, recipe_data_in_bucket
):
    """Vertex AI appends `--name=value` per parameter to each trial's container args."""
    from trainer.launcher.prepare import prepare_launch

    tuning = yaml.safe_load(HPTUNING.read_text())
    job = tuning["trialJobSpec"]
    gpus = job["workerPoolSpecs"][1]["machineSpec"]["acceleratorCount"]
    a100s = Hardware(gpus, "NVIDIA A100-SXM4-40GB", (8, 0), 96)
    monkeypatch.setattr("trainer.node.machine.detect_hardware", lambda: a100s)
    params = [f"--{p['parameterId']}=3e-05" if "doubleValueSpec" in p else
              f"--{p['parameterId']}=250" for p in tuning["studySpec"]["parameters"]]  # fmt: skip
    args = job["workerPoolSpecs"][1]["containerSpec"]["args"]
    env = trainer_env(demo_cache, **vertex_env(job, 1, 0, trial="7"))
    monkeypatch.setenv("TRAINER_CACHE_DIR", env["TRAINER_CACHE_DIR"])
    plan = prepare_launch([*args, *params, "--dry-run"], env)
    described = plan.describe()
    assert_vertex_plan(described, 1, 0, num_nodes=len(job["workerPoolSpecs"]), gpus=gpus)
    training = described["config"]["flags"]["training"]
    for param in params:  # after the recipe's own value, so the trial's value wins
        name, value = param.removeprefix("--").split("=")
        assert training[name] == float(value), param


def assert_vertex_plan(plan: dict, pool: int, index: int, num_nodes: int, gpus: int) -> None:
    topology = plan["topology"]
    assert topology == {
        "num_nodes": num_nodes,
        "node_rank": 0 if pool == 0 else index + 1,
        # the chief rendezvouses locally; workers through the chief's Service name
        "master_addr": "127.0.0.1" if pool == 0 else "cmle-training-workerpool0-3f1c9e2a-0",
        "master_port": 2222,
        "nproc_per_node": gpus,
        "role": "chief" if pool == 0 else "worker",
        "world_size": num_nodes * gpus,
    }
    command = plan["command"]
    assert command[command.index("--num_processes") + 1] == str(num_nodes * gpus)
    assert command[command.index("--machine_rank") + 1] == str(topology["node_rank"])
    assert command[command.index("--main_process_ip") + 1] == topology["master_addr"]
    assert command[command.index("--main_process_port") + 1] == "2222"
    assert command[command.index("--deepspeed_multinode_launcher") + 1] == "standard"
    assert command[command.index("--deepspeed_config_file") + 1].endswith("zero2.json")
    flags = plan["config"]["flags"]
    assert flags["model"]["model_name_or_path"] == "openai/whisper-small"
    assert flags["data"]["dataset_name"].startswith("gs://")
    assert sorted(plan["unset_env"]) == ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"]


@pytest.mark.parametrize(
    ("argv", "metric"),
    [
        (["--recipe", "vit-beans.yaml"], ("accuracy", "MAXIMIZE")),
        (["--recipe", "bert-sentiment.yaml"], ("macro_f1", "MAXIMIZE")),
        (["--recipe", "bert-sentiment.yaml", "--metric_for_best_model", "eval_loss"],
         ("loss", "MINIMIZE")),
    ],
)  # fmt: skip
def test_tuning_metric_is_the_one_the_trainer_reports(argv, metric):
    """The metric HypertuneCallback reports (metric_for_best_model) and its direction."""
    tuning = parse_strictly(rendered(*argv)["hptuning.yaml"], HyperparameterTuningJob)
    assert [(m.metric_id, m.goal.name) for m in tuning.study_spec.metrics] == [metric]


def test_a_recipe_in_the_bucket_is_read_and_checked_as_the_nodes_will_read_it(
    tmp_path, capsys, gcs
):
    """The nodes read a /gcs/ recipe through the bucket's mount; the generator reads it
    through Cloud Storage, so its task, metric and flags are checked before the job is."""
    folder = f"{BUCKET}/{os.urandom(4).hex()}"
    recipe = (RECIPES_DIR / "vit-beans.yaml").read_text()
    open_store(f"gs://{folder}").write_text("recipe.yaml", recipe)
    job = ["--recipe", f"/gcs/{folder}/recipe.yaml", "--base_output_dir", f"gs://{folder}/run"]
    specs = rendered(*job)
    tuning = parse_strictly(specs["hptuning.yaml"], HyperparameterTuningJob)
    assert [(m.metric_id, m.goal.name) for m in tuning.study_spec.metrics] == [
        ("accuracy", "MAXIMIZE")
    ]
    assert specs["config.yaml"]["workerPoolSpecs"][0]["containerSpec"]["args"][0] == job[1]
    refused = jobspec_refusal([*job, "--metric_for_best_model", "wer"], tmp_path, capsys)
    assert "--metric_for_best_model wer is not a metric of --task image-classification" in refused
    missing = jobspec_refusal(["--recipe", f"/gcs/{folder}/none.yaml"], tmp_path, capsys)
    assert f"/gcs/{folder}/none.yaml does not exist: upload it first" in missing


def test_python_package_refuses_without_a_bucket(tmp_path, capsys):
    error = jobspec_refusal(["--python_package"], tmp_path, capsys)
    assert "--python_package uploads the sdist next to the job's outputs, and no bucket" in error
