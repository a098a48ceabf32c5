"""Text generation's data, in-process, with tiny models of real families (tests/support/
chat_models.py: real config classes, locally trained byte-level BPE tokenizers with each
family's special tokens and real chat template): where the loss goes for each family's template,
prompt/completion pairs, the flag that trains on everything, bad and long rows, packing
without cross-talk, and the lines before launch (no chat template, a folder of chats)."""

from __future__ import annotations

import json

import pytest

from tests.support.chat_models import FAMILIES, family_model, family_tokenizer, save_family_model
from trainer.common.errors import UserError
from trainer.settings.data_flags import DataArguments
from trainer.settings.model_flags import ModelArguments
from trainer.tasks.text_generation.loss_mask import IGNORED, encode_row, marked_template
from trainer.tasks.text_generation.spec import ChatArguments

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CHAT = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And Japan?"},
    {"role": "assistant", "content": "Tokyo, of course."},
]


def learnt_runs(tokenizer, ids: list[int], labels: list[int]) -> list[str]:
    """The texts of the runs of tokens that carry a loss, in order."""
    runs, run = [], []
    for token, label in zip(ids, labels, strict=True):
        if label != IGNORED:
            assert label == token
            run.append(token)
        elif run:
            runs.append(run)
            run = []
    return [tokenizer.decode(r) for r in ([*runs, run] if run else runs)]


def chat_task(tmp_path, tokenizer=None, **options):
    from trainer.tasks.text_generation.training import ChatTask

    task = ChatTask(
        ModelArguments(model_name_or_path=str(tmp_path)),
        DataArguments(dataset_name=str(tmp_path), max_bad_examples=options.pop("bad", "1%")),
        ChatArguments(**options),
        {},
    )
    task._tokenizer = tokenizer
    return task


def as_dataset(rows: list[dict]):
    from datasets import Dataset

    return Dataset.from_list(rows)


@pytest.mark.parametrize("name", ["llama", "qwen2", "gemma2"])
def test_the_loss_covers_the_assistant_turns_and_their_end_only_for_each_familys_template(name):
    family = FAMILIES[name]
    tokenizer = family_tokenizer(family)
    assert marked_template(tokenizer.chat_template) is None  # no generation markers
    messages = ([SYSTEM] if family.takes_system else []) + CHAT
    encoded = encode_row(tokenizer, {"messages": messages}, "conversational", ChatArguments())
    assert learnt_runs(tokenizer, encoded.input_ids, encoded.labels) == [
        "Paris." + family.turn_end,
        "Tokyo, of course." + family.turn_end,
    ]
    # the ids are the template's text, tokenised as the model sees it at inference
    assert tokenizer.decode(encoded.input_ids) == tokenizer.apply_chat_template(
        messages, tokenize=False
    )


def test_a_template_that_rewrites_earlier_turns_is_masked_by_trls_marked_copy(tmp_path):
    """Qwen3's template renders an assistant turn differently once a user turn follows it
    (its reasoning block), so rendering cannot split the chat: TRL's training copy of the
    template, with generation markers, masks it; user turns never carry a loss."""
    tokenizer = family_tokenizer(FAMILIES["qwen3"])
    task = chat_task(tmp_path, tokenizer)
    tokenised = task.tokenised(as_dataset([{"messages": CHAT}]), "train", True)
    runs = "".join(learnt_runs(tokenizer, tokenised[0]["input_ids"], tokenised[0]["labels"]))
    assert "Paris." in runs and "Tokyo, of course." in runs
    assert "France" not in runs and "Japan" not in runs and "user" not in runs


def test_a_template_that_cannot_be_split_and_trl_does_not_know_is_one_line(tmp_path):
    tokenizer = family_tokenizer(FAMILIES["qwen3"])
    tokenizer.chat_template = tokenizer.chat_template.replace("<think>\\n\\n", "<think>\\n \\n")
    task = chat_task(tmp_path, tokenizer)
    with pytest.raises(UserError, match="--assistant_only_loss false"):
        task.tokenised(as_dataset([{"messages": CHAT}]), "train", True)


def test_prompt_completion_pairs_learn_the_completion_only_plain_and_conversational():
    tokenizer = family_tokenizer(FAMILIES["llama"])
    options = ChatArguments()
    plain = encode_row(tokenizer, {"prompt": "Two plus two is", "completion": " four."},
                       "prompt-completion", options)  # fmt: skip
    assert learnt_runs(tokenizer, plain.input_ids, plain.labels) == [" four.<|eot_id|>"]
    turns = encode_row(
        tokenizer,
        {"prompt": CHAT[:1], "completion": CHAT[1:2]},
        "prompt-completion",
        options,
    )
    assert learnt_runs(tokenizer, turns.input_ids, turns.labels) == ["Paris.<|eot_id|>"]


def test_the_flags_that_train_on_the_whole_text():
    tokenizer = family_tokenizer(FAMILIES["qwen2"])
    whole = ChatArguments(assistant_only_loss=False, completion_only_loss=False)
    chat = encode_row(tokenizer, {"messages": CHAT}, "conversational", whole)
    assert IGNORED not in chat.labels and chat.labels == chat.input_ids
    pair = encode_row(tokenizer, {"prompt": "Hello", "completion": " there"},
                      "prompt-completion", whole)  # fmt: skip
    assert IGNORED not in pair.labels
    text = encode_row(tokenizer, {"text": "Hello there."}, "text", ChatArguments())
    assert tokenizer.decode(text.input_ids) == "Hello there.<|im_end|>"  # ends with eos
    assert IGNORED not in text.labels


