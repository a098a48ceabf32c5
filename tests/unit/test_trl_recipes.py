"""What LLM users bring (issue 52): TRL's `--config FILE.yaml` and its fields, inline chat
templates, recipe values (`model_revision: main`, lists, `bf16: auto`), hints that mean the same
thing, data as people keep it, and attention kernels that tell the truth; through the launcher
(`--dry-run`, in-process) and the task as the training processes build it. The users' own lines
and files: tests/unit/test_user_flags.py (USERS_LLM_LINES)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re

import pytest
import yaml

from tests.support.helpers import offline_dry_run as dry_run
from tests.support.helpers import resolved, task_of
from trainer.command_line.foreign_flags import FOREIGN_FLAGS
from trainer.command_line.parser import accepted_spellings
from trainer.common.errors import UserError
from trainer.tasks.registry import load_task

TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    """A tiny Llama (LlamaConfig's real shape, shrunk; Llama 3.1's special tokens and chat
    template), a folder of chats with a train split only, and one with train and validation."""
    from tests.support.chat_models import FAMILIES, save_family_model

    root = tmp_path_factory.mktemp("llm-recipes")
    save_family_model(FAMILIES["llama"], root / "llama")
    chat = {"messages": [{"role": "user", "content": "Hello"},
                         {"role": "assistant", "content": "Hi."}]}  # fmt: skip
    rows = "\n".join([json.dumps(chat)] * 4)
    for folder, splits in (("chats", ("train",)), ("kept", ("train", "validation"))):
        (root / folder).mkdir()
        for split in splits:
            (root / folder / f"{split}.jsonl").write_text(rows)
    return root


def model_and_chats(root, folder="chats") -> list[str]:
    return ["--model_name_or_path", str(root / "llama"), "--dataset_name", str(root / folder)]


def recipe_first_dry_run(line: list, capsys) -> tuple[int, dict | None, str]:
    """`python -m trainer LINE --dry-run --skip_hub_check`: a recipe may lead the line."""
    from trainer.launcher import main as launch

    try:
        launch.main([*map(str, line), "--dry-run", "--skip_hub_check"])
        code = 0
    except SystemExit as exit:
        code = exit.code
    out, err = capsys.readouterr()
    return code, json.loads(out)["config"] if code == 0 else None, err


def write_yaml(path, content: dict):
    path.write_text(yaml.safe_dump(content))
    return path


# -- --config FILE.yaml, as TRL's TrlParser reads it ------------------------------------------


def test_config_is_the_recipe_and_the_command_line_wins(llm, tmp_path, capsys):
    """`--config FILE` anywhere on the line (or `--config=FILE`) is the same file as the leading
    recipe; a flag on the command line overrides the file's, as TrlParser lets it."""
    recipe = write_yaml(tmp_path / "sft.yaml", {
        "model_name_or_path": str(llm / "llama"), "dataset_name": str(llm / "chats"),
        "learning_rate": 2.0e-5, "eval_strategy": "no", "max_length": 256})  # fmt: skip
    planned = []
    lines = ([recipe], ["--config", recipe], ["--learning_rate", "1e-3", "--config", recipe],
             [f"--config={recipe}", "--learning_rate", "1e-3"])  # fmt: skip
    for line in lines:
        code, config, err = recipe_first_dry_run(line, capsys)
        assert code == 0, err
        flags = config["flags"]
        planned.append(
            (flags["training"]["learning_rate"], flags["task_options"]["max_seq_length"])
        )
    assert planned == [(2e-5, 256), (2e-5, 256), (1e-3, 256), (1e-3, 256)]


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("{recipe} --config {recipe}", "error: Two config files are given"),
        ("--config {recipe} --config {recipe}", "error: --config is given 2 times"),
        ("--learning_rate 1e-4 --config", "error: --config needs a YAML file"),
        ("--config {env}", "env (TRL's environment variables) is not read: set them in the "
         "job's environment"),
        ("--config /no/such.yaml", "error: Config file /no/such.yaml not found"),
    ],
)  # fmt: skip
def test_a_config_that_cannot_be_read_is_one_line(line, said, llm, tmp_path, capsys):
    recipe = write_yaml(tmp_path / "r.yaml", {"learning_rate": 1e-4})
    env = write_yaml(tmp_path / "env.yaml", {"env": {"WANDB_PROJECT": "x"}, "learning_rate": 1})
    code, _, err = recipe_first_dry_run(line.format(recipe=recipe, env=env).split(), capsys)
    assert code == 2 and err.count("\n") == 1 and said in err, err


