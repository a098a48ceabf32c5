"""The Hugging Face example scripts' own command lines, with `python -m trainer` in place
of the script name, checked through the launcher with --dry-run (in-process, offline).

Each command line is copied from where users find it (source in the comment above it;
only `python SCRIPT.py` / `torchrun ... SCRIPT.py` became nothing). Each either plans a
launch, or stops with one `error:` line that names the flag to use instead. The Hub ids
are laid out in the test's offline hub cache, as on a machine that downloaded them; the
node is said to have two Ampere GPUs, since the commands ask for --fp16.
"""

from __future__ import annotations

import json
import shlex

import pytest

from tests.conftest import warm_hub_cache
from tests.support.helpers import use_hub_at
from tests.support.loopback_hub import running_hub
from trainer.launcher import main as launch
from trainer.node import machine as hardware

SEQ2SEQ_README = "transformers examples/pytorch/speech-recognition/README.md"
EVENT_README = "huggingface/community-events whisper-fine-tuning-event/README.md"
IMAGE_README = "transformers examples/pytorch/image-classification/README.md"
TEXT_README = "transformers examples/pytorch/text-classification/README.md"

WHISPER_SINGLE_GPU = """
    --model_name_or_path="openai/whisper-small"
    --dataset_name="mozilla-foundation/common_voice_11_0"
    --dataset_config_name="hi" --language="hindi" --task="transcribe"
    --train_split_name="train+validation" --eval_split_name="test" --max_steps="5000"
    --output_dir="./whisper-small-hi" --per_device_train_batch_size="16"
    --gradient_accumulation_steps="2" --per_device_eval_batch_size="16" --logging_steps="25"
    --learning_rate="1e-5" --warmup_steps="500" --eval_strategy="steps" --eval_steps="1000"
    --save_strategy="steps" --save_steps="1000" --generation_max_length="225"
    --preprocessing_num_workers="16" --max_duration_in_seconds="30" --text_column_name="sentence"
    --freeze_feature_encoder="False" --gradient_checkpointing --fp16 --do_train --do_eval
    --predict_with_generate
"""

VIT_BEANS = """
        --dataset_name beans --output_dir ./beans_outputs/ --remove_unused_columns False
        --label_column_name labels --do_train --do_eval --push_to_hub
        --push_to_hub_model_id vit-base-beans --learning_rate 2e-5 --num_train_epochs 5
        --per_device_train_batch_size 8 --per_device_eval_batch_size 8
        --logging_strategy steps --logging_steps 10 --evaluation_strategy epoch
        --save_strategy epoch --load_best_model_at_end True --save_total_limit 3 --seed 1337
"""
"""IMAGE_README, "Using datasets from Hub" (beans; no model: the script's default)."""

WHISPER_EVENT_STREAMING = """
    --model_name_or_path="openai/whisper-small"
    --dataset_name="mozilla-foundation/common_voice_11_0"
    --dataset_config_name="es" --language="spanish" --train_split_name="train+validation"
    --eval_split_name="test" --model_index_name="Whisper Small Spanish" --max_steps="5000"
    --output_dir="./" --per_device_train_batch_size="64" --per_device_eval_batch_size="32"
    --logging_steps="25" --learning_rate="1e-5" --warmup_steps="500"
    --evaluation_strategy="steps" --eval_steps="1000" --save_strategy="steps" --save_steps="1000"
    --generation_max_length="225" --length_column_name="input_length"
    --max_duration_in_seconds="30" --text_column_name="sentence" --freeze_feature_encoder="False"
    --report_to="tensorboard" --metric_for_best_model="wer" --greater_is_better="False"
    --load_best_model_at_end --gradient_checkpointing --fp16 --overwrite_output_dir --do_train
    --do_eval --predict_with_generate --do_normalize_eval {streaming} --use_auth_token
    --push_to_hub
"""

