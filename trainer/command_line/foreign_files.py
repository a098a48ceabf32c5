"""Configuration files written for Axolotl and LLaMA-Factory, read as recipes of this trainer.

A recipe (`python -m trainer FILE.yaml`, or `--config FILE.yaml`) maps our flag names to
values. A file in Axolotl's form (`base_model`, `datasets: [{path, type}]`, `sequence_len`,
`micro_batch_size`, ...) or LLaMA-Factory's (`stage`, `finetuning_type`, `cutoff_len`,
`template`, ...) is recognised by its keys, and each key is answered as the flags of
foreign_flags.py are: translated to ours, ignored with one notice line saying why, or refused
with one `error:` line naming ours. A key left empty or false asks for nothing and is dropped;
a key that is already ours (`learning_rate`, `gradient_accumulation_steps`) or in the table of
foreign flags (`warmup_ratio`) is passed on as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from transformers import Seq2SeqTrainingArguments

from trainer.command_line.foreign_flags import FOREIGN_FLAGS
from trainer.common.errors import UserError
from trainer.settings.data_flags import DataArguments
from trainer.settings.launcher_flags import LauncherArguments
from trainer.settings.model_flags import ModelArguments
from trainer.settings.output_flags import OutputArguments
from trainer.tasks.registry import registered

AXOLOTL, LLAMA_FACTORY = "Axolotl", "LLaMA-Factory"
MARKS = {
    AXOLOTL: {"base_model", "sequence_len", "micro_batch_size", "sample_packing", "num_epochs",
              "adapter", "lora_target_linear", "val_set_size", "datasets", "rl"},
    LLAMA_FACTORY: {"stage", "finetuning_type", "cutoff_len", "lora_target", "template",
                    "val_size"},
}  # fmt: skip
"""Keys that only that tool's files have: one of them makes a file that tool's."""

ROWS = (
    "give chats (a messages column), prompt and completion columns, a text column "
    "(--dataset_text_field), or preference pairs (chosen and rejected columns, TRL's formats)"
)
AXOLOTL_COLUMNS = {"chat_template": "messages", "completion": "text"}
"""The column each of Axolotl's dataset types reads by default (field_messages, field)."""
PREFERENCE = {"task": "preference-tuning"}
"""What a DPO stage of another tool is here: the preference-tuning task (TRL's DPOTrainer)."""


@dataclass(frozen=True)
class Key:
    """A foreign file's key: `ours` (our flag's name) or `translate` (value -> our flags),
    else `ignored` (why nothing changes) or `refused` (what to use instead)."""

    ours: str = ""
    translate: Callable[[object], dict[str, object]] | None = None
    ignored: str = ""
    refused: str = ""


def _datasets(value: object) -> dict[str, object]:
    """Axolotl's `datasets: [{path, type, split, name}]` of rows this trainer reads: one is
    that dataset; several are a mixture of them whole, concatenated (its `merge_datasets`;
    `_axolotl_shuffle` adds its seed)."""
    kinds = _readable_types(value)
    if len(kinds) > 1:
        mixed = [_mixed_entry(entry, kind) for entry, kind in zip(value, kinds, strict=True)]
        return {"dataset_mixture": {"datasets": mixed}}
    entry = value[0]
    flags: dict[str, object] = {"dataset_name": entry.get("path")}
    if entry.get("split"):
        flags["train_split_name"] = entry["split"]
    if entry.get("name"):
        flags["dataset_config_name"] = entry["name"]
    return flags


def _readable_types(value: object) -> list[str]:
    """Each Axolotl dataset's type, or UserError for one whose rows are not read here."""
    if not isinstance(value, list) or not value or not all(isinstance(e, Mapping) for e in value):
        raise UserError("datasets (Axolotl) is not a list of {path, type} entries.")
    kinds = [entry.get("type") or "chat_template" for entry in value]
    unread = [kind for kind in kinds if kind not in AXOLOTL_COLUMNS]
    if unread:
        raise UserError(f"datasets (Axolotl) type {unread[0]}: its rows are not read here; "
                        f"{ROWS}, and name the folder or Hub id as path.")  # fmt: skip
    return kinds


def _mixed_entry(entry: Mapping[str, object], kind: str) -> dict[str, object]:
    """An Axolotl dataset as a mixture's: kept whole, with the column its type reads only,
    so that datasets of other columns concatenate."""
    mixed = {"path": entry.get("path"), "split": entry.get("split") or "train",
             "columns": [AXOLOTL_COLUMNS[kind]]}  # fmt: skip
    return mixed | ({"config": entry["name"]} if entry.get("name") else {})


