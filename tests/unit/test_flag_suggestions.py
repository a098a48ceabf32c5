"""Issue 33's flag lines, through the launcher (`--dry-run`, in-process) and the objects the
training processes build: "did you mean" names only flags the run's task accepts, the flags
of the no_trainer scripts and community Whisper repos are answered, `--overwrite_output_dir`
starts afresh as the HF scripts do, `--num_workers` says which workers it counts, and
`--gradient_checkpointing` prints no deprecation."""

from __future__ import annotations

import json
import os
import re
import shlex
import types
import warnings
from dataclasses import asdict

import pytest
from accelerate import PartialState

from tests.support.helpers import REPO_ROOT, resolved, warm_hub_cache
from tests.support.helpers import offline_dry_run as dry_run
from tests.support.tiny_assets import build_tiny_bert, sentiment_sentences, write_sentiment_csv
from trainer.command_line.foreign_flags import FOREIGN_FLAGS
from trainer.command_line.parser import known_flags
from trainer.storage.checkpoints import MANIFEST, find_resumable_checkpoint
from trainer.storage.store import describe_local, open_store
from trainer.tasks.training_arguments import build_training_arguments
from trainer.training.distributed import ProcessPlace, use_gloo_on_cpu
from trainer.training.resume import checkpoint_to_resume

SPEECH = ["--task", "speech-recognition", "--model_name_or_path", "openai/whisper-tiny",
          "--dataset_name", "x/y"]  # fmt: skip
"""A speech line (no download: --dry-run --skip_hub_check)."""


@pytest.fixture(scope="module")
def bert_line(tmp_path_factory) -> list[str]:
    """A text line without --task (the task is inferred from the tiny BERT's config)."""
    root = tmp_path_factory.mktemp("suggestions")
    texts = [text for rows in sentiment_sentences().values() for text, _ in rows]
    build_tiny_bert(root / "bert", texts)
    write_sentiment_csv(root / "sentiment")
    return ["--model_name_or_path", str(root / "bert"), "--dataset_name", str(root / "sentiment"),
            "--text_column_name", "sentence", "--label_column_name", "sentiment"]  # fmt: skip


def unknown(name: str) -> str:
    return f"error: Unknown flag(s): {name} (see python -m trainer --help).\n"


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        # another task's flag (today: did you mean --max_seq_length, then --task asked)
        ("--max_label_length 128", unknown("--max_label_length")),
        # alike, but another flag (today: --train_sampling_strategy)
        ("--audio_sampling_rate 16000", unknown("--audio_sampling_rate")),
        # the nearest is ignored (today: --shuffle_train_dataset)
        ("--shuffle_train_datasets", unknown("--shuffle_train_datasets")),
        # the nearest is refused: what to do instead, as for the refused flag itself
        ("--batchsize 8", unknown(f"--batchsize (like --batch_size, refused: "
                                  f"{FOREIGN_FLAGS['--batch_size'].answer})")),
        # a foreign spelling, suggested as what it is read as
        ("--eval_batch_sise 8", unknown("--eval_batch_sise (did you mean "
                                        "--per_device_eval_batch_size?)")),
        ("--num_worker 2", unknown("--num_worker (did you mean --dataloader_num_workers?)")),
    ],
)  # fmt: skip
def test_did_you_mean_names_only_what_this_task_accepts(typed, message, capsys):
    code, _, err = dry_run([*SPEECH, *shlex.split(typed)], capsys)
    assert (code, err) == (2, message)


def test_a_near_miss_of_the_refused_key_flag_says_where_a_key_goes_never_the_key(capsys):
    code, _, err = dry_run([*SPEECH, "--wandb_keys", "SECRETVALUE"], capsys)
    assert code == 2 and "--wandb_keys (like --wandb_key, refused: " in err, err
    assert "a key is never given on the command line" in err and "SECRETVALUE" not in err


def test_did_you_mean_follows_the_inferred_task(bert_line, capsys):
    """No --task: the tiny BERT's config makes it text-classification, whose flag is named."""
    code, _, err = dry_run([*bert_line, "--max_seq_lenght", "64"], capsys)
    assert code == 2 and "--max_seq_lenght (did you mean --max_seq_length?)" in err, err
    code, _, err = dry_run([*SPEECH, "--max_seq_lenght", "64"], capsys)
    assert (code, err) == (2, unknown("--max_seq_lenght"))


@pytest.mark.parametrize(
    ("given", "group", "key", "value"),
    [
        ("--num_proc 4", "data", "preprocessing_num_workers", 4),
        ("--eval_batchsize 8", "training", "per_device_eval_batch_size", 8),
        ("--train_batchsize 8", "training", "per_device_train_batch_size", 8),
        ("--model_name openai/whisper-base", "model", "model_name_or_path", "openai/whisper-base"),
        ("--checkpointing_steps 50", "training", "save_steps", 50.0),
    ],
)
def test_the_community_and_no_trainer_spellings_are_read_as_ours(given, group, key, value,
                                                                  capsys):  # fmt: skip
    args = [arg for arg in SPEECH if "model_name" not in given or arg not in SPEECH[2:4]]
    code, config, err = dry_run([*args, *shlex.split(given)], capsys)
    assert code == 0, err
    name = given.split()[0]
    assert f"{name} read as {FOREIGN_FLAGS[name].answer}" in err.splitlines()
    assert config["flags"][group][key] == value


