"""A job as users bring it from the Hugging Face examples, through the real
`python -m trainer` with two processes over gloo (as on a node with two GPUs): no --task
(inferred from the model), a sentence pair (MRPC's shape: sentence1, sentence2, label), and
a dataset with a training split only, evaluated on the part `--train_val_split` draws from
it. The flags themselves, in this process: tests/unit/test_user_flags.py."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.helpers import run_trainer, trainer_env
from tests.support.tiny_assets import write_paraphrase_csv


@pytest.mark.slow
def test_a_train_only_sentence_pair_job_trains_with_two_processes_and_train_val_split(
    text_assets, tmp_path
):
    """Pairs and the split drawn from train are two flags of one code path (the text
    task's datasets), so one run shows both: the pair set's 60 training rows lose 9 to
    the evaluation split, on which the model is evaluated."""
    data = tmp_path / "train-only-pairs"
    write_paraphrase_csv(data, splits=("train",))
    assert sorted(path.name for path in data.iterdir()) == ["train.csv"]
    args = ["--nproc_per_node", "2", "--deepspeed", "none",
            "--model_name_or_path", str(text_assets[0]), "--dataset_name", str(data),
            "--text_column_name", "sentence1,sentence2", "--train_val_split", "0.15",
            "--max_steps", "6", "--per_device_train_batch_size", "8",
            "--per_device_eval_batch_size", "8", "--learning_rate", "3e-3",
            "--max_seq_length", "32", "--output_dir", "out"]  # fmt: skip
    code, output = run_trainer(args, cwd=tmp_path, env=trainer_env(tmp_path / "cache"))
    assert code == 0, output[-3000:]
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert "task: text-classification (no --task; " in output
    assert "labels from split train of" in output and "0 0, 1 1" in output
    assert "evaluation split: 0.15 of split train, drawn with seed 42" in output
    assert "on 9 eval examples" in output and 0 <= results["eval_accuracy"] <= 1, results
    assert re.findall(r"step (\d+)/6", output)[-1] == "6"


@pytest.mark.slow
def test_users_llm_recipes_train_for_three_steps(tmp_path):
    """LLM users' files as published (tests/support/llm_recipes.py), through
    the real `python -m trainer --config FILE` for 3 steps on one tiny Llama, each delivering a
    model: the alignment-handbook's zephyr QLoRA recipe (its inline chat template, its
    `dataset_mixer` of one dataset with `dataset_splits`, `model_revision: main`, a
    `report_to` list) as this CPU runs it (no 4-bit base, no bf16 weights or steps),
    Axolotl's lora-1b.yml (chats, `bf16: auto`, `val_set_size`), and the handbook's starchat2
    recipe (a `dataset_mixture` of four splits of two datasets, its test part held out: 8 rows
    of the tiny copies' 64, not 1000; an inline ChatML template)."""
    from tests.support.chat_models import FAMILIES, save_family_model
    from tests.support.llm_recipes import (
        HANDBOOK_CHAT_TEMPLATE,
        STARCHAT2_SFT,
        ZEPHYR_SFT_QLORA,
        axolotl,
    )

    save_family_model(FAMILIES["llama"], tmp_path / "llama")
    chat = {"messages": [{"role": "user", "content": "Hello"},
                         {"role": "assistant", "content": "Hi."}]}  # fmt: skip
    for folder, splits in (("sft", ("train_sft", "test_sft")), ("sft2", ("train_sft", "test_sft")),
                           ("kept", ("train", "validation"))):  # fmt: skip
        (tmp_path / folder).mkdir()
        for split in splits:
            (tmp_path / folder / f"{split}.jsonl").write_text("\n".join([json.dumps(chat)] * 16))
    handbook = (ZEPHYR_SFT_QLORA.replace("load_in_4bit: true\n", "")
                .replace("bf16: true\n", "").replace("torch_dtype: bfloat16\n", "")
                .replace("push_to_hub: true\n", "")
                .replace("@TEMPLATE@", json.dumps(HANDBOOK_CHAT_TEMPLATE)))  # fmt: skip
    starchat = (STARCHAT2_SFT.replace("flash_attention_2", "sdpa").replace("- wandb\n", "")
                .replace("bf16: true\n", "").replace("torch_dtype: bfloat16\n", "")
                .replace("push_to_hub: true\n", "")
                .replace("test_split_size: 1000", "test_split_size: 8"))  # fmt: skip
    files = {"handbook": handbook, "axolotl": axolotl(), "starchat2": starchat}
    for name, text in files.items():
        for mark, path in (("@LLAMA@", "llama"), ("@SFT@", "sft"), ("@SFT2@", "sft2"),
                           ("@KEPT@", "kept")):  # fmt: skip
            text = text.replace(mark, str(tmp_path / path))
        (tmp_path / f"{name}.yaml").write_text(text)
        cwd = tmp_path / name
        cwd.mkdir()
        args = ["--config", str(tmp_path / f"{name}.yaml"), "--max_steps", "3",
                "--nproc_per_node", "1", "--deepspeed", "none", "--output_dir", "out",
                "--max_seq_length", "64", "--save_strategy", "no",
                "--logging_steps", "1"]  # fmt: skip
        code, output = run_trainer(args, cwd=cwd, env=trainer_env(tmp_path / "cache"))
        assert code == 0, (name, output[-3000:])
        assert re.findall(r"step (\d+)/3", output)[-1] == "3", output[-2000:]
        assert (cwd / "out" / "model" / "config.json").is_file(), name
    assert "evaluation split: 8 of the mixture, drawn with seed 0 (test_split_size)" in output
