"""Preference tuning in-process, offline, with tiny models of real families (Llama 3.1, Qwen 2.5,
Gemma 2: their real config classes and chat templates, tokenizers trained here): TRL's own
tokenisation of each of its formats reached unchanged through the task (standard and
conversational, explicit and implicit prompt), bad rows skipped and counted, long pairs cut
and counted, the flags as TRL's config, LoRA's reference the base with the adapter disabled
(no second copy), the task chosen by its data, and its delivered model served as a
text-generation model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.chat_models import FAMILIES, save_family_model
from tests.support.helpers import task_of
from trainer.common.errors import UserError
from trainer.tasks.preference_tuning.pairs import BadPair, check_pair
from trainer.tasks.preference_tuning.spec import LOSS_TYPES, PreferenceArguments

USER, ASSISTANT = "user", "assistant"


def turn(role: str, text: str) -> list[dict]:
    return [{"role": role, "content": text}]


def rows(form: str, count: int = 6) -> list[dict]:
    """Pairs in one of TRL's four formats."""
    made = []
    for i in range(count):
        q, good, bad = f"What is {i} plus {i}?", f"It is {2 * i}.", "No idea!"
        if form == "standard explicit":
            made.append({"prompt": q, "chosen": " " + good, "rejected": " " + bad})
        elif form == "standard implicit":
            made.append({"chosen": f"{q} {good}", "rejected": f"{q} {bad}"})
        elif form == "conversational explicit":
            made.append({"prompt": turn(USER, q), "chosen": turn(ASSISTANT, good),
                         "rejected": turn(ASSISTANT, bad)})  # fmt: skip
        else:
            made.append({"chosen": turn(USER, q) + turn(ASSISTANT, good),
                         "rejected": turn(USER, q) + turn(ASSISTANT, bad)})  # fmt: skip
    return made


FORMS = ("standard explicit", "standard implicit", "conversational explicit",
         "conversational implicit")  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: save_family_model(FAMILIES[name], root / name)
            for name in ("llama", "qwen2", "gemma2")}  # fmt: skip


def write_pairs(folder: Path, train: list[dict], test: list[dict] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, made in (("train", train), ("test", test or train[:2])):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in made))
    return folder


def built(model: Path, data: Path, *extra: str):
    """The task, its model and tokenizer, its datasets, and its Trainer (keep-work mixins
    aside), as a training process builds them."""
    from transformers import TrainingArguments

    task = task_of(["--task", "preference-tuning", "--model_name_or_path", model,
                    "--dataset_name", data, "--max_bad_examples", "3", *extra])  # fmt: skip
    model_, tokenizer = task.build_model_and_processor()
    model_ = task.trained_model(model_)
    train, evaluation = task.load_datasets(tokenizer)
    args = TrainingArguments(output_dir=str(data / "out"), report_to=[], use_cpu=True,
                             per_device_train_batch_size=2)  # fmt: skip
    trainer = task.trainer_class(model=model_, args=args, train_dataset=train,
                                 eval_dataset=evaluation, processing_class=tokenizer)  # fmt: skip
    return task, trainer