COMMAND_LINES = [
    # 1. SEQ2SEQ_README, "Single GPU Whisper Training"
    pytest.param(WHISPER_SINGLE_GPU, None, id="whisper-single-gpu"),
    # 2. SEQ2SEQ_README, "Multi GPU Whisper Training" (torchrun --nproc_per_node 2 ...: the
    #    same flags without --gradient_accumulation_steps; --nproc_per_node is ours too)
    pytest.param("--nproc_per_node 2 " + WHISPER_SINGLE_GPU.replace(
        '--gradient_accumulation_steps="2" ', ""), None, id="whisper-multi-gpu"),
    # 3. EVENT_README, "Python Script" run.sh with streaming mode (the event's default)
    pytest.param(WHISPER_EVENT_STREAMING.format(streaming="--streaming"), None,
                 id="event-streaming"),
    # 4. EVENT_README: "for a very small dataset (< 10 hours) ... --streaming=False"
    pytest.param(WHISPER_EVENT_STREAMING.format(streaming='--streaming="False"'), None,
                 id="event-streaming-false"),
    # 5. EVENT_README, an earlier revision's run.sh (no streaming, no best-model selection)
    pytest.param("""
        --model_name_or_path="openai/whisper-small"
        --dataset_name="mozilla-foundation/common_voice_11_0" --dataset_config_name="es"
        --language="spanish" --train_split_name="train+validation" --eval_split_name="test"
        --model_index_name="Whisper Small Spanish" --max_steps="5000" --output_dir="./"
        --per_device_train_batch_size="64" --per_device_eval_batch_size="32"
        --logging_steps="25" --learning_rate="1e-5" --warmup_steps="500"
        --evaluation_strategy="steps" --eval_steps="1000" --save_strategy="steps"
        --save_steps="1000" --generation_max_length="225" --length_column_name="input_length"
        --max_duration_in_seconds="30" --text_column_name="sentence"
        --freeze_feature_encoder="False" --report_to="tensorboard" --gradient_checkpointing
        --fp16 --overwrite_output_dir --do_train --do_eval --predict_with_generate
        --do_normalize_eval --use_auth_token --push_to_hub
    """, None, id="event-no-streaming"),
    # 6. SEQ2SEQ_README: "The language and task arguments should be omitted for English"
    pytest.param(WHISPER_SINGLE_GPU.replace('--language="hindi" --task="transcribe"', "")
                 .replace('--dataset_config_name="hi"', '--dataset_config_name="en"'), None,
                 id="whisper-english"),
    # 7. IMAGE_README, "Using datasets from Hub" (beans; no model: the script's default)
    pytest.param(VIT_BEANS, "add --task image-classification", id="vit-beans"),
    # 8. the same with --task image-classification added, as that error line says
    pytest.param(f"--task image-classification {VIT_BEANS}", None, id="vit-beans-with-task"),
    # 9. IMAGE_README, "Provide them as folders"
    pytest.param("""
        --train_dir /data/images --output_dir ./outputs/ --remove_unused_columns False
        --do_train --do_eval
    """, "Give both --model_name_or_path and --dataset_name", id="vit-train-dir"),
    # 10. TEXT_README, GLUE tasks (export TASK_NAME=mrpc)
    pytest.param("""
        --model_name_or_path bert-base-cased --task_name mrpc --do_train --do_eval
        --max_seq_length 128 --per_device_train_batch_size 32 --learning_rate 2e-5
        --num_train_epochs 3 --output_dir /tmp/mrpc/
    """, None, id="glue-mrpc"),
    # 11. TEXT_README, "fine-tunes BERT on the imdb dataset"
    pytest.param("""
        --model_name_or_path bert-base-cased --dataset_name imdb --do_train --do_predict
        --max_seq_length 128 --per_device_train_batch_size 32 --learning_rate 2e-5
        --num_train_epochs 3 --output_dir /tmp/imdb/
    """, "or --task text-classification or", id="glue-imdb"),
    # 12. the same with --task text-classification added, as that error line says
    pytest.param("""
        --task text-classification
        --model_name_or_path bert-base-cased --dataset_name imdb --do_train --do_predict
        --max_seq_length 128 --per_device_train_batch_size 32 --learning_rate 2e-5
        --num_train_epochs 3 --output_dir /tmp/imdb/
    """, None, id="glue-imdb-with-task"),
    # 13. TEXT_README, run_classification.py on amazon_reviews_multi (dataset=..., subset=en)
    pytest.param("""
        --task text-classification
        --model_name_or_path google-bert/bert-base-uncased --dataset_name amazon_reviews_multi
        --dataset_config_name en --shuffle_train_dataset --metric_name accuracy
        --text_column_name "review_title,review_body,product_category"
        --text_column_delimiter "\\n" --label_column_name stars --do_train --do_eval
        --max_seq_length 512 --per_device_train_batch_size 32 --learning_rate 2e-5
        --num_train_epochs 1 --output_dir /tmp/amazon_reviews_multi_en/
    """, "--metric_name is not a flag of this trainer", id="run-classification-amazon"),
    # 14. TEXT_README, run_classification.py multi-label on reuters21578 (subset ModApte)
    pytest.param("""
        --task text-classification
        --model_name_or_path google-bert/bert-base-uncased --dataset_name reuters21578
        --dataset_config_name ModApte --shuffle_train_dataset --remove_splits "unused"
        --metric_name f1 --text_column_name text --label_column_name topics --do_train
        --do_eval --max_seq_length 512 --per_device_train_batch_size 32 --learning_rate 2e-5
        --num_train_epochs 15 --output_dir /tmp/reuters21578_ModApte/
    """, "--metric_name is not a flag of this trainer", id="run-classification-reuters"),
    # 15. TEXT_README, run_glue.py on imdb as the current README spells the model
    pytest.param("""
        --task text-classification
        --model_name_or_path google-bert/bert-base-cased --dataset_name imdb --do_train
        --do_predict --max_seq_length 128 --per_device_train_batch_size 32
        --learning_rate 2e-5 --num_train_epochs 3 --output_dir /tmp/imdb/
    """, None, id="glue-imdb-current-model-id"),
    # 16. TEXT_README, run_glue_no_trainer.py (its --max_length is run_glue.py's --max_seq_length)
    pytest.param("""
        --model_name_or_path bert-base-cased --task_name mrpc --max_length 128
        --per_device_train_batch_size 32 --learning_rate 2e-5 --num_train_epochs 3
        --output_dir /tmp/mrpc/
    """, None, id="glue-no-trainer"),
]  # fmt: skip

