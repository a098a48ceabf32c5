"""No secret is printed or saved, and secrets reach a run by reference.

A token given as a flag (`--hub_token V`, `--hub_token=V`, `--hub-token=V`), as an ordinary
environment variable (HF_TOKEN, WANDB_API_KEY) or through `--secret NAME=projects/...`
(Secret Manager, here the loopback fake in tests/support/secret_manager_fake.py) must show up in no
line the launcher, the dry run, the job spec generator or a failure report prints, and in
no file a run writes (checkpoints, the model, training_args.bin, TensorBoard events); the
training processes still get each one, in their environment.

Here, in this process: what looks secret, masking, the dry run, every parser's secret-looking
flags, the scrub before saving, Secret Manager's refusals and the job spec. A real
two-process run with a canary in every channel: tests/processes/test_secrets_runs.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from google.cloud.aiplatform_v1.types import CustomJobSpec

from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    jobspec_refusal,
    launch_is_a_tripwire,
    parse_strictly,
)
from tests.support.secret_manager_fake import running_fake
from tests.support.secret_references import DENIED, RESOURCE
from trainer.command_line.parser import FlagParser, build_parser
from trainer.common.errors import UserError
from trainer.common.handoff import RUN_CONFIG_VARIABLE
from trainer.common.secrets import (
    SECRET_FLAG_VARIABLES,
    looks_secret,
    mask,
    parse_references,
    scrub_training_arguments,
    secret_values,
)
from trainer.config.resolve import resolve_run
from trainer.jobspec import __main__ as jobspec
from trainer.launcher import main as launch
from trainer.launcher.plan import build_launch_plan
from trainer.node.secret_manager import EMULATOR_VARIABLE
from trainer.settings.launcher_flags import LauncherArguments
from trainer.settings.run_config import Hardware
from trainer.tasks import load_task, task_names
from trainer.training.failures import report_failure
from trainer.training.tracebacks import keep_traceback

CANARY = "CANARY_5e3c1b"
CPU = Hardware(gpu_count=0, gpu_name=None, compute_capability=None, cpu_count=2)


@pytest.fixture
def launcher(monkeypatch, capsys, demo_assets, tmp_path):
    """`python -m trainer ARGS` in-process on the demo's tiny model and tone speech, never
    reaching the launch; returns (exit code, stdout, stderr)."""
    monkeypatch.chdir(tmp_path)
    for name in ("CLUSTER_SPEC", "RANK", "WORLD_SIZE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)

    def never_launch(*args):
        raise AssertionError("reached the launch of accelerate")

    launch_is_a_tripwire(monkeypatch, never_launch)

    def run(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        data = ["--model_name_or_path", str(demo_assets.model_dir),
                "--dataset_name", str(demo_assets.dataset_dir), *DEMO_SPEECH_FLAGS]  # fmt: skip
        try:
            launch.main([*data, *args])
            code = 0
        except SystemExit as exit_info:
            code = exit_info.code
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


# What looks secret, and masking ------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["--hub_token", "--hub-token", "HF_TOKEN", "WANDB_API_KEY", "--wandb_key", "--token",
     "--db_password", "GOOGLE_APPLICATION_CREDENTIALS", "--client-secret", "--apikey"],
)  # fmt: skip
def test_secret_names(name):
    assert looks_secret(name)


@pytest.mark.parametrize(
    "name",
    ["--average_tokens_across_devices", "--include-num-input-tokens-seen", "--secret",
     "TOKENIZERS_PARALLELISM", "--hub_model_id", "--learning_rate"],
)  # fmt: skip
def test_names_that_only_resemble_secrets(name):
    assert not looks_secret(name)


def test_values_of_both_flag_forms_and_of_secret_variables_are_masked_in_any_line():
    argv = ["--hub_token", "AAAA1", "--wandb_key=BBBB2", "--optim", "adamw_torch", "--token"]
    env = {"WANDB_API_KEY": "CCCC3", "LANG": "C.UTF-8", "MY_VALUE": "DDDD4",
           "TRAINER_SECRET_VARIABLES": "MY_VALUE"}  # fmt: skip
    line = "got AAAA1, BBBB2, CCCC3 and DDDD4 with adamw_torch in C.UTF-8"
    assert (
        mask(line, secret_values(argv, env))
        == "got ***, ***, *** and *** with adamw_torch in C.UTF-8"
    )


# (b) the dry run -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given",
    [[f"--hub_token={CANARY}"], [f"--hub-token={CANARY}"], ["--hub_token", CANARY]],
    ids=["equals", "dash-equals", "space"],
)
def test_the_dry_run_shows_no_token_and_the_next_flag_as_given(launcher, given):
    code, out, err = launcher(["--dry-run", *given, "--optim", "adamw_torch"])
    assert code == 0, err
    assert CANARY not in out + err
    plan = json.loads(out)
    training = plan["config"]["flags"]["training"]
    assert training["optim"] == "adamw_torch"
    assert training["hub_token"] == "***"
    assert plan["env"]["HF_TOKEN"] == "***", "the token goes to the training processes"


@pytest.mark.parametrize(
    "given",
    [[f"--wandb_key={CANARY}"], ["--token", CANARY], [f"--api-key={CANARY}", "--seed", "1"]],
    ids=["equals", "space", "dash-equals"],
)
def test_an_unknown_secret_looking_flag_is_refused_without_its_value(launcher, given):
    code, out, err = launcher(given)
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert CANARY not in out + err


# (c) every secret-looking flag of every parser -------------------------------------------------


def secret_looking_flags() -> set[tuple[str, str, str]]:
    """(task, option, destination) of each flag whose name looks secret, in every task's
    parser and the launcher's."""
    launcher_flags = FlagParser([LauncherArguments])
    parsers = [(name, build_parser(load_task(name))) for name in task_names()]
    found = set()
    for task, parser in [*parsers, (task_names()[0], launcher_flags)]:
        for action in parser._actions:
            for option in action.option_strings:
                if looks_secret(option):
                    found.add((task, option, action.dest))
    return found


