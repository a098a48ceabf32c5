"""Flags users bring from elsewhere (trainer/command_line/foreign_flags.py), mistyped and repeated
flags, --task inference, train-only datasets, --train_val_split, .json/.parquet tables and
--train_file, and sentence pairs, through the launcher (`--dry-run`, in-process) and the
tasks as the training processes build them. A real two-process run of a train-only
sentence-pair set: tests/processes/test_user_flags_runs.py."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from datasets import load_dataset

from tests.support.helpers import CPU, checked_task, speech_task, task_of
from tests.support.helpers import offline_dry_run as dry_run
from tests.support.llm_recipes import (
    AXOLOTL,
    AXOLOTL_QLORA,
    HANDBOOK_CHAT_TEMPLATE,
    LLAMA_FACTORY_LORA_SFT,
    OPEN_R1_QWEN_DEMO,
    OPEN_R1_SMOLLM2,
    STARCHAT2_SFT,
    TRL_SFT_DOCSTRING,
    ZEPHYR_SFT_FULL,
    ZEPHYR_SFT_LORA,
    ZEPHYR_SFT_QLORA,
    axolotl,
)
from tests.support.tiny_assets import (
    build_tiny_bert,
    build_tiny_vit,
    sentiment_sentences,
    write_colour_images,
    write_paraphrase_csv,
    write_sentiment_csv,
)
from trainer.command_line.foreign_flags import (
    DOC,
    FOREIGN_FLAGS,
    documented_table,
    markdown_table,
)
from trainer.command_line.parser import known_flags
from trainer.common.errors import UserError
from trainer.launcher import main as launch
from trainer.node import machine
from trainer.settings.run_config import Hardware

# Every dataclass field of the Hugging Face example scripts (examples/pytorch/..., current
# and earlier revisions), the Whisper event's additions, transformers 4.57's
# TrainingArguments fields that 5 removed (plus evaluation_strategy and use_ipex, gone in
# 4.4x), the launchers' flags and the seed recipes' settings.
SEQ2SEQ_FLAGS = """model_name_or_path config_name tokenizer_name feature_extractor_name cache_dir
    use_fast_tokenizer model_revision token use_auth_token trust_remote_code
    freeze_feature_encoder freeze_encoder forced_decoder_ids suppress_tokens apply_spec_augment
    dataset_name dataset_config_name text_column overwrite_cache preprocessing_num_workers
    max_train_samples max_eval_samples audio_column_name text_column_name
    max_duration_in_seconds min_duration_in_seconds preprocessing_only train_split_name
    eval_split_name do_lower_case language task"""
EVENT_FLAGS = """model_index_name streaming shuffle_buffer_size do_remove_punctuation
    do_normalize_eval"""
IMAGE_FLAGS = """dataset_name dataset_config_name train_dir validation_dir train_val_split
    max_train_samples max_eval_samples image_column_name label_column_name model_name_or_path
    model_type config_name cache_dir model_revision feature_extractor_name
    image_processor_name token use_auth_token trust_remote_code ignore_mismatched_sizes"""
GLUE_FLAGS = """task_name dataset_name dataset_config_name max_seq_length overwrite_cache
    pad_to_max_length max_train_samples max_eval_samples max_predict_samples train_file
    validation_file test_file model_name_or_path config_name tokenizer_name cache_dir
    use_fast_tokenizer model_revision token trust_remote_code ignore_mismatched_sizes"""
CLASSIFICATION_FLAGS = """dataset_name dataset_config_name do_regression text_column_names
    text_column_delimiter train_split_name validation_split_name test_split_name remove_splits
    remove_columns label_column_name max_seq_length preprocessing_num_workers overwrite_cache
    pad_to_max_length shuffle_train_dataset shuffle_seed max_train_samples max_eval_samples
    max_predict_samples metric_name train_file validation_file test_file"""
TRANSFORMERS_4_FLAGS = """adafactor fp16_backend fp16_opt_level fsdp_min_num_params
    fsdp_transformer_layer_cls_to_wrap group_by_length half_precision_backend
    include_inputs_for_metrics include_tokens_per_second jit_mode_eval logging_dir
    mp_parameters no_cuda overwrite_output_dir past_index per_gpu_eval_batch_size
    per_gpu_train_batch_size push_to_hub_model_id push_to_hub_organization push_to_hub_token
    ray_scope save_safetensors torchdynamo tpu_metrics_debug tpu_num_cores
    use_legacy_prediction_loop use_mps_device warmup_ratio evaluation_strategy use_ipex"""
LAUNCHER_FLAGS = """nproc_per_node nnodes node_rank master_addr master_port rdzv_backend
    rdzv_endpoint rdzv_id rdzv_conf rdzv_timeout max_restarts standalone monitor_interval
    num_processes num_machines machine_rank main_process_ip main_process_port mixed_precision
    multi_gpu use_deepspeed deepspeed_config_file zero_stage offload_optimizer_device
    offload_param_device deepspeed_multinode_launcher config_file gpu_ids
    num_cpu_threads_per_process dynamo_backend cpu same_network gradient_accumulation_steps
    num_gpus num_nodes hostfile include exclude launcher deepspeed deepspeed_config
    no_local_rank force_multi local_rank"""
SEED_RECIPE_FLAGS = "model_size use_gpu num_workers max_input_length epochs batch_size"
# trl sft's command line: SFTConfig's data and loss fields, ModelConfig's model and PEFT ones
TRL_SFT_FLAGS = """dataset_text_field max_length max_seq_length packing assistant_only_loss
    completion_only_loss use_peft lora_r lora_alpha lora_dropout lora_target_modules
    load_in_4bit dtype torch_dtype attn_implementation use_liger_kernel chat_template_path"""

ALL_FOREIGN_SOURCES = [SEQ2SEQ_FLAGS, EVENT_FLAGS, IMAGE_FLAGS, GLUE_FLAGS, CLASSIFICATION_FLAGS,
                       TRANSFORMERS_4_FLAGS, LAUNCHER_FLAGS, SEED_RECIPE_FLAGS,
                       TRL_SFT_FLAGS]  # fmt: skip


def test_every_flag_users_bring_is_ours_or_answered():
    names = {f"--{name}" for source in ALL_FOREIGN_SOURCES for name in source.split()}
    unanswered = sorted(names - set(known_flags()))
    assert not unanswered
    ours_and_foreign = sorted(set(FOREIGN_FLAGS) & (set(known_flags()) - set(FOREIGN_FLAGS)))
    assert not ours_and_foreign, "a foreign flag's answer would hide our own flag"


def test_the_documented_table_is_the_codes():
    """docs/launching.md holds the table generated from FOREIGN_FLAGS; regenerate it with
    python -m trainer.command_line.foreign_flags --write."""
    assert documented_table(DOC.read_text()) == markdown_table()


@pytest.fixture(scope="module")
def bert_and_tables(tmp_path_factory):
    """A tiny BERT (BertConfig's real shape, shrunk), the sentiment CSVs, and an MRPC-shaped
    pair set (sentence1, sentence2, label)."""
    root = tmp_path_factory.mktemp("user-flags")
    texts = [text for rows in sentiment_sentences().values() for text, _ in rows]
    build_tiny_bert(root / "bert", texts)
    write_sentiment_csv(root / "sentiment")
    write_paraphrase_csv(root / "mrpc")
    return root


def text_args(root, dataset="sentiment") -> list[str]:
    return ["--model_name_or_path", str(root / "bert"), "--dataset_name", str(root / dataset)]


SENTIMENT_COLUMNS = ["--text_column_name", "sentence", "--label_column_name", "sentiment"]


@pytest.mark.parametrize(
    "flag", sorted(name for name, flag in FOREIGN_FLAGS.items() if flag.kind == "refused")
)
def test_a_refused_flag_is_one_line_naming_what_to_use(flag, bert_and_tables, capsys):
    value = ["VALUE"] if FOREIGN_FLAGS[flag].takes_value else []
    code, _, err = dry_run([*text_args(bert_and_tables), flag, *value], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {flag} is not a flag of this trainer (")
    assert FOREIGN_FLAGS[flag].answer in err and "VALUE" not in err


@pytest.mark.parametrize(
    "flag", sorted(name for name, flag in FOREIGN_FLAGS.items() if flag.kind == "ignored")
)
def test_an_ignored_flag_is_dropped_with_one_notice(flag, bert_and_tables, capsys):
    value = ["SECRETVALUE"] if FOREIGN_FLAGS[flag].takes_value else []
    args = [*text_args(bert_and_tables), "--task", "text-classification", *SENTIMENT_COLUMNS]
    code, config, err = dry_run([*args, flag, *value], capsys)
    assert code == 0, err
    assert f"{flag} ignored: {FOREIGN_FLAGS[flag].answer}" in err.splitlines()
    assert flag not in config["given"] and "SECRETVALUE" not in err + json.dumps(config)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("--warmup_ratio 0.1", {"training": {"warmup_steps": 0.1}}),
        ("--group_by_length", {"training": {"train_sampling_strategy": "group_by_length"}}),
        ("--group_by_length false", {"training": {"train_sampling_strategy": "random"}}),
        ("--logging_dir /tmp/tb", {"outputs": {"tensorboard_dir": "/tmp/tb"}}),
        ("--per_gpu_train_batch_size 4", {"training": {"per_device_train_batch_size": 4}}),
        ("--no_cuda", {"training": {"use_cpu": True}}),
        ("--adafactor", {"training": {"optim": "adafactor"}}),
        ("--mixed_precision no", {"training": {"bf16": False, "fp16": False}}),
        ("--epochs 7", {"training": {"num_train_epochs": 7.0}}),
        ("--num_workers 0", {"training": {"dataloader_num_workers": 0}}),
        ("--text_column_names sentence", {"task_options": {"text_column_name": "sentence"}}),
        ("--validation_split_name test", {"data": {"eval_split_name": "test"}}),
        ("--evaluation_strategy=epoch", {"training": {"eval_strategy": "epoch"}}),
        ("--push_to_hub_token SECRETVALUE", {"training": {"hub_token": "***"}}),  # masked
    ],
)
def test_a_foreign_spelling_is_read_as_ours(given, expected, bert_and_tables, capsys):
    columns = SENTIMENT_COLUMNS[2:] if "text_column" in given else SENTIMENT_COLUMNS
    args = [*text_args(bert_and_tables), *columns, "--task", "text-classification"]
    code, config, err = dry_run([*args, *shlex.split(given)], capsys)
    assert code == 0, err
    name = given.split()[0].split("=")[0]
    notices = [line for line in err.splitlines() if re.match(f"{name} (.* )?read as --", line)]
    assert len(notices) == (0 if given.endswith("false") else 1), err  # false asks nothing
    assert "SECRETVALUE" not in err + json.dumps(config)
    for group, values in expected.items():
        for key, value in values.items():
            assert str(config["flags"][group][key]) == str(value), (key, config["flags"][group])


IMAGE_REFUSAL = (
    "groups examples by length, and every image is resized to the model's one input size"
)


@pytest.mark.parametrize(
    ("task", "given", "expected"),
    [
        ("speech", "--deepspeed none",
         {"deepspeed": None, "accelerator_config": {"use_configured_state": True}}),
        ("speech", "--group_by_length", {"train_sampling_strategy": "group_by_length"}),
        ("text", "--group_by_length", {"train_sampling_strategy": "group_by_length"}),
        ("image", "--group_by_length", "--train_sampling_strategy group_by_length "
         f"(--group_by_length) {IMAGE_REFUSAL}: leave it out."),
        ("image", "--train_sampling_strategy batch_rebalance",
         f"--train_sampling_strategy batch_rebalance {IMAGE_REFUSAL}: leave it out."),
    ],
)  # fmt: skip
def test_lines_that_died_after_launch_are_planned_or_refused(
    task, given, expected, demo_assets, image_assets, bert_and_tables, monkeypatch, capsys
):
    """Command lines a CPU node's launcher once planned and whose training processes then
    died at start (one process without DeepSpeed, in a state the Trainer was told to reuse
    and none had made; lengths the Trainer found nowhere): planned with what the training
    processes read, or one line where the task cannot do it (images have no length). They
    train for real in tests/processes/test_cli_runs.py and test_test_predictions.py."""
    monkeypatch.setattr(machine, "detect_hardware", lambda: CPU)
    data = {
        "speech": [demo_assets.model_dir, demo_assets.dataset_dir, "--text_column_name",
                   "transcription"],
        "text": [bert_and_tables / "bert", bert_and_tables / "sentiment", *SENTIMENT_COLUMNS],
        "image": [*image_assets, "--task", "image-classification"],
    }[task]  # fmt: skip
    args = ["--model_name_or_path", *data[:1], "--dataset_name", *data[1:]]
    code, config, err = dry_run([*args, *shlex.split(given)], capsys)
    if isinstance(expected, str):
        assert code == 2 and err == f"error: {expected}\n", err
        return
    assert code == 0, err
    for name, value in expected.items():
        assert config["flags"]["training"][name] == value


def test_launcher_spellings_reach_the_launcher(bert_and_tables, capsys):
    args = [*text_args(bert_and_tables), *SENTIMENT_COLUMNS, "--num_gpus", "2",
            "--deepspeed_config_file", "zero3", "--main_process_port", "29999"]  # fmt: skip
    try:
        launch.main(["--dry-run", "--skip_hub_check", *args])
    finally:
        out, err = capsys.readouterr()
    plan = json.loads(out)
    assert plan["topology"]["nproc_per_node"] == 2 and plan["topology"]["master_port"] == 29999
    assert plan["config"]["flags"]["training"]["deepspeed"].endswith("zero3.json")


def test_the_seed_recipes_whisper_size_names_the_checkpoint(capsys):
    code, config, err = dry_run(["--model_size", "small", "--dataset_name", "x/y"], capsys)
    assert code == 0, err
    assert config["flags"]["model"]["model_name_or_path"] == "openai/whisper-small"
    code, _, err = dry_run(["--model_size", "huge", "--dataset_name", "x/y"], capsys)
    assert code == 2 and err.startswith("error: --model_size takes one of tiny, base, small")


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [("--learning_rte 1e-4", "--learning_rate"), ("--num_train_epoch 3", "--num_train_epochs"),
     ("--hub_tokn SECRETVALUE", "--hub_token"), ("--nproc_per_nod 2", "--nproc_per_node"),
     ("--warmup_ration 0.1", "--warmup_steps")],  # what --warmup_ratio is read as
)  # fmt: skip
def test_a_mistyped_flag_gets_did_you_mean(typed, suggested, bert_and_tables, capsys):
    code, _, err = dry_run([*text_args(bert_and_tables), *shlex.split(typed)], capsys)
    name = typed.split()[0]
    assert code == 2 and err.count("\n") == 1, err
    assert f"{name} (did you mean {suggested}?)" in err and "SECRETVALUE" not in err


SPEECH_LINE = ["--task", "speech-recognition", "--model_name_or_path", "openai/whisper-tiny",
               "--dataset_name", "x/y"]  # fmt: skip
"""A speech line that gives its --task (no download: --dry-run --skip_hub_check)."""


BOTH_TEXT_TASKS = "--task preference-tuning or --task text-classification or --task text-generation"
"""The tasks whose flags include --max_seq_length (the two text tasks, and preference tuning
of text generation's models)."""


@pytest.mark.parametrize(
    ("typed", "named", "tasks"),
    [
        # run_glue_no_trainer.py's --max_length (today: "--max_seq_length: ...; add --task ...")
        ("--max_length 128", "--max_length (read as --max_seq_length)", BOTH_TEXT_TASKS),
        # run_classification.py's --text_column_names (today: named --joined_text_columns)
        ("--text_column_names title,body", "--text_column_names (read as --joined_text_columns)",
         "--task text-classification"),
        ("--max_seq_length 128", "--max_seq_length", BOTH_TEXT_TASKS),
    ],
)  # fmt: skip
def test_another_tasks_flag_is_named_as_typed_and_asks_no_second_task(typed, named, tasks, capsys):
    """A text flag on a speech line that gives --task: named as the user typed it, and not
    "add --task text-classification", which a second --task would refuse as given twice."""
    code, _, err = dry_run([*SPEECH_LINE, *shlex.split(typed)], capsys)
    assert (code, err) == (2, (
        f"error: {named}: flag(s) of {tasks}, not of --task "
        f"speech-recognition, the --task given: give {tasks} in its place, "
        "or leave them out (see python -m trainer --help).\n"))  # fmt: skip
    code, _, err = dry_run([*SPEECH_LINE, "--task", "text-classification", *shlex.split(typed)],
                           capsys)  # fmt: skip
    assert code == 2 and "--task is given 2 times" in err, "so adding a --task is no answer"


def test_another_tasks_flag_on_a_line_without_task_asks_for_it(bert_and_tables, capsys):
    """No --task (the tiny BERT's config makes it text-classification): add the task."""
    code, _, err = dry_run([*text_args(bert_and_tables), "--image_column_name", "img"], capsys)
    assert (code, err) == (2, (
        "error: --image_column_name: flag(s) of --task image-classification, not of --task "
        "text-classification; add --task image-classification (see python -m trainer "
        "--help).\n"))  # fmt: skip


@pytest.mark.parametrize("secret", ["--wandb_keys=SECRETVALUE", "--token2 SECRETVALUE"])
def test_an_unknown_flag_is_named_without_its_value(secret, bert_and_tables, capsys):
    code, _, err = dry_run([*text_args(bert_and_tables), *shlex.split(secret)], capsys)
    assert code == 2 and err.startswith("error: Unknown flag(s): --") and "SECRETVALUE" not in err


@pytest.mark.parametrize(
    ("repeated", "message"),
    [
        ("--text_column_name a --text_column_name b", "--text_column_name is given 2 times"),
        ("--eval_strategy no --evaluation_strategy=steps",
         "--eval_strategy and --evaluation_strategy both set --eval_strategy"),
        ("--task_name mrpc --text_column_name a",
         "--task_name and --text_column_name both set --text_column_name"),
        ("--nproc-per-node 1 --nproc_per_node 2", "--nproc_per_node is given 2 times"),
    ],
)  # fmt: skip
def test_a_repeated_flag_is_one_error_line(repeated, message, bert_and_tables, capsys):
    model = ["--model_name_or_path", str(bert_and_tables / "bert")]
    code, _, err = dry_run([*model, *shlex.split(repeated)], capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_a_recipes_flag_may_be_given_again_on_the_command_line(capsys):
    try:
        launch.main(["bert-sentiment.yaml", "--dry-run", "--skip_hub_check",
                     "--learning_rate", "1e-3"])  # fmt: skip
    finally:
        out, err = capsys.readouterr()
    assert json.loads(out)["config"]["flags"]["training"]["learning_rate"] == 1e-3, err


def test_the_glue_task_name_is_a_sentence_pair_job(bert_and_tables, capsys):
    model = ["--model_name_or_path", str(bert_and_tables / "bert")]
    code, config, err = dry_run([*model, "--task_name", "mrpc", "--do_train"], capsys)
    assert code == 0, err
    flags = config["flags"]
    assert flags["task"] == "text-classification"
    assert flags["data"]["dataset_name"] == "nyu-mll/glue"
    assert flags["data"]["dataset_config_name"] == "mrpc"
    assert flags["data"]["eval_split_name"] == "validation"  # GLUE's test labels are -1
    assert flags["task_options"]["text_column_name"] == "sentence1,sentence2"


def test_a_sentence_pair_is_tokenised_as_a_pair(bert_and_tables):
    task = checked_task("text-classification", bert_and_tables / "bert",
                        bert_and_tables / "mrpc", "--text_column_name", "sentence1,sentence2",
                        "--eval_split_name", "validation")  # fmt: skip
    model, tokenizer = task.build_model_and_processor()
    assert model.config.id2label == {0: "0", 1: "1"}
    train, evaluation = task.load_datasets(tokenizer)
    assert train.column_names == ["text", "text_pair", "label"] and len(evaluation) == 18
    batch = task.data_collator(tokenizer)([train[i] for i in range(4)])
    for row, ids, types in zip(range(4), batch["input_ids"], batch["token_type_ids"], strict=True):
        example = train[row]
        expected = tokenizer(example["text"], example["text_pair"])["input_ids"]
        assert ids.tolist()[: len(expected)] == expected
        assert ids.tolist().count(tokenizer.sep_token_id) == 2 and 1 in types.tolist()
    assert model(**batch).loss.isfinite()


def test_several_columns_are_joined_with_the_delimiter(bert_and_tables):
    task = checked_task("text-classification", bert_and_tables / "bert",
                        bert_and_tables / "mrpc", "--text_column_name", "sentence1,sentence2",
                        "--text_column_delimiter", " | ",
                        "--eval_split_name", "validation")  # fmt: skip
    _, tokenizer = task.build_model_and_processor()
    train, _ = task.load_datasets(tokenizer)
    batch = task.data_collator(tokenizer)([train[0]])
    joined = f"{train[0]['text']} | {train[0]['text_pair']}"
    assert batch["input_ids"][0].tolist() == tokenizer(joined)["input_ids"]
    assert 1 not in batch["token_type_ids"][0].tolist()


def test_three_columns_without_a_delimiter_are_refused(bert_and_tables, capsys):
    args = [*text_args(bert_and_tables, "mrpc"), "--text_column_name", "a,b,c"]
    code, _, err = dry_run(["--task", "text-classification", *args], capsys)
    assert code == 2 and "give --text_column_delimiter to join more" in err, err


def test_a_missing_pair_column_is_named(bert_and_tables, capsys):
    args = [*text_args(bert_and_tables, "mrpc"), "--text_column_name", "sentence1,sentence3"]
    code, _, err = dry_run([*args, "--eval_split_name", "validation"], capsys)
    assert code == 2 and 'Column "sentence3" (--text_column_name) not found' in err, err


@pytest.mark.parametrize(
    ("model", "dataset", "task", "why"),
    [
        ("bert", "sentiment", "text-classification", "config.json says bert"),
        ("vit", "images", "image-classification", "config.json says vit"),
        (None, "images", "image-classification", "is a local imagefolder dataset"),
        ("bert-base-cased", "sentiment", "text-classification", "is a local csv dataset"),
    ],
)
def test_the_task_is_inferred_and_said(model, dataset, task, why, bert_and_tables, capsys):
    """From the model's config.json; from the data when there is no model, or its
    config.json is not on this machine (a Hub id not yet downloaded)."""
    root = bert_and_tables
    if not (root / "vit").exists():
        build_tiny_vit(root / "vit")
        write_colour_images(root / "images")
    args = ["--dataset_name", str(root / dataset)]
    if model:
        args += ["--model_name_or_path", str(root / model) if (root / model).exists() else model]
    if task == "text-classification":
        args += SENTIMENT_COLUMNS
    code, config, err = dry_run(args, capsys)
    assert code == 0, err
    assert config["flags"]["task"] == task and "--task" not in config["given"]
    notice = next(line for line in err.splitlines() if line.startswith("task: "))
    assert notice.startswith(f"task: {task} (no --task; ") and why in notice, notice


def test_whisper_is_inferred_from_its_config(demo_assets, capsys):
    args = ["--model_name_or_path", str(demo_assets.model_dir),
            "--dataset_name", str(demo_assets.dataset_dir),
            "--text_column_name", "transcription"]  # fmt: skip
    code, config, err = dry_run(args, capsys)
    assert code == 0 and config["flags"]["task"] == "speech-recognition", err
    assert "task: speech-recognition (no --task; " in err and "says whisper" in err


def test_a_train_only_dataset_runs_with_evaluation_off(bert_and_tables, tmp_path, capsys):
    (tmp_path / "train.csv").write_text((bert_and_tables / "sentiment" / "train.csv").read_text())
    args = ["--task", "text-classification", "--model_name_or_path",
            str(bert_and_tables / "bert"), "--dataset_name", str(tmp_path),
            *SENTIMENT_COLUMNS]  # fmt: skip
    code, _, err = dry_run(args, capsys)
    assert code == 2 and 'Split "test" not found' in err and "--train_val_split 0.15" in err
    code, config, err = dry_run([*args, "--eval_strategy", "no"], capsys)
    assert code == 0, err
    assert config["flags"]["data"]["eval_split_name"] == ""
    assert "evaluation off (--eval_strategy no): no evaluation split is read" in err
    task = checked_task("text-classification", bert_and_tables / "bert", tmp_path,
                        *SENTIMENT_COLUMNS, "--eval_split_name", "")  # fmt: skip
    _, tokenizer = task.build_model_and_processor()
    train, evaluation = task.load_datasets(tokenizer)
    assert len(train) == 60 and evaluation is None


def test_train_val_split_takes_a_seeded_part_of_train(bert_and_tables, tmp_path, capsys):
    (tmp_path / "train.csv").write_text((bert_and_tables / "sentiment" / "train.csv").read_text())
    args = ["--task", "text-classification", "--model_name_or_path",
            str(bert_and_tables / "bert"), "--dataset_name", str(tmp_path),
            *SENTIMENT_COLUMNS]  # fmt: skip
    code, config, err = dry_run([*args, "--train_val_split", "0.15", "--seed", "3"], capsys)
    assert code == 0, err
    assert "evaluation split: 0.15 of split train, drawn with seed 3" in err
    code, _, err = dry_run([*args, "--train_val_split", "0.15", "--eval_split_name", "x"], capsys)
    assert code == 2 and "leave --eval_split_name out" in err
    code, _, err = dry_run([*args, "--train_val_split", "1.5"], capsys)
    assert code == 2 and "--train_val_split 1.5: give a fraction between 0 and 1" in err

    def parts(seed: str):
        split = ["--train_val_split", "0.15", "--seed", seed]
        task = checked_task("text-classification", bert_and_tables / "bert", tmp_path,
                            *SENTIMENT_COLUMNS, *split)  # fmt: skip
        _, tokenizer = task.build_model_and_processor()
        train, evaluation = task.load_datasets(tokenizer)
        return train["text"], evaluation["text"]

    train, evaluation = parts("3")
    assert len(evaluation) == 9 and len(train) == 51 and not set(train) & set(evaluation)
    assert parts("3") == (train, evaluation), "the same seed gives the same split"
    assert parts("4")[1] != evaluation


def write_table(path, rows: list[dict]) -> None:
    """`rows` as .json (an array), .jsonl or .parquet, by the file's suffix."""
    if path.suffix == ".parquet":
        from datasets import Dataset

        Dataset.from_list(rows).to_parquet(str(path))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.mark.parametrize("suffix", [".json", ".parquet", ".jsonl"])
def test_json_and_parquet_work_as_folders_and_as_files(suffix, bert_and_tables, tmp_path):
    splits = {
        split: [{"sentence": text, "sentiment": label} for text, label in rows]
        for split, rows in sentiment_sentences().items()
    }
    folder = tmp_path / "folder"
    folder.mkdir()
    for split, rows in splits.items():
        write_table(folder / f"{split}{suffix}", rows)
    task = checked_task("text-classification", bert_and_tables / "bert", folder,
                        *SENTIMENT_COLUMNS)  # fmt: skip
    _, tokenizer = task.build_model_and_processor()
    train, evaluation = task.load_datasets(tokenizer)
    assert (len(train), len(evaluation)) == (60, 18)

    task = task_of(["--task", "text-classification", "--model_name_or_path",
                    bert_and_tables / "bert", *SENTIMENT_COLUMNS,
                    "--train_file", folder / f"train{suffix}",
                    "--validation_file", folder / f"test{suffix}",
                    "--eval_split_name", "validation"])  # fmt: skip
    task.check_inputs()
    _, tokenizer = task.build_model_and_processor()
    train, evaluation = task.load_datasets(tokenizer)
    assert (len(train), len(evaluation)) == (60, 18)


def test_train_file_through_the_launcher(bert_and_tables, capsys):
    files = ["--train_file", str(bert_and_tables / "mrpc" / "train.csv"),
             "--validation_file", str(bert_and_tables / "mrpc" / "validation.csv")]  # fmt: skip
    model = ["--model_name_or_path", str(bert_and_tables / "bert")]
    code, config, err = dry_run([*model, *files, "--text_column_name", "sentence1,sentence2"],
                                capsys)  # fmt: skip
    assert code == 0, err
    assert config["flags"]["task"] == "text-classification"  # the model's config says bert
    assert config["flags"]["data"]["eval_split_name"] == "validation"
    missing = [*model, "--task", "text-classification", "--train_file", "/no/train.csv"]
    code, _, err = dry_run(missing, capsys)
    assert code == 2 and "Data file /no/train.csv not found" in err, err


def test_train_val_split_in_the_speech_task(demo_assets):
    """Whisper's task takes its evaluation clips from the training split the same way."""

    def evaluation_clips(seed: str) -> list[str]:
        task, _, processor = speech_task(demo_assets.model_dir, demo_assets.dataset_dir,
                                         "--text_column_name", "transcription",
                                         "--train_val_split", "0.25", "--seed", seed)  # fmt: skip
        train, evaluation = task.load_datasets(processor)
        assert len(train) + len(evaluation) == whole and len(evaluation) == round(whole / 4)
        return evaluation["text"]

    whole = len(load_dataset("audiofolder", data_dir=str(demo_assets.dataset_dir / "train"),
                             split="train"))  # fmt: skip
    assert evaluation_clips("1") == evaluation_clips("1") != evaluation_clips("2")


# The lines of issue 33 (dataset and task), as users typed them: the dataset names the
# folder of `bert_and_tables` ({root}). Each either plans a launch with the notice it
# needs, or stops with one line that points the right way.
ISSUE_LINES = [
    # a dataset with a validation split and no test, and no --eval_split_name (test by
    # default): evaluated on validation, said in one line (issue 52)
    ("--dataset_name {root}/mrpc --text_column_name sentence1,sentence2",
     "evaluation split: validation ({root}/mrpc has train and validation, no test; "
     "--eval_split_name names another)"),
    # --test_file alone
    ("--test_file {root}/sentiment/test.csv --text_column_name sentence",
     "error: --test_file is given without --train_file: "),
    # a pair dataset's column error says how to give the pair
    ("--dataset_name {root}/mrpc --eval_split_name validation",
     "error: " + 'Column "text" (--text_column_name) not found in {root}/mrpc; its columns '
     "are: label, sentence1, sentence2. Its sentence pair: --text_column_name "
     "sentence1,sentence2."),
    # a GLUE pair task given one text column: GLUE's test split has no labels ...
    ("--dataset_name nyu-mll/glue --dataset_config_name mrpc --text_column_name sentence1",
     "error: " + 'Split "test" of nyu-mll/glue has no labels (GLUE hides them: every one is '
     "-1): evaluate on --eval_split_name validation."),
    # ... and with its validation split, one sentence of each pair is said before launch
    ("--dataset_name nyu-mll/glue --dataset_config_name mrpc --text_column_name sentence1 "
     "--eval_split_name validation",
     "warning: --text_column_name sentence1 trains on one text of each example, but the "
     "dataset also has sentence2, the other half of the pair: --text_column_name "
     "sentence1,sentence2 trains on both"),
    # a GLUE config's columns are known before launch
    ("--dataset_name nyu-mll/glue --dataset_config_name qqp --eval_split_name validation",
     "error: " + 'Column "text" (--text_column_name) not found in nyu-mll/glue qqp; its '
     "columns are: idx, label, question1, question2. Its sentence pair: --text_column_name "
     "question1,question2."),
    # GLUE's test split saved as files: evaluated on by default, its labels all -1
    ("--dataset_name {root}/glue-files --text_column_name sentence1,sentence2",
     "error: " + 'Split "test" of {root}/glue-files has no labels (every one is -1): '
     "evaluate on --eval_split_name validation."),
]  # fmt: skip


@pytest.mark.parametrize(("line", "said"), ISSUE_LINES)
def test_the_issues_dataset_lines_point_the_right_way(line, said, bert_and_tables, capsys):
    root = bert_and_tables
    glue_files = root / "glue-files"
    if not glue_files.exists():
        glue_files.mkdir()
        for split in ("train", "validation"):
            (glue_files / f"{split}.csv").write_text((root / "mrpc" / f"{split}.csv").read_text())
        rows = (root / "mrpc" / "validation.csv").read_text().splitlines()
        hidden = [row.rsplit(",", 1)[0] + ",-1" for row in rows[1:]]
        (glue_files / "test.csv").write_text("\n".join([rows[0], *hidden]) + "\n")
    args = ["--task", "text-classification", "--model_name_or_path", str(root / "bert"),
            *shlex.split(line.format(root=root))]  # fmt: skip
    code, _, err = dry_run(args, capsys)
    said = said.format(root=root)
    if said.startswith("error: "):
        assert code == 2 and err.startswith(said) and err.count("\n") == 1, err
    else:
        assert code == 0 and said in err.splitlines(), err


@pytest.fixture(scope="module")
def llama_and_chats(tmp_path_factory):
    """A tiny Llama (LlamaConfig's real shape, shrunk; a local BPE tokenizer with Llama 3.1's
    special tokens and chat template) and a folder of chats."""
    from tests.support.chat_models import FAMILIES, save_family_model

    root = tmp_path_factory.mktemp("trl-lines")
    save_family_model(FAMILIES["llama"], root / "llama")
    chat = {"messages": [{"role": "user", "content": "Hello"},
                         {"role": "assistant", "content": "Hi."}]}  # fmt: skip
    (root / "chats").mkdir()
    (root / "chats" / "train.jsonl").write_text("\n".join([json.dumps(chat)] * 4))
    (root / "template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    return root


def test_a_trl_sft_command_line_runs_as_typed(llama_and_chats, capsys):
    """trl sft's flags as users copy them: each is ours, or read as ours with one notice."""
    root = llama_and_chats
    line = (f"--model_name_or_path {root / 'llama'} --dataset_name {root / 'chats'} "
            "--dataset_text_field text --max_length 512 --packing --completion_only_loss false "
            "--assistant_only_loss true --use_peft --lora_r 8 --lora_alpha 16 "
            "--lora_dropout 0.0 --lora_target_modules q_proj,v_proj --dtype float32 "
            f"--attn_implementation eager --chat_template_path {root / 'template.jinja'} "
            "--eval_strategy no")  # fmt: skip
    code, config, err = dry_run(shlex.split(line), capsys)
    assert code == 0, err
    flags = config["flags"]
    assert config["flags"]["task"] == "text-generation"
    assert flags["task_options"]["max_seq_length"] == 512 and flags["task_options"]["packing"]
    assert flags["task_options"]["chat_template"] == str(root / "template.jinja")
    assert flags["model"]["peft"] == "lora" and flags["model"]["lora_r"] == 8
    assert not flags["training"]["bf16"]  # float32: as the CPU computes anyway
    for typed in ("--max_length", "--use_peft", "--dtype", "--chat_template_path"):
        assert len([ln for ln in err.splitlines() if ln.startswith(typed)]) == 1, err


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("--load_in_4bit --use_peft", "--load_in_4bit needs a CUDA GPU"),
        ("--use_liger_kernel", "--use_liger_kernel: Liger's kernels"),
        ("--chat_template_path {llama}", "give the template file itself as --chat_template"),
        ("--load_in_4bit", "--load_in_4bit needs --peft lora"),
        ("--torch_dtype bfloat16", "--bf16 needs an Ampere or newer GPU"),
    ],
)
def test_trl_flags_that_cannot_run_here_are_one_line(given, said, llama_and_chats, capsys):
    root = llama_and_chats
    args = ["--model_name_or_path", root / "llama", "--dataset_name", root / "chats",
            "--eval_strategy", "no", *shlex.split(given.format(llama=root / "llama"))]  # fmt: skip
    code, _, err = dry_run(args, capsys)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code != 0 and len(lines) == 1 and said in lines[0], err


def test_trls_space_separated_lora_target_modules_are_read_as_its_list(llama_and_chats, capsys):
    """`--lora_target_modules q_proj v_proj` (TRL's ModelConfig takes a list) is the comma form;
    it stops at the next flag and never takes a recipe file; `all-linear` adapts every linear
    layer but the LM head, as PEFT reads it."""
    root = llama_and_chats
    base = ["--model_name_or_path", root / "llama", "--dataset_name", root / "chats",
            "--eval_strategy", "no", "--use_peft"]  # fmt: skip
    planned = {}
    for given in ("q_proj v_proj --lora_r 8", "q_proj,v_proj --lora_r 8", "all-linear"):
        args = ["--dry-run", "--skip_hub_check", *map(str, base), "--lora_target_modules"]
        launch.main([*args, *given.split()])
        plan = json.loads(capsys.readouterr().out)
        planned[given] = plan["model"]["trainable_parameters"], plan["config"]["flags"]["model"]
    spaced, commas = planned["q_proj v_proj --lora_r 8"], planned["q_proj,v_proj --lora_r 8"]
    assert spaced == commas and spaced[1]["lora_target_modules"] == "q_proj,v_proj"
    assert spaced[1]["lora_r"] == 8  # the next flag is its own
    every = planned["all-linear"][0]  # q k v o gate up down, rank 16: more than q v at rank 8
    assert every > 4 * spaced[0]
    code, _, err = dry_run([*base, "--lora_target_modules", "q_proj", "v_proj", "r.yaml"], capsys)
    assert code != 0 and "argument(s) that are no flag's value" in err  # not a module name


# The lines and files LLM users bring (issue 52), copied from their public sources with only
# the model and dataset ids pointed at local tiny copies (@QWEN@: a tiny Qwen2, whose end of
# turn is <|im_end|>; @LLAMA@: a tiny Llama; @CHATS@: chats in train and test; @SFT@, @SFT2@:
# in train_sft and test_sft, the handbook's split names of ultrachat_200k; @KEPT@: in train and
# validation). Each is planned on this CPU machine ("accepted"), or refused in one line there
# only for want of a GPU and planned by resolution on an 8 x H100 node ("gpu: LINE"), or
# refused in one line naming what to use ("refused: LINE"): never a bare refusal, never a
# traceback.
USERS_LLM_LINES = [
    # (source, line or file, verdict)
    ("TRL README.md, Command Line Interface (trl sft)",
     "--model_name_or_path @QWEN@ --dataset_name @CHATS@ --output_dir Qwen2.5-0.5B-SFT",
     "accepted"),
    ("TRL README.md (an earlier revision), trl sft on imdb",
     "--model_name_or_path @QWEN@ --dataset_name @CHATS@ --output_dir opt-sft-imdb",
     "accepted"),
    ("TRL docs clis.md, minimal examples",
     "--model_name_or_path @QWEN@ --dataset_name @CHATS@ --output_dir runs/sft", "accepted"),
    ("TRL trl/scripts/sft.py docstring (1.16.0), full training", TRL_SFT_DOCSTRING, "accepted"),
    ("TRL trl/scripts/sft.py docstring (1.16.0), LoRA", TRL_SFT_DOCSTRING.replace(
        "2.0e-5", "2.0e-4") + " --use_peft --lora_r 32 --lora_alpha 16", "accepted"),
    ("TRL sft.py docstring, with --push_to_hub as published",
     TRL_SFT_DOCSTRING + " --push_to_hub", "refused: --push_to_hub"),
    ("a public fine-tuning guide quoting TRL's docs, trl sft QLoRA step",
     "--model_name_or_path @LLAMA@ --dataset_name @CHATS@ --load_in_4bit --use_peft --lora_r 16 "
     "--lora_alpha 32 --dtype bfloat16 --output_dir outputs", "gpu: "),
    ("TRL's CLI as issue 52 quotes it, --accelerate_config zero2",
     "--model_name_or_path @QWEN@ --dataset_name @CHATS@ --accelerate_config zero2", "accepted"),
    ("TRL's CLI, --accelerate_config fsdp2 (trl/accelerate_configs)",
     "--model_name_or_path @QWEN@ --dataset_name @CHATS@ --accelerate_config fsdp2",
     "refused: --accelerate_config takes one of zero2, zero3, multi_gpu, single_gpu"),
    ("trl-jobs as issue 52 quotes it, --peft with no value",
     "--model_name_or_path @QWEN@ --dataset_name @CHATS@ --peft", "accepted"),
    ("LLaMA-Factory's lora_rank on the command line (issue 52)",
     "--model_name_or_path @LLAMA@ --dataset_name @CHATS@ --use_peft --lora_rank 8", "accepted"),
    ("HF transformers run_clm.py README, --train_file/--validation_file",
     "--model_name_or_path @LLAMA@ --train_file @KEPT@/train.jsonl --validation_file "
     "@KEPT@/validation.jsonl --per_device_train_batch_size 8 --per_device_eval_batch_size 8 "
     "--do_train --do_eval --output_dir /tmp/test-clm", "accepted"),
    ("users' --chat_template \"$(cat t.jinja)\" (issue 52), the handbook's zephyr template",
     "--model_name_or_path @LLAMA@ --dataset_name @CHATS@ --chat_template @TEMPLATE@",
     "accepted"),
    ("alignment-handbook config_full.yaml's use_flash_attention_2, on the command line",
     "--model_name_or_path @LLAMA@ --dataset_name @CHATS@ --use_flash_attention_2",
     "refused: --attn_implementation flash_attention_2: flash-attn is not installed"),
    ("older TRL example scripts' --log_with (accelerate's tracker, issue 52)",
     "--model_name_or_path @LLAMA@ --dataset_name @CHATS@ --log_with tensorboard", "accepted"),
    ("alignment-handbook recipes/zephyr-7b-beta/sft/config_full.yaml", ZEPHYR_SFT_FULL,
     "gpu: --attn_implementation flash_attention_2: flash-attn is not installed"),
    ("alignment-handbook config_full.yaml, use_flash_attention_2 left out (this image)",
     ZEPHYR_SFT_FULL.replace("use_flash_attention_2: true\n", ""), "gpu: "),
    ("alignment-handbook recipes/zephyr-7b-beta/sft/config_qlora.yaml (attn sdpa)",
     ZEPHYR_SFT_QLORA, "gpu: "),
    ("alignment-handbook recipes/zephyr-7b-beta/sft/config_lora.yaml", ZEPHYR_SFT_LORA,
     "gpu: --attn_implementation flash_attention_2: flash-attn is not installed"),
    ("open-r1 recipes/Qwen2.5-1.5B-Instruct/sft/config_demo.yaml", OPEN_R1_QWEN_DEMO,
     "gpu: --attn_implementation flash_attention_2: flash-attn is not installed"),
    ("open-r1 config_demo.yaml with sdpa and report_to tensorboard (this image)",
     OPEN_R1_QWEN_DEMO.replace("flash_attention_2", "sdpa").replace("- wandb", "- tensorboard")
     .replace("push_to_hub: true\n", "").replace("- all", "- default"), "gpu: "),
    ("open-r1 recipes/SmolLM2-1.7B-Instruct/sft/config.yaml (report_to tensorboard)",
     OPEN_R1_SMOLLM2.replace("push_to_hub: true\n", ""), "gpu: "),
    ("alignment-handbook recipes/starchat2-15b/sft/config_v0.1.yaml (dataset_mixture)",
     STARCHAT2_SFT, "gpu: --attn_implementation flash_attention_2: flash-attn is not installed"),
    ("alignment-handbook starchat2 config_v0.1.yaml with sdpa, report_to tensorboard (this image)",
     STARCHAT2_SFT.replace("flash_attention_2", "sdpa").replace("- wandb\n", "")
     .replace("push_to_hub: true\n", ""), "gpu: "),
    ("TRL trl/scripts/utils.py DatasetMixtureConfig's YAML (1.16.0), its fields filled",
     "model_name_or_path: @QWEN@\ndatasets:\n  - path: @CHATS@\n    split: train\n"
     "    columns: [messages]\n    fraction: 0.7\n  - path: @SFT@\n    split: train_sft\n"
     "    columns: [messages]\n    fraction: 0.3\nstreaming: false\ntest_split_size: 0.1\n",
     "accepted"),
    (AXOLOTL, axolotl("alpaca", optimizer="adamw_8bit", flash="flash_attention: true",
                      evals="evals_per_epoch: 4\nsaves_per_epoch: 1"),
     "refused: datasets (Axolotl) type alpaca: its rows are not read here"),
    (f"{AXOLOTL}, chats (type chat_template), no evals_per_epoch", axolotl(
        optimizer="adamw_8bit", flash="flash_attention: true"),
     "refused: --attn_implementation flash_attention_2: flash-attn is not installed"),
    (f"{AXOLOTL}, chats, without flash_attention", axolotl(
        optimizer="adamw_8bit", evals="evals_per_epoch: 4\nsaves_per_epoch: 1"),
     "refused: evals_per_epoch (Axolotl) is not read here: give --eval_strategy steps"),
    (f"{AXOLOTL}, chats, as this machine runs it", axolotl(), "accepted"),
    (f"{AXOLOTL_QLORA}, chats", axolotl(adapter="qlora", optimizer="adamw_bnb_8bit"), "gpu: "),
    ("LLaMA-Factory examples/train_lora/llama3_lora_sft.yaml",
     LLAMA_FACTORY_LORA_SFT.replace("@DATASET@", "identity,alpaca_en_demo"),
     "refused: dataset (LLaMA-Factory) identity,alpaca_en_demo: its dataset_info.json names"),
    ("LLaMA-Factory llama3_lora_sft.yaml, dataset a local folder of chats",
     LLAMA_FACTORY_LORA_SFT.replace("@DATASET@", "@CHATS@"), "gpu: "),
]  # fmt: skip
H100_NODE = Hardware(gpu_count=8, gpu_name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0),
                     cpu_count=26, shm_bytes=256 << 30, gpu_memory_bytes=80 << 30)  # fmt: skip


@pytest.fixture(scope="module")
def llm_assets(tmp_path_factory):
    """Tiny Qwen2 and Llama models (their real config classes, shrunk; their special tokens
    and chat templates) and folders of chats with the splits the sources name."""
    from tests.support.chat_models import FAMILIES, save_family_model

    root = tmp_path_factory.mktemp("llm-lines")
    for family in ("qwen2", "llama"):
        save_family_model(FAMILIES[family], root / family)
    chat = {"messages": [{"role": "user", "content": "Hello"},
                         {"role": "assistant", "content": "Hi."}]}  # fmt: skip
    rows = "\n".join([json.dumps(chat)] * 8)
    for folder, splits in (("chats", ("train", "test")), ("sft", ("train_sft", "test_sft")),
                           ("sft2", ("train_sft", "test_sft")),
                           ("kept", ("train", "validation"))):  # fmt: skip
        (root / folder).mkdir()
        for split in splits:
            (root / folder / f"{split}.jsonl").write_text(rows)
    return root


def users_line(text: str, root, tmp_path) -> list[str]:
    """The line's arguments, or `--config FILE` for a file, with the local copies named."""
    places = {"@QWEN@": root / "qwen2", "@LLAMA@": root / "llama", "@CHATS@": root / "chats",
              "@SFT@": root / "sft", "@SFT2@": root / "sft2",
              "@KEPT@": root / "kept"}  # fmt: skip
    for mark, path in places.items():
        text = text.replace(mark, str(path))
    if "\n" not in text:
        return [token.replace("@TEMPLATE@", HANDBOOK_CHAT_TEMPLATE) for token in
                shlex.split(text)]  # fmt: skip
    text = text.replace("@TEMPLATE@", json.dumps(HANDBOOK_CHAT_TEMPLATE))
    (tmp_path / "recipe.yaml").write_text(text)
    return ["--config", str(tmp_path / "recipe.yaml")]


def test_the_users_llm_lines_are_counted():
    assert len(USERS_LLM_LINES) >= 25
    assert all(source and text for source, text, _ in USERS_LLM_LINES)


@pytest.mark.parametrize(("source", "text", "verdict"), USERS_LLM_LINES,
                         ids=[source for source, _, _ in USERS_LLM_LINES])  # fmt: skip
def test_the_users_llm_lines_run_or_name_what_to_use(source, text, verdict, llm_assets,
                                                     tmp_path, capsys):  # fmt: skip
    from tests.support.helpers import resolved

    args = users_line(text, llm_assets, tmp_path)
    code, _, err = dry_run(args, capsys)
    assert "Traceback" not in err and "Unknown flag" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    if verdict == "accepted":
        assert code == 0, err
        return
    assert code == 2 and len(errors) == 1, err
    if verdict.startswith("gpu: "):
        assert re.search("GPU|Ampere", errors[0]), err  # this machine has none
        on_gpus = verdict.removeprefix("gpu: ")
        if not on_gpus:
            resolved([*args, "--skip_hub_check"], H100_NODE)  # planned on a GPU node
            return
        with pytest.raises(UserError, match=re.escape(on_gpus)):  # the next line it gets
            resolved([*args, "--skip_hub_check"], H100_NODE)
    else:
        assert verdict.removeprefix("refused: ") in errors[0], err