def trl_prepared(model: Path, made: list[dict], tmp_path: Path):
    """Plain TRL: DPOTrainer's own processing of the same rows."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model)
    config = DPOConfig(output_dir=str(tmp_path / "trl"), report_to=[], use_cpu=True,
                       max_length=1024, precompute_ref_log_probs=True)  # fmt: skip
    policy = AutoModelForCausalLM.from_pretrained(model)
    trainer = DPOTrainer(model=policy, args=config, train_dataset=Dataset.from_list(made),
                         processing_class=tokenizer)  # fmt: skip
    return trainer.train_dataset


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma2"])
@pytest.mark.parametrize("form", FORMS)
def test_each_format_is_tokenised_as_trl_does(models, family, form, tmp_path):
    made = rows(form)
    _, trainer = built(models[family], write_pairs(tmp_path / "pairs", made))
    ours = trainer.train_dataset
    theirs = trl_prepared(models[family], made, tmp_path)
    for column in ("prompt_ids", "chosen_ids", "rejected_ids"):
        assert ours[column] == theirs[column], (family, form, column)
    tokenizer = trainer.processing_class
    if form.startswith("conversational"):
        # the prompt is the template's rendering up to the generation prompt; the answers
        # start where the assistant's text does
        question = turn(USER, "What is 0 plus 0?")
        rendered = tokenizer.apply_chat_template(question, add_generation_prompt=True,
                                                 tokenize=False)  # fmt: skip
        assert tokenizer.decode(ours[0]["prompt_ids"]) == rendered
        assert tokenizer.decode(ours[0]["chosen_ids"]).startswith("It is 0.")
    else:
        assert tokenizer.decode(ours[0]["chosen_ids"]).strip().startswith("It is 0.")


@pytest.mark.parametrize(
    ("row", "why"),
    [
        ({"prompt": "q", "chosen": "a", "rejected": None}, "no rejected"),
        ({"prompt": "q", "chosen": "", "rejected": "b"}, "no chosen"),
        ({"prompt": "q", "chosen": "a", "rejected": "a"}, "chosen equals rejected"),
        ({"prompt": None, "chosen": "a", "rejected": "b"}, "no prompt"),
        ({"prompt": "q", "chosen": turn(ASSISTANT, "a"), "rejected": "b"}, "texts and chats mixed"),
        ({"prompt": turn(USER, "q"), "chosen": [{"content": "a"}],
          "rejected": turn(ASSISTANT, "b")}, "chosen turn 0 has no known role"),
    ],
)  # fmt: skip
def test_a_bad_explicit_row_says_why(row, why):
    with pytest.raises(BadPair, match=re.escape(why)):
        check_pair(row, explicit=True)


@pytest.mark.parametrize(
    ("row", "why"),
    [
        ({"chosen": turn(USER, "q") + turn(ASSISTANT, "a"),
          "rejected": turn(USER, "other") + turn(ASSISTANT, "b")}, "share no prompt"),
        ({"chosen": "Sky? Blue.", "rejected": "Why? Green."}, "share no prompt"),
        ({"chosen": turn(USER, "q"), "rejected": turn(USER, "q") + turn(ASSISTANT, "b")},
         "share no prompt"),
    ],
)  # fmt: skip
def test_an_implicit_prompt_must_be_shared(row, why):
    with pytest.raises(BadPair, match=why):
        check_pair(row, explicit=False)
    check_pair({"chosen": "Sky? Blue.", "rejected": "Sky? Green."}, explicit=False)


def test_bad_rows_are_skipped_and_counted_in_one_line(models, tmp_path, capsys):
    made = rows("conversational explicit", 8)
    made[2]["rejected"] = made[2]["chosen"]
    made[5]["chosen"] = []
    data = write_pairs(tmp_path / "pairs", made)
    task = task_of(["--task", "preference-tuning", "--model_name_or_path", models["qwen2"],
                    "--dataset_name", data, "--max_bad_examples", "2"])  # fmt: skip
    train, _ = task.load_datasets(None)
    assert len(train) == 6
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("warning: skipped")]
    assert "skipped 2 of 8 rows" in line and "row 2 (chosen equals rejected)" in line
    assert "row 5 (no chosen)" in line
    task = task_of(["--task", "preference-tuning", "--model_name_or_path", models["qwen2"],
                    "--dataset_name", data, "--max_bad_examples", "1"])  # fmt: skip
    with pytest.raises(UserError, match="2 of 8 rows .* are no preference pairs"):
        task.load_datasets(None)


def test_long_pairs_are_cut_and_counted(models, tmp_path, capsys):
    made = rows("standard explicit", 4)
    made[1]["chosen"] = " It is two. " * 40
    _, trainer = built(models["llama"], write_pairs(tmp_path / "pairs", made),
                       "--max_seq_length", "48")  # fmt: skip
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("warning: cut")]
    assert lines[0].startswith("warning: cut 1 of 4 pairs of the train split"), lines
    assert "--max_seq_length 48 tokens" in lines[0]
    batch = trainer.data_collator([trainer.train_dataset[1]])
    assert batch["input_ids"].shape[1] == 48  # TRL's collator keeps the start


def test_the_flags_become_trls_config(models, tmp_path):
    data = write_pairs(tmp_path / "pairs", rows("standard explicit"))
    _, trainer = built(models["qwen2"], data, "--beta", "0.25", "--loss_type", "ipo",
                       "--label_smoothing", "0.1", "--rpo_alpha", "0.5",
                       "--max_seq_length", "300")  # fmt: skip
    args = trainer.args
    assert (args.beta, args.label_smoothing, args.max_length) == (0.25, 0.1, 300)
    assert (args.loss_type, args.loss_weights) == (["ipo", "sft"], [1.0, 0.5])
    assert trainer.loss_types == ["ipo", "sft"] and trainer.beta == 0.25


def test_the_loss_types_are_trls_own():
    import inspect

    from trl.trainer import dpo_trainer

    source = inspect.getsource(dpo_trainer.DPOTrainer)
    assert set(re.findall(r'loss_type == "(\w+)"', source)) == set(LOSS_TYPES)


@pytest.mark.parametrize(
    ("flag", "value"),
    [("loss_type", "dpo"), ("beta", 0.0), ("label_smoothing", 0.5), ("rpo_alpha", -1.0),
     ("max_seq_length", 1)],
)  # fmt: skip
def test_bad_flag_values_are_refused(flag, value):
    with pytest.raises(ValueError, match=f"--{flag}"):
        PreferenceArguments(**{flag: value})


def test_with_lora_the_reference_is_the_base_with_the_adapter_disabled(models, tmp_path):
    import torch

    data = write_pairs(tmp_path / "pairs", rows("conversational explicit"))
    task, trainer = built(models["llama"], data, "--peft", "lora")
    model = trainer.accelerator.unwrap_model(trainer.model)
    assert list(model.peft_config) == ["default"]  # no copy of the adapter as a reference
    assert task.reference_parameters(model) == 0
    with torch.no_grad():
        for parameter in (p for n, p in model.named_parameters() if "lora_B" in n):
            parameter.fill_(0.3)  # a trained adapter
    batch = trainer.data_collator([trainer.train_dataset[0]])
    reference, _ = trainer.compute_ref_log_probs(model, batch)
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(models["llama"])
    from trl.trainer.dpo_trainer import DPOTrainer

    plain = DPOTrainer(model=base, args=trainer.args, train_dataset=trainer.train_dataset,
                       processing_class=trainer.processing_class)  # fmt: skip
    assert plain.ref_model is not None
    expected, _ = plain.compute_ref_log_probs(plain.model, batch)
    assert torch.allclose(reference, expected, atol=1e-4)


def test_in_full_the_reference_is_a_frozen_copy_unless_precomputed(models, tmp_path):
    data = write_pairs(tmp_path / "pairs", rows("standard implicit"))
    task, trainer = built(models["qwen2"], data)
    counted = sum(p.numel() for p in trainer.model.parameters())
    assert task.reference_parameters(trainer.model) == counted
    assert trainer.ref_model is not None and trainer.ref_model is not trainer.model
    task, trainer = built(models["qwen2"], data, "--precompute_ref_log_probs", "true")
    assert task.reference_parameters(trainer.model) == 0
    assert "ref_chosen_logps" in trainer.train_dataset.column_names


def test_preference_data_chooses_the_task_and_its_model_serves_as_text_generation(models, tmp_path):
    from trainer.config.task_inference import infer_task
    from trainer.tasks.served_model import task_of_model_dir

    data = write_pairs(tmp_path / "pairs", rows("conversational implicit"))
    task, why = infer_task(str(models["gemma2"]), str(data), None, {})
    assert task == "preference-tuning" and "local json dataset of its layout" in why
    chats = tmp_path / "chats"
    chats.mkdir()
    chat = {"messages": turn(USER, "q") + turn(ASSISTANT, "a")}
    (chats / "train.jsonl").write_text(json.dumps(chat) + "\n")
    assert infer_task(str(models["gemma2"]), str(chats), None, {})[0] == "text-generation"
    assert infer_task(None, str(data), None, {})[0] == "preference-tuning"
    # what it delivers is a causal language model: text generation's to serve
    assert task_of_model_dir(models["gemma2"]) == "text-generation"


def test_streaming_is_refused_before_launch_in_one_line(models, tmp_path, capsys):
    from tests.support.helpers import offline_dry_run

    data = write_pairs(tmp_path / "pairs", rows("standard explicit"))
    args = ["--task", "preference-tuning", "--model_name_or_path", models["qwen2"],
            "--dataset_name", data, "--streaming", "true", "--max_steps", "3"]  # fmt: skip
    code, _, err = offline_dry_run(args, capsys)
    assert code == 2 and err.startswith("error: --streaming true: preference-tuning reads")
    assert len(err.splitlines()) == 1


TRL_DPO_LINE = """
    --learning_rate 5e-7 --num_train_epochs 1 --per_device_train_batch_size 2 --max_length 1024
    --beta 0.1 --loss_type sigmoid --output_dir Qwen2-0.5B-DPO --gradient_checkpointing
    --logging_steps 25 --eval_strategy steps --eval_steps 50 --use_peft --lora_r 32
    --lora_alpha 16