WHISPER_FINETUNE_FLAGS = """model_name language sampling_rate num_proc train_strategy
    learning_rate warmup train_batchsize eval_batchsize num_epochs num_steps resume_from_ckpt
    output_dir train_datasets train_dataset_configs train_dataset_splits
    train_dataset_text_columns eval_datasets eval_dataset_configs eval_dataset_splits
    eval_dataset_text_columns"""
"""Every flag of vasistalodagala/whisper-finetune's train/fine-tune_on_hf_dataset.py."""


def test_every_flag_of_the_community_whisper_script_is_ours_or_answered():
    names = {f"--{name}" for name in WHISPER_FINETUNE_FLAGS.split()}
    assert not sorted(names - set(known_flags()))


def test_the_community_whisper_scripts_line_runs_as_it_meant(capsys, tmp_path, monkeypatch):
    """On a machine that downloaded the checkpoint (its config tells the task)."""
    warm_hub_cache(tmp_path / "hub-cache", "model", "openai/whisper-tiny")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    line = ("--model_name openai/whisper-tiny --dataset_name x/y --language hindi "
            "--sampling_rate 16000 --num_proc 2 --train_strategy epoch --learning_rate 3e-5 "
            "--warmup 100 --train_batchsize 16 --eval_batchsize 8 --num_epochs 2 "
            "--output_dir out")  # fmt: skip
    code, config, err = dry_run(shlex.split(line), capsys)
    assert code == 0, err
    flags = config["flags"]
    assert flags["model"]["model_name_or_path"] == "openai/whisper-tiny"
    assert flags["data"]["preprocessing_num_workers"] == 2
    training = flags["training"]
    assert (training["eval_strategy"], training["save_strategy"]) == ("epoch", "epoch")
    assert (training["warmup_steps"], training["num_train_epochs"]) == (100, 2)
    assert (training["per_device_train_batch_size"], training["per_device_eval_batch_size"]) == (
        16, 8)  # fmt: skip


WANDB_KEY_REFUSED = (
    "error: --wandb_key is not a flag of this trainer (community fine-tuning scripts): wandb is "
    "not in this image (metrics go to TensorBoard; --report_to wandb needs wandb added to "
    "pyproject.toml's dependencies); a key is never given on the command line, which the job "
    "spec and its logs keep: with wandb added, set WANDB_API_KEY in the environment, or "
    "--secret WANDB_API_KEY=projects/P/secrets/S/versions/V on Vertex AI (docs/launching.md).\n"
)
"""Today's line sent the user to WANDB_API_KEY alone, in an image whose --report_to wandb is
refused before launch (trainer/preflight/training_checks.py check_integrations)."""


def test_the_wandb_key_refusal_says_what_is_true_of_this_image():
    """It says wandb is not in this image: true while pyproject.toml does not depend on it."""
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert not re.search(r'^\s*"wandb\b', pyproject, re.M), "no dependency names wandb"
    assert "wandb is not in this image" in FOREIGN_FLAGS["--wandb_key"].answer


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("--checkpointing_steps epoch", "error: --checkpointing_steps: give --save_strategy epoch "
         "(a checkpoint per epoch) or --save_steps N.\n"),
        ("--wandb_key SECRETVALUE", WANDB_KEY_REFUSED),
        ("--wandb_key=SECRETVALUE", WANDB_KEY_REFUSED),
        ("--repo_id me/whisper", "error: --repo_id is not a flag of this trainer (community "
         "fine-tuning scripts): give the repository as --hub_model_id ORG/NAME with "
         "--push_to_hub true (docs/launching.md).\n"),
        ("--mask_time_prob 0.05", "error: --mask_time_prob is not a flag of this trainer "
         "(run_speech_recognition_ctc.py): model settings come from the model folder's "
         "config.json, not from flags (SpecAugment: apply_spec_augment true, mask_time_prob): "
         "set them there and give the folder as --model_name_or_path (docs/launching.md).\n"),
        ("--train_datasets a/b c/d", "error: --train_datasets is not a flag of this trainer "
         "(vasistalodagala/whisper-finetune): give one dataset as --dataset_name, with "
         "--dataset_config_name, --train_split_name, --eval_split_name and --text_column_name; "
         "several as streams: --streaming true --dataset_name A,B --interleave_probabilities "
         "P,Q (docs/launching.md).\n"),
    ],
)  # fmt: skip
def test_the_community_and_no_trainer_flags_point_the_right_way(given, message, capsys):
    code, _, err = dry_run([*SPEECH, *shlex.split(given)], capsys)
    assert (code, err) == (2, message)


