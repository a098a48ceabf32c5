"""Bad input: one clear line, exit code 2, and nothing launched.

The launcher is called in-process (fast), with its launch replaced by a tripwire that
fails the test if the launcher ever got as far as running accelerate. The same through
the real command line, in a subprocess: tests/processes/test_bad_input_runs.py.
"""

from __future__ import annotations

import json

import pytest

from tests.support.helpers import REPO_ROOT, launch_is_a_tripwire
from trainer.launcher import main as launch


@pytest.fixture
def no_launch(monkeypatch):
    """Makes reaching the launch (accelerate's) fail the test."""

    def never_launch(*args):
        raise AssertionError(f"bad input reached the launch: {args}")

    launch_is_a_tripwire(monkeypatch, never_launch)


@pytest.fixture
def launcher(monkeypatch, capsys, demo_assets, tmp_path, no_launch):
    """Run `python -m trainer ARGS` in-process; return (exit code, stdout, stderr)."""
    monkeypatch.chdir(tmp_path)
    for name in ("CLUSTER_SPEC", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)

    def run(args: list[str], env: dict[str, str] | None = None):
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        defaults = {"--model_name_or_path": str(demo_assets.model_dir),
                    "--dataset_name": str(demo_assets.dataset_dir),
                    "--text_column_name": "transcription"}  # fmt: skip
        given = [
            item for flag, value in defaults.items() if flag not in args for item in (flag, value)
        ]  # fmt: skip (a flag given twice is an error)
        with pytest.raises(SystemExit) as exit_info:
            launch.main([*given, *args])
        captured = capsys.readouterr()
        return exit_info.value.code, captured.out, captured.err

    return run


def spec(task_type: str, index: int = 0) -> str:
    return json.dumps(
        {
            "cluster": {"workerpool0": ["chief:2222"], "workerpool1": ["w:2222"],
                        "workerpool2": ["rs:2222"]},
            "task": {"type": task_type, "index": index},
        }
    )  # fmt: skip


BAD_INPUTS = [
    pytest.param([], {"CLUSTER_SPEC": "{oops"}, "CLUSTER_SPEC is not valid JSON", id="spec-json"),
    pytest.param(
        [],
        {"CLUSTER_SPEC": spec("workerpool1", 3)},
        "lists 1 replica",
        id="spec-index-out-of-range",
    ),
    pytest.param(
        [],
        {"CLUSTER_SPEC": spec("workerpool2")},
        "must run its own image",
        id="reduction-server-replica",
    ),
    pytest.param(["--deepspeed", "zero9"], {}, 'Unknown DeepSpeed preset "zero9"', id="preset"),
    pytest.param(
        ["--dataset_name", "/no/such/dir"],
        {},
        "Dataset directory /no/such/dir not found",
        id="dataset-path",
    ),
    pytest.param(
        ["--dataset_name", str(REPO_ROOT / "trainer")],
        {},
        "is neither an audiofolder",
        id="dataset-layout",
    ),
    pytest.param(
        ["--dataset_name", "gs://bucket/data"],
        {"GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent/key.json"},
        "No Google Cloud credentials",
        id="gs-without-credentials",
    ),
    pytest.param(
        ["--audio_column_name", "sound"],
        {},
        'Column "sound" (--audio_column_name)',
        id="audio-column",
    ),
    pytest.param(
        ["--text_column_name", "sentence"],
        {},
        'Column "sentence" (--text_column_name)',
        id="text-column",
    ),
    pytest.param(
        ["--eval_split_name", "validation"], {}, 'Split "validation" not found', id="split"
    ),
    pytest.param(["--language", "klingon"], {}, 'Unknown language "klingon"', id="language"),
    pytest.param(["--bf16", "true", "--fp16", "true"], {}, "mutually exclusive", id="bf16+fp16"),
    pytest.param(["--fp16", "true"], {}, "--fp16 needs a GPU", id="fp16-on-cpu"),
    pytest.param(["--learning_rat", "1e-4"], {}, "Unknown flag(s): --learning_rat", id="typo"),
    pytest.param(["--learning_rate", "fast"], {}, "invalid float value: 'fast'", id="type"),
    pytest.param(["--task", "dance"], {}, 'Unknown task "dance"', id="task"),
    pytest.param(["--nproc_per_node", "0"], {}, "at least 1", id="nproc"),
    pytest.param(
        ["--chief_resolve_timeout", "-5"], {}, "--chief_resolve_timeout must be 0", id="resolve"
    ),
    pytest.param(["--max_duration_in_seconds", "0"], {}, "must be positive", id="duration"),
    pytest.param(["--whisper_task", "summarize"], {}, "invalid choice", id="whisper-task"),
    pytest.param(
        ["--save_interval_minutes", "0"],
        {},
        "--save_interval_minutes must be more than 0",
        id="save-interval",
    ),
    pytest.param(
        ["--stop_grace_seconds", "-1"], {}, "--stop_grace_seconds must be 0 or more", id="grace"
    ),
]


@pytest.mark.parametrize(("args", "env", "message"), BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_2(launcher, args, env, message):
    code, out, err = launcher(args, env)
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "image-classification"],
         "The built-in demos are preference-tuning, speech-recognition, text-generation"),
        (["--model_name_or_path", "openai/whisper-small"],
         "Give both --model_name_or_path and --dataset_name"),
    ],
)  # fmt: skip
def test_half_of_the_demo_defaults_is_refused(capsys, no_launch, args, message):
    """Without a model or a dataset the launcher falls back to the demo, which only fits
    when both are missing and the task is speech."""
    with pytest.raises(SystemExit) as exit_info:
        launch.main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [("- a list\n", "must map flag names"), ("key: [unclosed\n", "not valid YAML")],
)
def test_bad_config_file(capsys, tmp_path, no_launch, content, message):
    config = tmp_path / "recipe.yaml"
    config.write_text(content)
    with pytest.raises(SystemExit) as exit_info:
        launch.main([str(config)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_config_file_names_the_shipped_recipes(capsys, no_launch):
    with pytest.raises(SystemExit) as exit_info:
        launch.main(["whisper-tiny-nope.yaml"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Config file whisper-tiny-nope.yaml not found" in err
    assert "whisper-small.yaml" in err


def test_missing_bucket_fails_before_launch(launcher, gcs):
    code, _, err = launcher([], {"AIP_CHECKPOINT_DIR": "gs://no-such-bucket/job/checkpoints/"})
    assert code == 2
    assert err == "error: Bucket gs://no-such-bucket does not exist.\n"


def test_unwritable_model_dir_fails_before_launch(launcher, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    code, _, err = launcher(["--model_dir", str(blocker / "model")])
    assert code == 2
    assert err.startswith(f"error: Cannot write to {blocker / 'model'}")