def test_every_secret_looking_flag_is_masked_and_never_handed_over_in_either_form():
    flags = secret_looking_flags()
    assert {option for _, option, _ in flags} >= {"--hub_token", "--hub-token"}
    for task, option, dest in sorted(flags):
        assert dest in SECRET_FLAG_VARIABLES, f"{option}: which variable does it go to?"
        for given in ([f"{option}={CANARY}"], [option, CANARY]):
            argv = ["--task", task, "--model_name_or_path", "org/model",
                    "--dataset_name", "org/data", *given, "--seed", "7"]  # fmt: skip
            config = resolve_run(argv, {}, CPU)
            assert config.training.values[dest] == CANARY, "the flag was read"
            plan = build_launch_plan(config, {}, Path("/cache"), python="python")
            shown = json.dumps(plan.describe())
            assert CANARY not in shown, f"{task} {given[0]}: value in the dry run"
            assert plan.describe()["config"]["flags"]["training"]["seed"] == 7
            assert CANARY not in plan.env[RUN_CONFIG_VARIABLE], f"{given[0]}: handed over"
            assert plan.secret_env == {SECRET_FLAG_VARIABLES[dest]: CANARY}
            assert CANARY not in mask(f"error: {' '.join(argv)}", secret_values(argv, {}))


# The scrub before anything is saved -------------------------------------------------------


def test_training_arguments_are_saved_without_the_token(tmp_path):
    """What the Trainer pickles into every checkpoint and the model (training_args.bin)
    loads, holds no token, and the Hub client finds the token in HF_TOKEN instead."""
    from transformers import Seq2SeqTrainingArguments

    arguments = Seq2SeqTrainingArguments(output_dir=str(tmp_path), hub_token=CANARY)
    env: dict[str, str] = {}
    scrub_training_arguments(arguments, env)
    torch.save(arguments, tmp_path / "training_args.bin")
    assert CANARY.encode() not in (tmp_path / "training_args.bin").read_bytes()
    assert torch.load(tmp_path / "training_args.bin", weights_only=False).hub_token is None
    assert CANARY not in arguments.to_json_string()  # what TensorBoard records
    assert env == {"HF_TOKEN": CANARY}


def test_a_failure_report_masks_the_processes_secrets(monkeypatch, capsys, tmp_path):
    """Neither the line nor the traceback file it names holds the secret."""
    monkeypatch.setenv("MY_VALUE", CANARY)
    monkeypatch.setenv("TRAINER_SECRET_VARIABLES", "MY_VALUE")
    monkeypatch.chdir(tmp_path)
    config = resolve_run(["--task", "text-classification", "--model_name_or_path", "org/m",
                          "--dataset_name", "org/d", "--output_dir", "out"], {}, CPU)  # fmt: skip
    try:
        raise RuntimeError(f"the server rejected {CANARY}")
    except RuntimeError as error:
        report_failure(error, lambda cause: keep_traceback(cause, config))
    err = capsys.readouterr().err
    kept = tmp_path / "out" / "logs" / "traceback-rank0.txt"
    assert CANARY not in err and CANARY not in kept.read_text()
    assert "RuntimeError: the server rejected ***" in kept.read_text()
    assert err.splitlines()[-2:] == [
        f"the traceback of the error below is in {kept}",
        "error: rank 0 of 1 (node 0, local rank 0) failed: RuntimeError: the server rejected ***",
    ]


# (e) Secret Manager: resolution and refusals ----------------------------------------------------