# -- every field of TRL's ScriptArguments, SFTConfig and ModelConfig --------------------------


def trl_fields() -> dict[str, list[str]]:
    from trl import ModelConfig, ScriptArguments, SFTConfig

    return {cls.__name__: [f.name for f in dataclasses.fields(cls)]
            for cls in (ScriptArguments, SFTConfig, ModelConfig)}  # fmt: skip


def test_every_trl_field_is_accepted_translated_or_explained():
    """The pinned TRL's fields, read from the installed classes: each is one of ours (a
    TrainingArguments field we accept counts), or in the table of foreign flags (translated:
    renamed, a switch, mapped; explained: ignored or refused, with its one line naming ours). A
    TRL upgrade that adds a field fails here, naming it."""
    ours = accepted_spellings(load_task("text-generation"))
    counts = {"accepted": 0, "translated": 0, "explained": 0}
    unanswered = []
    for cls, names in trl_fields().items():
        for name in names:
            foreign = FOREIGN_FLAGS.get(f"--{name}")
            if foreign is not None:
                kind = "explained" if foreign.kind in ("ignored", "refused") else "translated"
                counts[kind] += 1
                assert foreign.answer or foreign.kind != "refused"
            elif name in ours:
                counts["accepted"] += 1
            else:
                unanswered.append(f"{cls}.{name}")
    assert not unanswered, f"TRL fields neither accepted nor explained: {unanswered}"
    print(f"TRL fields: {counts}")  # the counts (pytest -s)
    assert sum(counts.values()) == sum(len(names) for names in trl_fields().values())