HUB_IDS = [
    ("model", "openai/whisper-small"), ("dataset", "mozilla-foundation/common_voice_11_0"),
    ("dataset", "beans"), ("model", "google/vit-base-patch16-224-in21k"),
    ("model", "bert-base-cased"), ("dataset", "imdb"), ("model", "google-bert/bert-base-uncased"),
    ("dataset", "amazon_reviews_multi"), ("dataset", "reuters21578"),
    ("model", "google-bert/bert-base-cased"), ("dataset", "nyu-mll/glue"),
]  # fmt: skip


@pytest.fixture
def example_hub_cache(tmp_path, monkeypatch):
    """A hub cache of this test only: the session's must not learn ids that other tests
    expect to be missing (mozilla-foundation/common_voice_11_0). The ids are served from
    it; `--push_to_hub` needs a Hub that accepts the run's token for writing (the
    launcher asks `whoami`), here a loopback one."""
    cache = tmp_path / "hub-cache"
    for kind, repo_id in HUB_IDS:
        warm_hub_cache(cache, kind, repo_id)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    with running_hub({}, tokens={"hf_write": "write"}) as hub:
        use_hub_at(monkeypatch, hub.url)
        monkeypatch.setenv("HF_TOKEN", "hf_write")
        yield


@pytest.fixture
def two_ampere_gpus(monkeypatch):
    gpu = hardware.Hardware(gpu_count=2, gpu_name="NVIDIA A100", compute_capability=(8, 0),
                            cpu_count=8)  # fmt: skip
    monkeypatch.setattr(hardware, "detect_hardware", lambda: gpu)