def _axolotl_shuffle(flags: dict, content: Mapping[str, object]) -> dict:
    """Axolotl shuffles its merged datasets with the file's `seed` (42 without one) unless
    `shuffle_merged_datasets: false` (axolotl/utils/data/shared.py `merge_datasets`)."""
    mixture = flags.get("dataset_mixture")
    if isinstance(mixture, dict):
        shuffled = content.get("shuffle_merged_datasets", True) is not False
        mixture["seed"] = content.get("seed", 42) if shuffled else None
    return flags


def _adapter(value: object) -> dict[str, object]:
    if value == "qlora":
        return {"peft": "lora", "load_in_4bit": True}
    if value == "lora":
        return {"peft": "lora"}
    raise UserError(f"adapter (Axolotl) {value}: --peft lora (LoRA; with --load_in_4bit, "
                    "QLoRA) is what trains here.")  # fmt: skip


def _evaluation_part(value: object) -> dict[str, object]:
    """Axolotl's val_set_size, LLaMA-Factory's val_size: a part of the training split held out."""
    return {"train_val_split": value} if value else {}


def _special_tokens(value: object) -> dict[str, object]:
    tokens = dict(value) if isinstance(value, Mapping) else {}
    others = sorted(set(tokens) - {"eos_token", "pad_token", "bos_token"})
    if others:
        raise UserError(f"special_tokens (Axolotl) {', '.join(others)}: no tokens are added "
                        "here; --eos_token sets the end of sequence (one of the "
                        "vocabulary's).")  # fmt: skip
    return {"eos_token": tokens["eos_token"]} if tokens.get("eos_token") else {}


def _axolotl_template(value: object) -> dict[str, object]:
    """Axolotl names a template (`chatml`, `llama3`) or the tokenizer's own."""
    if value == "tokenizer_default":
        return {}
    raise UserError(f"chat_template (Axolotl) {value}: give the Jinja template itself as "
                    "chat_template, or leave it out to use the model's.")  # fmt: skip


def _train_on_inputs(value: object) -> dict[str, object]:
    return {"assistant_only_loss": False, "completion_only_loss": False} if value else {}


def _stage(value: object) -> dict[str, object]:
    if value in ("sft", "pt"):
        return {}
    if value == "dpo":
        return PREFERENCE
    raise UserError(f"stage (LLaMA-Factory) {value}: text-generation here is supervised "
                    "fine-tuning (stage: sft), preference-tuning DPO (stage: dpo).")  # fmt: skip


def _pref_loss(value: object) -> dict[str, object]:
    """LLaMA-Factory hands sigmoid, hinge and ipo to TRL's DPO loss; its orpo, simpo and
    kto_pair are losses of its own."""
    if value in ("sigmoid", "hinge", "ipo"):
        return {"loss_type": value}
    raise UserError(f"pref_loss (LLaMA-Factory) {value}: TRL's DPO losses are trained here "
                    "(--loss_type: sigmoid, hinge, ipo, robust, ...).")  # fmt: skip


def _rl(value: object) -> dict[str, object]:
    """Axolotl's `rl`: dpo, or ipo (its DPOStrategy sets TRL's loss_type ipo)."""
    if value == "dpo":
        return PREFERENCE
    if value == "ipo":
        return PREFERENCE | {"loss_type": "ipo"}
    raise UserError(f"rl (Axolotl) {value}: preference tuning here is TRL's DPO (rl: dpo, "
                    "rl: ipo, or --loss_type for its other losses).")  # fmt: skip


def _finetuning_type(value: object) -> dict[str, object]:
    if value in ("lora", "full"):
        return {"peft": "lora"} if value == "lora" else {}
    raise UserError(f"finetuning_type (LLaMA-Factory) {value}: --peft lora trains adapters, "
                    "--peft none every weight.")  # fmt: skip


def _lora_target(value: object) -> dict[str, object]:
    return {"lora_target_modules": "all-linear" if value == "all" else value}


def _local_dataset(value: object) -> dict[str, object]:
    """LLaMA-Factory's `dataset` names entries of its data/dataset_info.json; a folder or a
    Hub id of rows this trainer reads is taken as it is."""
    if isinstance(value, str) and "," not in value and ("/" in value or Path(value).is_dir()):
        return {"dataset_name": value}
    raise UserError(f"dataset (LLaMA-Factory) {value}: its dataset_info.json names are not "
                    f"read; {ROWS}, and name one folder or Hub id as dataset_name.")  # fmt: skip


def _flash(value: object) -> dict[str, object]:
    return {"attn_implementation": "flash_attention_2"} if value else {}