@pytest.mark.parametrize(
    ("given", "group", "key", "value"),
    [
        ("--dataset_train_split train", "data", "train_split_name", "train"),
        ("--dataset_config default", "data", "dataset_config_name", "default"),
        ("--dataset_num_proc 2", "data", "preprocessing_num_workers", 2),
        ("--lora_rank 8 --peft", "model", "lora_r", 8),
        ("--peft", "model", "peft", "lora"),
        ("--peft --lora_alpha 8", "model", "peft", "lora"),
        ("--model_revision main", "model", "peft", "none"),
        ("--accelerate_config zero2", "training", "deepspeed", "zero2"),
        ("--log_with tensorboard", "training", "report_to", "tensorboard"),
        ("--report_to tensorboard", "training", "report_to", "tensorboard"),
        ("--truncation_mode keep_start", "task_options", "max_seq_length", 1024),
    ],
)  # fmt: skip
def test_trls_flags_run_with_trls_meaning(given, group, key, value, llm, capsys):
    line = [*model_and_chats(llm), "--eval_strategy", "no", *given.split()]
    code, config, err = dry_run(line, capsys)
    assert code == 0, err
    planned = config["flags"][group][key]
    assert planned == value or str(value) in str(planned), (key, planned)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("--model_revision v2.0", "error: --model_revision takes one of main (the model as given "
         "is read; another revision: download it (hf download ID --revision REV"),
        ("--accelerate_config fsdp2", "error: --accelerate_config takes one of zero2, zero3, "
         "multi_gpu, single_gpu (zero1: --deepspeed zero2; fsdp1, fsdp2: parameters are sharded"),
        ("--dataset_mixture {}", "error: --dataset_mixture '{}': give a mapping with a datasets "
         "list."),
        ("--use_dora", "error: --use_dora is not a flag of this trainer"),
        # (a value of a flag named *token* is masked, as secrets are)
        ("--eos_token <nothing>", "error: --eos_token <nothing> is not a token of the tokenizer's "
         "vocabulary: give one of its tokens"),
        # no wrong "did you mean": each named as what it is, or as a flag meaning the same
        ("--lora_ranks 8", "error: Unknown flag(s): --lora_ranks (did you mean --lora_r?)"),
    ],
)  # fmt: skip
def test_what_cannot_run_here_is_one_line_naming_ours(given, said, llm, capsys):
    line = [*model_and_chats(llm), "--eval_strategy", "no", *given.split()]
    code, _, err = dry_run(line, capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith(said), err


def test_no_hint_points_to_a_flag_that_means_something_else(llm, capsys):
    """LLaMA-Factory's --lora_rank is the LoRA rank, not --local_rank; TRL's --accelerate_config
    zero2 is --deepspeed zero2, not --accelerator_config."""
    line = [*model_and_chats(llm), "--eval_strategy", "no", "--peft"]
    for given, notice in (("--lora_rank 4", "--lora_rank read as --lora_r"),
                          ("--accelerate_config zero2",
                           "--accelerate_config zero2 read as --deepspeed zero2")):  # fmt: skip
        code, _, err = dry_run([*line, *given.split()], capsys)
        assert code == 0 and notice in err.splitlines(), err
        assert "local_rank" not in err and "accelerator_config" not in err


# -- recipe values: inline templates, lists, bf16: auto ---------------------------------------


def test_an_inline_chat_template_of_any_length_is_the_template(llm, tmp_path, capsys):
    """The handbook's and open-r1's `chat_template:` strings, and `--chat_template "$(cat
    t.jinja)"`: over 255 characters a file name is too long for the system (errno 36); the
    template reaches the tokenizer the training processes build."""
    long = TEMPLATE + "{# " + "x" * 400 + " #}"
    recipe = write_yaml(tmp_path / "r.yaml", {"chat_template": long, "eval_strategy": "no"})
    for line in (["--config", str(recipe)], ["--chat_template", long, "--eval_strategy", "no"]):
        code, config, err = dry_run([*model_and_chats(llm), *line], capsys)
        assert code == 0, err
        assert config["flags"]["task_options"]["chat_template"] == long
    task = task_of([*model_and_chats(llm), "--chat_template", long, "--eval_strategy", "no"])
    assert task.load_tokenizer().chat_template == long
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    task = task_of([*model_and_chats(llm), "--chat_template", str(tmp_path / "t.jinja"),
                    "--eval_strategy", "no"])  # fmt: skip
    assert task.load_tokenizer().chat_template == TEMPLATE


def test_a_template_that_is_neither_file_nor_jinja_is_one_line(llm, capsys):
    code, _, err = dry_run([*model_and_chats(llm), "--chat_template", "x" * 300], capsys)
    assert code == 2 and err.count("\n") == 1 and "no such file (nor a Jinja template" in err


def test_the_eos_token_is_the_tokenizers(llm):
    task = task_of([*model_and_chats(llm), "--eos_token", "<|eot_id|>", "--eval_strategy", "no"])
    assert task.load_tokenizer().eos_token == "<|eot_id|>"


def test_a_recipes_lists_and_auto_precision_are_read(llm, tmp_path, capsys):
    """`report_to: [tensorboard]` is the list; `lora_target_modules: [q_proj, v_proj]` too;
    Axolotl's `bf16: auto` leaves precision to the hardware, as a left-out flag does; a list
    naming an integration this image lacks is one line naming it."""
    content = {"report_to": ["tensorboard"], "bf16": "auto", "use_peft": True,
               "lora_target_modules": ["q_proj", "v_proj"], "eval_strategy": "no",
               "model_revision": "main", "gradient_checkpointing_kwargs":
               {"use_reentrant": False}}  # fmt: skip
    code, config, err = dry_run(
        [*model_and_chats(llm), "--config", write_yaml(tmp_path / "r.yaml", content)], capsys
    )
    assert code == 0, err
    flags = config["flags"]
    assert flags["model"]["lora_target_modules"] == "q_proj,v_proj"
    assert flags["training"]["report_to"] in ("tensorboard", ["tensorboard"])
    assert flags["training"]["bf16"] is False  # a CPU: the hardware decides fp32
    content["report_to"] = ["tensorboard", "wandb"]
    code, _, err = dry_run(
        [*model_and_chats(llm), "--config", write_yaml(tmp_path / "r.yaml", content)], capsys
    )
    assert code == 2 and err.startswith("error: --report_to wandb: not installed"), err


# -- data as people keep it ---------------------------------------------------------------------


def test_train_and_validation_without_test_evaluates_on_validation(llm, capsys):
    code, config, err = dry_run(model_and_chats(llm, "kept"), capsys)
    assert code == 0, err
    assert config["flags"]["data"]["eval_split_name"] == "validation"
    notices = [line for line in err.splitlines() if line.startswith("evaluation split:")]
    assert notices == [f"evaluation split: validation ({llm / 'kept'} has train and "
                       "validation, no test; --eval_split_name names another)"]  # fmt: skip


@pytest.mark.parametrize("off", ["--do_eval False", "--eval_strategy no"])
def test_evaluation_off_needs_no_evaluation_split(off, llm, capsys):
    code, config, err = dry_run([*model_and_chats(llm), *off.split()], capsys)
    assert code == 0 and config["flags"]["data"]["eval_split_name"] == "", err


def test_run_clms_train_file_is_text_generation(llm, capsys):
    """HF run_clm.py's --train_file and --validation_file, with a causal LM: the task is
    inferred from the model (never "add --task text-classification")."""
    kept = llm / "kept"
    line = ["--model_name_or_path", llm / "llama", "--train_file", kept / "train.jsonl",
            "--validation_file", kept / "validation.jsonl"]  # fmt: skip
    code, config, err = dry_run(line, capsys)
    assert code == 0 and config["flags"]["task"] == "text-generation", err
    assert config["flags"]["data"]["eval_split_name"] == "validation"
    assert "text-classification" not in err
    task = task_of([*line, "--max_steps", "1"])
    train, evaluation = task.load_datasets(task.load_tokenizer())
    assert len(train) == 4 and len(evaluation) == 4


# -- attention kernels tell the truth -----------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("--attn_implementation sdpa", None),
        ("--attn_implementation eager", None),
        ("--attn_implementation flash_attention_2", "flash-attn is not installed in this image, "
         "which has PyTorch's sdpa kernels"),
        ("--use_flash_attention_2", "flash-attn is not installed in this image, which has "
         "PyTorch's sdpa kernels"),
        ("--attn_implementation flex", "--attn_implementation flex: this image runs sdpa"),
    ],
)  # fmt: skip
def test_every_attention_choice_runs_or_is_refused_before_launch(given, said, llm, capsys):
    """Each choice --help lists for --attn_implementation is planned or refused in one line: none
    is accepted to die in the training processes (flash-attn is in no image)."""
    if said and "flash" in given and importlib.util.find_spec("flash_attn") is not None:
        said = None  # where flash-attn is installed, it runs
    code, _, err = dry_run([*model_and_chats(llm), "--eval_strategy", "no", *given.split()],
                           capsys)  # fmt: skip
    if said is None:
        assert code == 0, err
    else:
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(lines) == 1 and said in lines[0], err