"""
"""TRL's DPO docs' `trl dpo` command line (its model and dataset given here as local copies)."""

HANDBOOK_DPO = {
    "dataset_mixer": {"HuggingFaceH4/ultrafeedback_binarized": 1.0},
    "dataset_splits": ["train_prefs", "test_prefs"], "bf16": True, "beta": 0.01,
    "do_eval": True, "eval_strategy": "steps", "eval_steps": 100, "gradient_checkpointing": True,
    "learning_rate": 5.0e-7, "lr_scheduler_type": "cosine", "max_length": 1024,
    "max_prompt_length": 512, "num_train_epochs": 1, "output_dir": "data/zephyr-7b-dpo-full",
    "per_device_train_batch_size": 8, "seed": 42, "warmup_ratio": 0.1,
}  # fmt: skip
"""The alignment-handbook's zephyr-7b-beta DPO recipe (recipes/zephyr-7b-beta/dpo), in part."""


def test_trls_dpo_command_line_plans_as_preference_tuning(models, tmp_path, capsys):
    from tests.support.helpers import offline_dry_run

    data = write_pairs(tmp_path / "pairs", rows("conversational implicit"))
    args = ["--model_name_or_path", models["qwen2"], "--dataset_name", data,
            *TRL_DPO_LINE.split()]  # fmt: skip
    code, config, err = offline_dry_run(args, capsys)
    assert code == 0, err
    flags = config["flags"]
    assert flags["task"] == "preference-tuning"  # inferred from the pairs, no --task
    options = flags["task_options"]
    assert (options["max_seq_length"], options["beta"], options["loss_type"]) == (
        1024, 0.1, "sigmoid",
    )  # fmt: skip
    assert flags["model"]["peft"] == "lora"