def dry_run(command: str, capsys) -> tuple[int, str, str]:
    """`python -m trainer --dry-run COMMAND`, in this process: (exit code, stdout, stderr)."""
    try:
        launch.main(["--dry-run", *shlex.split(command)])
        code = 0
    except SystemExit as exit:
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("command", "error"), COMMAND_LINES)
def test_example_command_line(command, error, example_hub_cache, two_ampere_gpus, capsys):
    code, out, err = dry_run(command, capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    if error is None:
        assert code == 0 and not errors, err
        planned = json.loads(out)["command"]
        assert planned[planned.index("--module") + 1] == "trainer.training.rank"
    else:
        assert code == 2 and len(errors) == 1 and error in errors[0], err
        assert err.strip() == errors[0], "one line, nothing else"


def test_whispers_task_flag_becomes_whisper_task(example_hub_cache, two_ampere_gpus, capsys):
    """run_speech_recognition_seq2seq.py's --task is Whisper's; ours selects the training
    task, so `--task transcribe|translate` is Whisper's choice, passed on as --whisper_task."""
    code, out, err = dry_run(WHISPER_SINGLE_GPU.replace("transcribe", "translate"), capsys)
    assert code == 0, err
    config = json.loads(out)["config"]
    assert config["flags"]["task_options"]["whisper_task"] == "translate"
    assert config["flags"]["task"] == "speech-recognition"
    assert "--task" not in config["given"] and "--freeze_feature_encoder" not in config["given"]


def test_renamed_and_ignored_flags_are_rewritten_and_reported(
    example_hub_cache, two_ampere_gpus, capsys
):
    code, out, err = dry_run(WHISPER_EVENT_STREAMING.format(streaming=""), capsys)
    assert code == 0, err
    config = json.loads(out)["config"]
    assert config["flags"]["training"]["eval_strategy"] == "steps"
    assert "--eval_strategy" in config["given"] and "--evaluation_strategy" not in config["given"]
    for flag in ("--use_auth_token", "--model_index_name"):
        assert flag not in config["given"]
        assert f"{flag} ignored: " in err
    assert "--overwrite_output_dir read as --resume never (training starts from step 1" in err
    assert config["flags"]["outputs"]["resume"] == "never"  # the HF scripts' start afresh


def test_an_image_dataset_alone_gets_the_example_scripts_default_model(
    example_hub_cache, two_ampere_gpus, capsys
):
    code, out, err = dry_run("--task image-classification --dataset_name beans", capsys)
    assert code == 0, err
    model = json.loads(out)["config"]["flags"]["model"]["model_name_or_path"]
    assert model == "google/vit-base-patch16-224-in21k"


@pytest.mark.parametrize(
    ("recipe", "expected"),
    [
        # the Whisper fine-tuning blog post's (and seq2seq README's) hyperparameters
        ("whisper-small.yaml", {"learning_rate": 1e-5, "warmup_steps": 500, "max_steps": 4000,
                                "per_device_train_batch_size": 16, "eval_steps": 1000,
                                "metric_for_best_model": "wer"}),
        # TEXT_README (run_glue.py)
        ("bert-sentiment.yaml", {"num_train_epochs": 3, "per_device_train_batch_size": 32,
                                 "learning_rate": 2e-5}),
        # IMAGE_README ("Using datasets from Hub": beans)
        ("vit-beans.yaml", {"learning_rate": 2e-5, "num_train_epochs": 5, "seed": 1337,
                            "per_device_train_batch_size": 8, "save_total_limit": 3}),
    ],
)  # fmt: skip
def test_seed_recipes_hold_the_examples_hyperparameters(recipe, expected):
    from trainer.command_line.parser import parse_flags
    from trainer.command_line.recipes import expand_config_file, locate_config_file

    training = parse_flags(expand_config_file([recipe])).training
    assert {name: training[name] for name in expected} == expected
    assert "README" in locate_config_file(recipe).read_text() or "blog" in (
        locate_config_file(recipe).read_text()
    ), "the recipe names its source"


def test_the_events_streaming_flag_reaches_the_training_program(
    example_hub_cache, two_ampere_gpus, capsys
):
    code, out, err = dry_run(WHISPER_EVENT_STREAMING.format(streaming="--streaming"), capsys)
    assert code == 0, err
    assert json.loads(out)["config"]["flags"]["data"]["streaming"] is True
    without_steps = WHISPER_EVENT_STREAMING.replace('--max_steps="5000"', "")
    code, out, err = dry_run(without_steps.format(streaming="--streaming"), capsys)
    assert code == 2 and err.startswith("error: --streaming needs --max_steps"), err
    assert len(err.strip().splitlines()) == 1