# -- the handbook's mixture of one dataset, Axolotl's and LLaMA-Factory's files ----------------


def test_a_mixture_of_one_dataset_is_that_dataset_with_its_splits(llm, tmp_path, capsys):
    """The alignment-handbook's `dataset_mixer: {ID: 1.0}` + `dataset_splits`, and TRL's
    `dataset_mixture` of one dataset; several are a mixture
    (tests/unit/test_dataset_mixtures.py)."""
    sft, other = tmp_path / "sft", tmp_path / "other"
    for folder in (sft, other):
        folder.mkdir()
        for split in ("train_sft", "test_sft"):
            (folder / f"{split}.jsonl").write_text((llm / "chats" / "train.jsonl").read_text())
    model = {"model_name_or_path": str(llm / "llama")}
    files = {
        "handbook": {**model, "dataset_mixer": {str(sft): 1.0},
                     "dataset_splits": ["train_sft", "test_sft"]},
        "trl": {**model, "dataset_mixture": {"datasets": [{"path": str(sft),
                                                           "split": "train_sft"}]},
                "eval_strategy": "no"},
    }  # fmt: skip
    planned = {}
    for name, content in files.items():
        code, config, err = dry_run(["--config", write_yaml(tmp_path / "r.yaml", content)], capsys)
        assert code == 0, err
        data = config["flags"]["data"]
        planned[name] = data["dataset_name"], data["train_split_name"], data["eval_split_name"]
    assert planned == {"handbook": (str(sft), "train_sft", "test_sft"),
                       "trl": (str(sft), "train_sft", "")}  # fmt: skip
    two = {**model, "dataset_mixer": {str(sft): 0.5, str(other): 1.0},
           "dataset_splits": ["train_sft", "test_sft"]}  # fmt: skip
    code, config, err = dry_run(["--config", write_yaml(tmp_path / "r.yaml", two)], capsys)
    assert code == 0, err
    mixture = json.loads(config["flags"]["task_options"]["dataset_mixture"])
    assert (mixture, config["flags"]["data"]["dataset_name"]) == (two["dataset_mixer"], None)