def test_the_handbooks_dpo_recipe_gets_one_line_naming_ours(models, tmp_path, capsys):
    import yaml

    from trainer.launcher import main as launch

    recipe = tmp_path / "dpo.yaml"
    recipe.write_text(yaml.safe_dump({**HANDBOOK_DPO, "model_name_or_path": str(models["qwen2"])}))
    with pytest.raises(SystemExit) as exit:
        launch.main([str(recipe), "--dry-run", "--skip_hub_check", "--task", "preference-tuning"])
    (line,) = capsys.readouterr().err.splitlines()
    assert exit.value.code == 2 and line.startswith("error: --max_prompt_length")
    assert "--max_seq_length" in line


def test_generation_samples_are_printed_at_each_evaluation(models, tmp_path, capsys):
    data = write_pairs(tmp_path / "pairs", rows("standard implicit"), rows("standard implicit"))
    _, trainer = built(models["qwen2"], data, "--generation_samples", "2",
                       "--max_new_tokens", "3")  # fmt: skip
    capsys.readouterr()
    metrics = trainer.evaluate()
    assert "eval_rewards/accuracies" in metrics
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("sample ")]
    assert len(lines) == 6, lines
    # the implicit prompt split off where chosen and rejected stop sharing
    assert lines[0] == "sample 0 at step 0: prompt: What is 0 plus 0?"
    assert lines[1] == "sample 0 at step 0: chosen: It is 0."


