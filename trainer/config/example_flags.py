"""The Hugging Face example scripts' flags that this trainer spells differently or does
without, so their command lines run with `python -m trainer` in place of the script name.

Users arrive with command lines from the transformers examples (run_speech_recognition_
seq2seq.py, run_image_classification.py, run_glue.py / run_classification.py) and the
Whisper fine-tuning event. Most of their flags are already ours (HF names throughout);
the rest are listed here, each with the reason, in one of three kinds:
- renamed: an old spelling of one of our flags, rewritten (e.g. transformers 5 removed
  `--evaluation_strategy`; `eval_strategy` is the same setting);
- ignored: the flag asks for what this trainer does anyway, or for nothing it could do
  differently; one notice line says so;
- refused: honouring it silently would train something other than what the user asked;
  one `error:` line names the flag to use instead (docs/launching.md lists them all).
"""

from __future__ import annotations

from trainer.common.errors import UserError

BOOL_WORDS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}

RENAMED = {
    "--evaluation_strategy": "--eval_strategy",  # removed from TrainingArguments in 5.0
    "--push_to_hub_model_id": "--hub_model_id",  # removed from TrainingArguments in 4.x
}

IGNORED = {
    "--use_auth_token": "the Hub client uses the token of `hf auth login` or HF_TOKEN by itself",
    "--overwrite_output_dir": "a run resumes from its last complete checkpoint "
    "(--resume never starts afresh)",
    "--shuffle_train_dataset": "the Trainer shuffles the training set every epoch anyway",
    "--model_index_name": "it only names the model card of a push to the Hub",
    "--remove_splits": "only the splits named by --train_split_name and --eval_split_name are read",
}
"""Flag -> why it changes nothing here. A value after it (`--use_auth_token true`) is
dropped with it."""

TAKES_VALUE = {"--model_index_name", "--task_name", "--text_column_delimiter", "--metric_name",
               "--train_file", "--validation_file", "--train_dir", "--validation_dir",
               "--remove_splits"}  # fmt: skip

REFUSED = {
    "--task_name": "GLUE tasks are not built in; give --task text-classification "
    "--dataset_name nyu-mll/glue --dataset_config_name NAME --text_column_name COLUMN "
    "(sentence-pair tasks such as mrpc are not supported)",
    "--text_column_delimiter": "several text columns cannot be joined; give one --text_column_name",
    "--metric_name": "every evaluation reports all of the task's metrics; choose the one "
    "that selects the best checkpoint with --metric_for_best_model",
    "--train_file": "give the folder holding train.csv/validation.csv (or .json, .parquet) "
    "as --dataset_name",
    "--validation_file": "give the folder holding train.csv/validation.csv (or .json, "
    ".parquet) as --dataset_name",
    "--train_dir": "give an image folder (one subfolder per class, or train/ and "
    "validation/ inside) as --dataset_name",
    "--validation_dir": "give an image folder with train/ and validation/ inside as --dataset_name",
}
"""Flag -> what to do instead. Refused only when it asks for something: a false boolean
(`--streaming False`) is what happens anyway and is dropped."""

WHISPER_TASKS = ("transcribe", "translate")


def translate_example_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv in this trainer's spelling, one notice per ignored flag); UserError if refused."""
    out: list[str] = []
    notices: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name, inline = _split(token)
        value, used = _value(argv, i, name, inline)
        if name == "--task" and value in WHISPER_TASKS:
            out += ["--whisper_task", value]  # Whisper's task in the seq2seq script
        elif name in RENAMED:
            out.append(RENAMED[name] + ("" if inline is None else f"={inline}"))
            used = 1
        elif name == "--freeze_feature_encoder":
            _freeze_feature_encoder(value)
        elif name in IGNORED:
            notices.append(f"{name} ignored: {IGNORED[name]}")
        elif name in REFUSED:
            if BOOL_WORDS.get(str(value).lower()) is not False:
                raise UserError(f"{name} is an example-script flag this trainer does not take: "
                                f"{REFUSED[name]} (docs/launching.md).")  # fmt: skip
        else:
            out.append(token)
            used = 1
        i += used
    return out, notices


def _split(token: str) -> tuple[str, str | None]:
    if token.startswith("--") and "=" in token:
        name, value = token.split("=", 1)
        return name, value
    return token, None


def _value(argv: list[str], i: int, name: str, inline: str | None) -> tuple[object, int]:
    """The flag's value and how many tokens it spans: `--f=v` 1, `--f v` 2, a bare switch
    (`--streaming`, or followed by another flag) 1 with value True."""
    if inline is not None:
        return inline, 1
    following = argv[i + 1] if i + 1 < len(argv) else None
    if following is None or following.startswith("--"):
        return True, 1
    if name in TAKES_VALUE or name == "--task" or following.lower() in BOOL_WORDS:
        return following, 2
    return True, 1


def _freeze_feature_encoder(value: object) -> None:
    """run_speech_recognition_seq2seq.py's default (True) calls a method Whisper lacks,
    so its command lines pass False: nothing to do. True has no Whisper meaning."""
    if BOOL_WORDS.get(str(value).lower()) is not False:
        raise UserError(
            "--freeze_feature_encoder: Whisper has no separate feature encoder; "
            "--freeze_encoder true freezes its whole audio encoder."
        )