def planned_flags(config) -> dict:
    """The resolved configuration's flags in the dry run's groups."""
    return {"model": dataclasses.asdict(config.model), "data": dataclasses.asdict(config.data),
            "task_options": config.task_options, "training": config.training.values}  # fmt: skip


def test_an_axolotl_file_is_read_key_by_key(llm, tmp_path, capsys):
    content = {"base_model": str(llm / "llama"), "strict": False,
               "datasets": [{"path": str(llm / "kept"), "type": "chat_template"}],
               "val_set_size": 0, "adapter": "qlora", "sequence_len": 512,
               "sample_packing": True, "pad_to_sequence_len": True, "lora_r": 8,
               "lora_target_linear": True, "micro_batch_size": 2, "num_epochs": 2,
               "lr_scheduler": "cosine", "wandb_project": None, "bf16": "auto",
               "train_on_inputs": False}  # fmt: skip
    flags = planned_flags(resolved(["--config", write_yaml(tmp_path / "a.yaml", content)]))
    assert flags["model"].items() >= {"model_name_or_path": str(llm / "llama"), "peft": "lora",
                                   "load_in_4bit": True, "lora_r": 8,
                                   "lora_target_modules": "all-linear"}.items()  # fmt: skip
    assert flags["task_options"]["max_seq_length"] == 512 and flags["task_options"]["packing"]
    assert flags["training"]["per_device_train_batch_size"] == 2
    assert flags["training"]["num_train_epochs"] == 2
    assert flags["data"]["eval_split_name"] == "validation"  # train and validation, no test
    content["adapter"] = "lora"  # QLoRA needs a CUDA GPU, which the dry run here lacks
    code, _, err = dry_run(["--config", write_yaml(tmp_path / "a.yaml", content)], capsys)
    assert (
        code == 0 and "Axolotl file: its keys are read as this trainer's flags" in err.splitlines()
    )
    notices = [line for line in err.splitlines() if "(Axolotl) ignored" in line]
    assert notices == ["pad_to_sequence_len (Axolotl) ignored: each batch pads to its longest "
                       "example"], err  # fmt: skip
    content["lora_fan_in_fan_out"] = True
    code, _, err = dry_run(["--config", write_yaml(tmp_path / "a.yaml", content)], capsys)
    assert code == 2 and err == ("error: lora_fan_in_fan_out (Axolotl) is not read here: python "
                                 "-m trainer --help lists this trainer's flags "
                                 "(docs/launching.md).\n")  # fmt: skip