def test_a_secret_reference_is_read_for_the_training_processes_and_shown_by_name(launcher):
    with running_fake({RESOURCE: CANARY}) as fake:
        code, out, err = launcher(
            ["--dry-run", "--secret", f"MY_TOKEN={RESOURCE}"], {EMULATOR_VARIABLE: fake.url}
        )
    assert code == 0, err
    assert fake.accessed == [RESOURCE]
    assert CANARY not in out + err
    plan = json.loads(out)
    assert plan["env"]["MY_TOKEN"] == "***"
    assert plan["env"]["TRAINER_SECRET_VARIABLES"] == "MY_TOKEN"


@pytest.mark.parametrize(
    ("resource", "why"),
    [(DENIED, "permission denied: grant the job's service account "
      "roles/secretmanager.secretAccessor"),
     ("projects/p/secrets/gone/versions/1", "not found")],
    ids=["denied", "not-found"],
)  # fmt: skip
def test_a_secret_that_cannot_be_read_is_one_line_naming_it(launcher, resource, why):
    with running_fake({RESOURCE: CANARY}, denied={DENIED}) as fake:
        code, out, err = launcher(
            ["--secret", f"HF_TOKEN={RESOURCE}", "--secret", f"OTHER={resource}"],
            {EMULATOR_VARIABLE: fake.url},
        )
    assert code == 2
    assert fake.accessed == [RESOURCE, resource]
    printed = out + err
    assert printed.count("error: ") == 1
    line = err.splitlines()[-1]
    assert line.startswith(f"error: could not read the secret {resource} from Secret Manager")
    assert why in line
    assert CANARY not in printed


@pytest.mark.parametrize(
    "reference",
    [f"HF_TOKEN={CANARY}", f"HF_TOKEN=projects/p/secrets/{CANARY}", "1X=" + RESOURCE,
     f"HF_TOKEN=projects/p/secrets/s/versions/{CANARY}"],
)  # fmt: skip
def test_a_malformed_reference_fails_before_anything_without_quoting_it(launcher, reference):
    with running_fake({RESOURCE: CANARY}) as fake:
        code, out, err = launcher(["--secret", reference], {EMULATOR_VARIABLE: fake.url})
    assert code == 2
    printed = out + err
    assert printed.startswith("error: --secret ") and printed.count("\n") == 1, printed
    assert "NAME=projects/PROJECT/secrets/SECRET/versions/VERSION" in printed
    assert CANARY not in printed
    assert fake.accessed == []


def test_a_variable_given_twice_or_a_token_given_both_ways_is_refused():
    with pytest.raises(UserError, match="--secret A is given twice"):
        parse_references([f"A={RESOURCE}", f"A={DENIED}"])
    argv = ["--task", "speech-recognition", "--model_name_or_path", "org/model",
            "--dataset_name", "org/data", "--hub_token", CANARY,
            "--secret", f"HF_TOKEN={RESOURCE}"]  # fmt: skip
    with pytest.raises(UserError, match="both give the Hub token") as refused:
        resolve_run(argv, {}, CPU)
    assert CANARY not in str(refused.value)


# (d) the job spec holds references, never values ----------------------------------------------


def test_a_job_spec_carries_the_reference_and_the_service_account():
    account = "trainer@my-project.iam.gserviceaccount.com"
    argv = ["--service_account", account, "--secret", f"HF_TOKEN={RESOURCE}",
            "--secret", f"WANDB_API_KEY={DENIED}", "--max_steps", "10"]  # fmt: skip
    files = jobspec.render(argv)
    job = parse_strictly(yaml.safe_load(files["config.yaml"]), CustomJobSpec)
    assert job.service_account == account
    for pool in job.worker_pool_specs:
        args = list(pool.container_spec.args)
        assert args[args.index("--secret") : args.index("--max_steps")] == [
            "--secret", f"HF_TOKEN={RESOURCE}", "--secret", f"WANDB_API_KEY={DENIED}",
        ]  # fmt: skip
        assert "HF_TOKEN" not in {item.name for item in pool.container_spec.env}
    tuning = yaml.safe_load(files["hptuning.yaml"])
    assert tuning["trialJobSpec"]["serviceAccount"] == account


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--hub_token", CANARY], "--secret HF_TOKEN=projects/PROJECT/secrets/SECRET/versions/latest"),
     ([f"--hub-token={CANARY}"], "--secret HF_TOKEN=projects/"),
     (["--env", f"WANDB_API_KEY={CANARY}"], "--secret WANDB_API_KEY=projects/"),
     ([f"--wandb_key={CANARY}"], "--wandb_key looks like a secret"),
     (["--secret", f"HF_TOKEN={CANARY}"], "--secret HF_TOKEN=...: expected NAME=projects/")],
)  # fmt: skip
def test_a_job_spec_refuses_literal_secrets_without_quoting_them(argv, message, tmp_path, capsys):
    err = jobspec_refusal(argv, tmp_path, capsys)
    assert message in err
    assert CANARY not in err