NO_WANDB = Key(refused="wandb is not in this image (metrics go to TensorBoard: report_to)")
KEYS: dict[str, dict[str, Key]] = {
    AXOLOTL: {
        "base_model": Key("model_name_or_path"),
        "datasets": Key(translate=_datasets),
        "shuffle_merged_datasets": Key(translate=lambda v: {}),  # read by _axolotl_shuffle
        "sequence_len": Key("max_seq_length"),
        "sample_packing": Key("packing"),
        "micro_batch_size": Key("per_device_train_batch_size"),
        "num_epochs": Key("num_train_epochs"),
        "adapter": Key(translate=_adapter),
        "lora_target_linear": Key(translate=lambda v: {"lora_target_modules": "all-linear"}),
        "val_set_size": Key(translate=_evaluation_part),
        "optimizer": Key("optim"),
        "lr_scheduler": Key("lr_scheduler_type"),
        "train_on_inputs": Key(translate=_train_on_inputs),
        "flash_attention": Key(translate=_flash),
        "sdp_attention": Key(translate=lambda v: {"attn_implementation": "sdpa"}),
        "special_tokens": Key(translate=_special_tokens),
        "chat_template": Key(translate=_axolotl_template),
        "chat_template_jinja": Key("chat_template"),
        "resume_from_checkpoint": Key("resume"),
        "strict": Key(ignored="the file is read key by key, each answered"),
        "dataset_prepared_path": Key(ignored="each run tokenises its data (datasets' cache "
                                     "keeps the loaded files)"),
        "eval_sample_packing": Key(ignored="evaluation examples are evaluated unpacked"),
        "pad_to_sequence_len": Key(ignored="each batch pads to its longest example"),
        "loss_watchdog_threshold": Key(ignored="no loss watchdog here; the progress lines "
                                       "show the loss"),
        "loss_watchdog_patience": Key(ignored="no loss watchdog here"),
        "evals_per_epoch": Key(refused="give --eval_strategy steps --eval_steps N (or "
                               "--eval_strategy epoch)"),
        "saves_per_epoch": Key(refused="give --save_strategy steps --save_steps N (or "
                               "--save_strategy epoch)"),
        "lora_model_dir": Key(refused="an adapter is trained from the base model here; "
                              "--resume continues a run from its checkpoint"),
        "rl": Key(translate=_rl),
        "rl_beta": Key("beta"),
        "dpo_loss_type": Key("loss_type"),
        "dpo_label_smoothing": Key("label_smoothing"),
        **{f"wandb_{name}": NO_WANDB for name in ("project", "entity", "watch", "name",
                                                  "log_model", "run_id", "mode")},
    },
    LLAMA_FACTORY: {
        "stage": Key(translate=_stage),
        "do_train": Key(ignored="a run trains"),
        "finetuning_type": Key(translate=_finetuning_type),
        "lora_target": Key(translate=_lora_target),
        "lora_rank": Key("lora_r"),
        "dataset": Key(translate=_local_dataset),
        "template": Key(ignored="chats are rendered with the model's own chat template "
                        "(chat_template gives another)"),
        "cutoff_len": Key("max_seq_length"),
        "max_samples": Key("max_train_samples"),
        "val_size": Key(translate=_evaluation_part),
        "plot_loss": Key(ignored="TensorBoard plots the loss (report_to tensorboard)"),
        "packing": Key("packing"),
        "pref_beta": Key("beta"),
        "pref_loss": Key(translate=_pref_loss),
        "pref_ftx": Key(refused="give --rpo_alpha, TRL's weight of the chosen answers' NLL "
                        "(averaged over the batch's tokens, where LLaMA-Factory averages each "
                        "answer's first)"),
        "trust_remote_code": Key(ignored="no code from the Hub is run: transformers' own "
                                 "model classes are used"),
    },
}  # fmt: skip
"""Each tool's keys that are not ours, with their answers."""


def known_names() -> set[str]:
    """Every flag name (without --) a command line may hold: the launcher's, the model's, the
    data's, the outputs', every task's own, the Trainer's, and the foreign ones answered (the
    dataclasses the parser reads, named without building it: the parser imports this module's
    importer)."""
    groups = [LauncherArguments, ModelArguments, DataArguments, OutputArguments,
              Seq2SeqTrainingArguments, *(spec.flags for spec in registered())]  # fmt: skip
    names = {field.name for group in groups for field in dataclasses.fields(group)}
    return names | {"task"} | {name[2:] for name in FOREIGN_FLAGS}


def read_mixtures(content: Mapping[str, object]) -> dict:
    """A recipe's mixture of datasets as our flags: TRL 1.16's `datasets: [{path, name, split,
    columns, fraction}]` with `test_split_size` and `streaming` (its `DatasetMixtureConfig`,
    at the top of the file) as `dataset_mixture` in TRL's order (`seed: null`); open-r1's
    `dataset_mixture` and the alignment-handbook's `dataset_mixer` as they are, the handbook's
    `dataset_splits` as --train_split_name and --eval_split_name. A mixture of one dataset,
    whole, is that dataset (--dataset_name)."""
    flags = _handbooks_mixer(_trls_datasets(dict(content)))
    return _one_mixed_dataset(flags)