def test_a_llama_factory_file_is_read_key_by_key(llm, tmp_path):
    content = {"model_name_or_path": str(llm / "llama"), "stage": "sft", "do_train": True,
               "finetuning_type": "lora", "lora_target": "q_proj,v_proj", "lora_rank": 4,
               "dataset": str(llm / "chats"), "template": "llama3", "cutoff_len": 256,
               "val_size": 0.25}  # fmt: skip
    flags = planned_flags(resolved(["--config", write_yaml(tmp_path / "f.yaml", content)]))
    assert flags["model"]["peft"] == "lora" and flags["model"]["lora_r"] == 4
    assert flags["model"]["lora_target_modules"] == "q_proj,v_proj"
    assert flags["task_options"]["max_seq_length"] == 256
    assert flags["data"]["train_val_split"] == 0.25
    content["stage"] = "ppo"
    with pytest.raises(UserError, match=r"^stage \(LLaMA-Factory\) ppo: text-generation here is "
                       r".*preference-tuning DPO \(stage: dpo\)"):  # fmt: skip
        resolved(["--config", write_yaml(tmp_path / "f.yaml", content)])


def preference_pairs(folder):
    rows = [{"prompt": [{"role": "user", "content": f"Say {word}."}],
             "chosen": [{"role": "assistant", "content": f"{word.title()}!"}],
             "rejected": [{"role": "assistant", "content": word}]}
            for word in ("yes", "no", "maybe", "later")]  # fmt: skip
    folder.mkdir()
    for split in ("train", "test"):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def test_a_dpo_stage_of_llama_factory_or_axolotl_is_preference_tuning(llm, tmp_path):
    """LLaMA-Factory's `stage: dpo` and Axolotl's `rl: dpo` / `rl: ipo` choose the
    preference-tuning task (TRL's DPOTrainer), their beta and loss its flags; what TRL's DPO
    does not compute the same way is refused in one line."""
    pairs = str(preference_pairs(tmp_path / "pairs"))
    factory = {"model_name_or_path": str(llm / "llama"), "stage": "dpo", "do_train": True,
               "finetuning_type": "lora", "lora_target": "all", "dataset": pairs,
               "template": "llama3", "cutoff_len": 256, "pref_beta": 0.2,
               "pref_loss": "hinge"}  # fmt: skip
    config = resolved(["--config", write_yaml(tmp_path / "f.yaml", factory)])
    assert config.task == "preference-tuning"
    assert (config.task_options["beta"], config.task_options["loss_type"]) == (0.2, "hinge")
    assert config.model.peft == "lora" and config.data.dataset_name == pairs
    for key, value, refused in (("pref_loss", "simpo", "pref_loss (LLaMA-Factory) simpo: "),
                                ("pref_ftx", 1.0, "pref_ftx (LLaMA-Factory) is not read here: "
                                 "give --rpo_alpha")):  # fmt: skip
        with pytest.raises(UserError, match=f"^{re.escape(refused)}"):
            resolved(["--config", write_yaml(tmp_path / "f.yaml", {**factory, key: value})])

    axolotl = {"base_model": str(llm / "llama"), "rl": "ipo", "rl_beta": 0.05,
               "datasets": [{"path": pairs, "split": "train"}], "adapter": "lora",
               "sequence_len": 256, "micro_batch_size": 2}  # fmt: skip
    config = resolved(["--config", write_yaml(tmp_path / "a.yaml", axolotl)])
    assert config.task == "preference-tuning" and config.model.peft == "lora"
    assert (config.task_options["beta"], config.task_options["loss_type"]) == (0.05, "ipo")
    assert config.task_options["max_seq_length"] == 256
    with pytest.raises(UserError, match=r"^rl \(Axolotl\) kto: preference tuning here is TRL's "):
        resolved(["--config", write_yaml(tmp_path / "a.yaml", {**axolotl, "rl": "kto"})])
    typed = {**axolotl, "datasets": [{"path": pairs, "type": "chatml.intel"}]}
    with pytest.raises(UserError, match=r"type chatml.intel: .*or preference pairs"):
        resolved(["--config", write_yaml(tmp_path / "a.yaml", typed)])