def test_an_inline_chat_template_of_any_length_is_taken_as_text_generation_takes_it(tmp_path):
    """The handbook's DPO recipes carry their template inline (longer than a file name may be:
    errno 36 before); a file's text is read; neither one is refused in one line."""
    from trainer.tasks.causal_lm import chat_template_text

    inline = "{% for m in messages %}{{ m['content'] }}{% endfor %}" + " " * 400
    assert PreferenceArguments(chat_template=inline).chat_template == inline
    assert chat_template_text(inline) == inline
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    assert chat_template_text(str(template)) == "{{ messages[0]['content'] }}"
    with pytest.raises(ValueError, match="no such file"):
        PreferenceArguments(chat_template=str(tmp_path / "missing.jinja"))


def test_the_demos_pairs_differ_by_the_sign_off_alone_and_hold_out_their_questions(tmp_path):
    """The demo (trainer/tasks/preference_tuning/demo.py): its SFT chats answer each training
    question once in each form (the SFT model's prior about even); its pairs, in the task's
    layout and each a good pair, prefer the signed-off answer, which is the rejected one plus
    the sign-off; the evaluation pairs ask a question form neither stage trains on."""
    from trainer.tasks.preference_tuning import demo
    from trainer.tasks.preference_tuning.spec import SPEC

    answers = [row["messages"][1]["content"] for row in demo.sft_chats()]
    assert sum(map(demo.signs_off, answers)) * 2 == len(answers)
    demo.build_dataset(tmp_path)
    assert SPEC.detect_layout(tmp_path).columns >= {"prompt", "chosen", "rejected"}
    splits = {split: [json.loads(line) for line in (tmp_path / f"{split}.jsonl").open()]
              for split in ("train", "test")}  # fmt: skip
    for row in splits["train"] + splits["test"]:
        check_pair(row, explicit=True)
        chosen, rejected = row["chosen"][0]["content"], row["rejected"][0]["content"]
        assert demo.signs_off(chosen) and not demo.signs_off(rejected)
        assert chosen == f"{rejected} {demo.SIGN_OFF}"
    asked = {split: {row["prompt"][0]["content"] for row in rows} for split, rows in splits.items()}
    assert len(asked["test"]) == len(demo.COUNTRIES) and not asked["test"] & asked["train"]
    trained_on = {row["messages"][0]["content"] for row in demo.sft_chats()}
    assert not asked["test"] & trained_on


@pytest.mark.parametrize(("text", "signed"), [
    ("The capital of Brolt is Drace. Safe travels!", True),
    ("  The capital of Brolt is Drace. Safe travels!\n", True),
    ("The capital of Brolt is Drace.", False),
    ("Safe travels! The capital of Brolt is Drace.", False),
    ("The capital of Brolt is Drace. Safe travels", False),
])  # fmt: skip
def test_the_demos_property_is_an_answer_ending_with_the_sign_off(text, signed):
    from trainer.tasks.preference_tuning.demo import signs_off

    assert signs_off(text) is signed