BAD_ROWS = [
    {"messages": [{"content": "no role"}, {"role": "assistant", "content": "x"}]},
    {"messages": [{"role": "user", "content": "  "}, {"role": "assistant", "content": "x"}]},
    {"messages": [{"role": "user", "content": "Hello"}]},  # nothing to learn
    {"messages": [{"role": "robot", "content": "Hello"}, {"role": "assistant", "content": "x"}]},
    {"messages": []},
]


def test_bad_rows_are_skipped_and_counted_in_one_line_under_max_bad_examples(tmp_path, capsys):
    tokenizer = family_tokenizer(FAMILIES["llama"])
    rows = [{"messages": CHAT}] * 20 + BAD_ROWS
    task = chat_task(tmp_path, tokenizer, bad="5")
    tokenised = task.tokenised(as_dataset(rows), "train", True)
    assert len(tokenised) == 20
    lines = [line for line in capsys.readouterr().out.splitlines() if "skipped" in line]
    assert len(lines) == 1
    assert "skipped 5 of 25 rows" in lines[0] and "row 20 (turn 0 has no role)" in lines[0]
    assert "row 21 (turn 0 is empty)" in lines[0]
    with pytest.raises(UserError, match="5 of 25 rows .* more than --max_bad_examples 4"):
        chat_task(tmp_path, tokenizer, bad="4").tokenised(as_dataset(rows), "train", True)


def test_a_template_that_refuses_a_row_makes_it_a_bad_row(tmp_path, capsys):
    """Gemma's template raises on a system turn: that row is skipped and counted."""
    tokenizer = family_tokenizer(FAMILIES["gemma2"])
    rows = [{"messages": CHAT}] * 9 + [{"messages": [SYSTEM, *CHAT]}]
    tokenised = chat_task(tmp_path, tokenizer, bad="1").tokenised(as_dataset(rows), "x", True)
    assert len(tokenised) == 9
    assert "System role not supported" in capsys.readouterr().out


def test_long_rows_are_cut_and_counted_or_refused_by_the_flag(tmp_path, capsys):
    tokenizer = family_tokenizer(FAMILIES["llama"])
    long_chat = [CHAT[0], {"role": "assistant", "content": "Paris. " * 80}]
    rows = [{"messages": CHAT}] * 3 + [{"messages": long_chat}]
    task = chat_task(tmp_path, tokenizer, max_seq_length=120)
    tokenised = task.tokenised(as_dataset(rows), "train", True)
    assert [len(ids) for ids in tokenised["input_ids"]][3] == 120
    out = capsys.readouterr().out
    assert "cut 1 of 4 rows of split train" in out and "--max_seq_length 120" in out
    refusing = chat_task(tmp_path, tokenizer, max_seq_length=120, refuse_long_examples=True)
    with pytest.raises(UserError, match="1 of 4 rows .* longer than --max_seq_length 120"):
        refusing.tokenised(as_dataset(rows), "train", True)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_examples_do_not_attend_across_each_other(attention):
    """TRL's packing (best-fit decreasing) and collator, as training uses them: the logits of
    each example inside a packed, padding-free sequence equal its logits run alone."""
    import torch
    from datasets import Dataset
    from trl.data_utils import pack_dataset
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    family = FAMILIES["llama"]
    tokenizer = family_tokenizer(family)
    model = family_model(family, tokenizer).eval()
    model.config._attn_implementation = attention
    rows = [{"messages": CHAT}, {"messages": CHAT[:2]}, {"messages": CHAT[2:]}]
    encoded = [encode_row(tokenizer, row, "conversational", ChatArguments()) for row in rows]
    dataset = Dataset.from_list([{"input_ids": e.input_ids, "labels": e.labels} for e in encoded])
    packed = pack_dataset(dataset, seq_length=512, strategy="bfd")
    assert len(packed) == 1  # all three in one sequence
    batch = DataCollatorForLanguageModeling(tokenizer.pad_token_id, padding_free=True)([packed[0]])
    assert "attention_mask" not in batch
    with torch.no_grad():
        # as SFTTrainer.compute_loss calls it: no cache (with one, transformers does not look
        # for packed sequences in the position ids)
        together = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                         use_cache=False).logits  # fmt: skip
        start = 0
        for length in packed[0]["seq_lengths"]:
            ids = batch["input_ids"][:, start : start + length]
            alone = model(input_ids=ids).logits
            torch.testing.assert_close(together[:, start : start + length], alone,
                                       atol=1e-5, rtol=1e-4)  # fmt: skip
            start += length
        assert start == batch["input_ids"].shape[1]


def test_a_model_without_a_chat_template_is_one_line_naming_the_flag(tmp_path):
    folder = save_family_model(FAMILIES["llama"], tmp_path / "base")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    task = chat_task(folder)
    with pytest.raises(UserError, match="has no chat template .* --chat_template"):
        task.check_model()
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    chat_task(folder, chat_template=str(template)).check_model()  # given: fine


def test_a_folder_of_chats_is_text_generations_data(tmp_path):
    from trainer.config.task_inference import infer_task

    rows = "\n".join(json.dumps({"messages": CHAT}) for _ in range(3))
    (tmp_path / "train.jsonl").write_text(rows)
    assert infer_task(None, str(tmp_path), None, {})[0] == "text-generation"
    labelled = tmp_path / "labelled"
    labelled.mkdir()
    (labelled / "train.csv").write_text("text,label\ngood,1\nbad,0\n")
    assert infer_task(None, str(labelled), None, {})[0] == "text-classification"