def _trls_datasets(flags: dict) -> dict:
    if not trls_mixture_form(flags):
        return flags
    mixture = {"datasets": flags.pop("datasets"), "seed": None}
    for key in ("test_split_size", "streaming"):
        if key in flags:
            mixture[key] = flags.pop(key)
    flags["dataset_mixture"] = mixture
    return flags


def trls_mixture_form(content: Mapping[str, object]) -> bool:
    """TRL's `datasets:` list (entries without Axolotl's `type`, and no other Axolotl key)."""
    datasets = content.get("datasets")
    return (
        isinstance(datasets, list)
        and all(isinstance(entry, Mapping) and "type" not in entry for entry in datasets)
        and not (MARKS[AXOLOTL] - {"datasets"}) & set(content)
    )


def _handbooks_mixer(flags: dict) -> dict:
    mixer, splits = flags.get("dataset_mixer"), flags.get("dataset_splits")
    if isinstance(mixer, Mapping) and len(mixer) == 1 and float(*mixer.values()) == 1.0:
        del flags["dataset_mixer"]
        flags["dataset_name"] = next(iter(mixer))
    if isinstance(splits, list):
        del flags["dataset_splits"]
        flags |= _handbook_splits([str(split) for split in splits])
    return flags


PLAIN_ENTRY = {"id", "path", "config", "name", "split"}
"""A mixture's entry that asks for one dataset's split as it is."""


def _one_mixed_dataset(flags: dict) -> dict:
    mixture = flags.get("dataset_mixture")
    if not isinstance(mixture, Mapping) or set(mixture) - {"datasets", "seed"}:
        return flags
    datasets = mixture.get("datasets")
    plain = isinstance(datasets, list) and len(datasets) == 1 and isinstance(datasets[0], Mapping)
    if plain and not set(datasets[0]) - PLAIN_ENTRY:
        del flags["dataset_mixture"]
        flags |= _mixture_entry(datasets[0])
    return flags


def _handbook_splits(splits: list[str]) -> dict[str, object]:
    """The handbook's dataset_splits: the one with `train` in its name trains, the one with
    `test` evaluates."""
    train = [split for split in splits if "train" in split]
    test = [split for split in splits if "test" in split]
    return ({"train_split_name": train[0]} if train else {}) | (
        {"eval_split_name": test[0]} if test else {}
    )


def _mixture_entry(entry: Mapping[str, object]) -> dict[str, object]:
    flags: dict[str, object] = {"dataset_name": entry.get("id", entry.get("path"))}
    config = entry.get("config", entry.get("name"))
    if config:
        flags["dataset_config_name"] = config
    if entry.get("split"):
        flags["train_split_name"] = entry["split"]
    return flags


def file_form(content: Mapping[str, object]) -> str | None:
    """Axolotl or LLaMA-Factory, from the file's keys; None for a recipe of our flags."""
    for form, marks in MARKS.items():
        if form == AXOLOTL and trls_mixture_form(content):
            continue
        if marks & set(content):
            return form
    return None


def translate_file(
    content: Mapping[str, object], known: Callable[[], set[str]]
) -> tuple[dict, list[str]]:
    """(our flags' values by name, notices: the form read, then one per key ignored) for a
    file in Axolotl's or LLaMA-Factory's form; the content unchanged for a recipe of ours.
    `known`: every flag name (without --) a command line may hold. UserError (one line) for
    a refused key."""
    form = file_form(content)
    if form is None:
        return read_mixtures(content), []
    names = known()
    flags: dict[str, object] = {}
    notices = [f"{form} file: its keys are read as this trainer's flags"]
    for key, value in content.items():
        if value is None or value is False or value == "" or value == []:
            continue  # asks for nothing
        answered, notice = _answer(form, key, value, names)
        flags.update(answered)
        notices += [notice] if notice else []
    return (_axolotl_shuffle(flags, content) if form == AXOLOTL else flags), notices


def _answer(form: str, key: str, value: object, known: set[str]) -> tuple[dict, str | None]:
    entry = KEYS[form].get(key)
    if entry is None:
        if key in known:
            return {key: value}, None
        raise UserError(f"{key} ({form}) is not read here: python -m trainer --help lists "
                        "this trainer's flags (docs/launching.md).")  # fmt: skip
    if entry.refused:
        raise UserError(f"{key} ({form}) is not read here: {entry.refused}.")
    if entry.ignored:
        return {}, f"{key} ({form}) ignored: {entry.ignored}"
    if entry.translate is not None:
        return entry.translate(value), None
    return {entry.ours: value}, None