@pytest.mark.parametrize(
    ("given", "notice"),
    [
        ("--with_tracking", "--with_tracking ignored: metrics go to the trackers of --report_to "
         "(tensorboard unless given)"),
        ("--print_training_arguments", "--print_training_arguments ignored: python -m trainer "
         "--dry-run prints the resolved flags, training arguments included"),
        ("--sampling_rate 16000", "--sampling_rate ignored: audio is always resampled to 16 kHz, "
         "the rate Whisper's feature extractor reads"),
    ],
)  # fmt: skip
def test_the_flags_asking_for_what_happens_anyway_get_one_notice(given, notice, capsys):
    code, config, err = dry_run([*SPEECH, *shlex.split(given)], capsys)
    assert code == 0 and notice in err.splitlines(), err
    assert config["flags"]["training"]["report_to"] == ["tensorboard"]


def test_num_workers_says_which_workers_it_counts(capsys):
    code, config, err = dry_run([*SPEECH, "--num_workers", "2"], capsys)
    assert code == 0, err
    assert (
        "--num_workers read as --dataloader_num_workers (data-loader workers per process; "
        "Ray's worker count is --num_workers of python -m trainer.ray or trainer.ray_submit, "
        "training processes per node are --nproc_per_node)"
    ) in err.splitlines()
    assert config["flags"]["training"]["dataloader_num_workers"] == 2


def test_overwrite_output_dir_starts_afresh_and_deletes_nothing(tmp_path, capsys):
    """The HF scripts' --overwrite_output_dir trains from step 1 whatever checkpoints the
    output dir holds: here --resume never, which finds none of them and deletes none."""
    output = tmp_path / "out"
    checkpoint = output / "checkpoint-4"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    entries = describe_local(checkpoint, ["model.safetensors"])
    (checkpoint / MANIFEST).write_text(json.dumps({"files": [asdict(e) for e in entries]}))
    line = [*SPEECH, "--output_dir", str(output), "--overwrite_output_dir"]
    code, config, err = dry_run(line, capsys)
    assert code == 0, err
    assert (
        "--overwrite_output_dir read as --resume never (training starts from step 1, on every "
        "Vertex AI restart of the job too (left out, a restart resumes); the checkpoints "
        "already there are not resumed, nor deleted at the start, but a save of the same step "
        "replaces one and --save_total_limit counts them)"
    ) in err.splitlines()
    assert config["flags"]["outputs"]["resume"] == "never"
    run = resolved(line)
    args = types.SimpleNamespace(resume_from_checkpoint=None, output_dir=str(output))
    place = ProcessPlace(node_rank=0, num_nodes=1, is_local_main=True, is_global_main=True)
    assert checkpoint_to_resume(run, args, place) is None
    # a Vertex AI restart of the same job: the same command line, so step 1 again (the notice
    # says so: the event's run.sh gives the flag, and a preemption would cost the whole run)
    restart = resolved(line, env={**os.environ, "CLOUD_ML_JOB_ID": "4242"})
    assert checkpoint_to_resume(restart, args, place) is None
    assert sorted(path.name for path in checkpoint.iterdir()) == [MANIFEST, "model.safetensors"]
    resuming = resolved([*SPEECH, "--output_dir", str(output)])  # without the flag
    assert resuming.outputs.resume == "auto"
    found = find_resumable_checkpoint(open_store(resuming.locations.checkpoints), output)
    assert found == checkpoint


@pytest.fixture
def training_process_state():
    """The distributed state a one-process CPU training process sets up before it builds its
    TrainingArguments (trainer/training/distributed.py), dropped afterwards."""
    use_gloo_on_cpu(ddp_timeout=60, deepspeed=False)
    yield
    PartialState._reset_state()


@pytest.mark.parametrize("decided", [None, True, False])
def test_gradient_checkpointing_builds_the_arguments_without_a_deprecation(
    decided, training_process_state
):
    """A training process builds TrainingArguments from --gradient_checkpointing (or from the
    memory decision, `decided`): with transformers' new field, the same value, no
    FutureWarning (a filter on it would also pass: the field is checked)."""
    run = resolved([*SPEECH, "--deepspeed", "none", "--gradient_checkpointing", "true"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        arguments = build_training_arguments(run, gradient_checkpointing=decided)
    expected = True if decided is None else decided
    assert arguments.activation_checkpointing is expected
    assert arguments.gradient_checkpointing is expected


def test_gradient_checkpointing_warns_nothing_before_the_plan(capsys):
    """The launcher's own copy of the TrainingArguments (its pre-launch check)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, config, err = dry_run([*SPEECH, "--gradient_checkpointing", "true"], capsys)
    assert code == 0, err
    assert not [str(w.message) for w in caught if "checkpointing" in str(w.message)]
    assert config["flags"]["training"]["gradient_checkpointing"] is True
