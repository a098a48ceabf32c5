"""Text generation with `--streaming true`, in this process: a training split read as a stream
(a JSONL file, and the project's shard set of it) gives the examples a split read whole gives
(input ids and labels, packed as TRL packs), its bad rows marked for the stream's skip count and
its cut rows counted as read; and TRL's SFTTrainer (the task's ChatTrainer) trains on the
resumable stream, ending with one line for the cut rows, or refusing them by the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.chat_models import FAMILIES, family_model, family_tokenizer
from tests.support.shard_sets import make_shards
from trainer.common.errors import UserError
from trainer.data.bad_examples import UNDECODABLE
from trainer.settings.data_flags import DataArguments
from trainer.settings.model_flags import ModelArguments
from trainer.tasks.text_generation.spec import ChatArguments
from trainer.tasks.text_generation.stream import CUTS


def chat(i: int, answer: str | None = None) -> dict:
    return {"messages": [
        {"role": "user", "content": f"What is {i} plus {i}?"},
        {"role": "assistant", "content": answer or f"It is {2 * i}."},
    ]}  # fmt: skip


ROWS = [
    *(chat(i) for i in range(12)),
    {"messages": [{"content": "no role"}, {"role": "assistant", "content": "x"}]},
    chat(12, "Four. " * 80),  # longer than --max_seq_length 128
    {"messages": [{"role": "user", "content": "Hello"}]},  # no assistant turn
    *(chat(i) for i in range(13, 20)),
]
"""20 chats (one cut) and two bad rows."""


@pytest.fixture(scope="module")
def chats(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("chats")
    (folder / "train.jsonl").write_text("\n".join(json.dumps(row) for row in ROWS))
    return folder


def chat_task(data: str, streaming: bool, **options):
    from trainer.tasks.text_generation.training import ChatTask

    return ChatTask(
        ModelArguments(model_name_or_path=data),
        DataArguments(
            dataset_name=data, eval_split_name="", streaming=streaming, max_bad_examples="5"
        ),  # fmt: skip
        ChatArguments(**{"max_seq_length": 128, **options}),
        {},
    )


def streamed_and_whole(data: str, **options) -> tuple[list[dict], list[dict]]:
    tokenizer = family_tokenizer(FAMILIES["llama"])
    stream, _ = chat_task(data, True, **options).load_datasets(tokenizer)
    whole, _ = chat_task(data, False, **options).load_datasets(tokenizer)
    return list(stream), [dict(row) for row in whole]


def test_a_streamed_split_gives_the_examples_of_the_split_read_whole(chats, capsys):
    streamed, whole = streamed_and_whole(str(chats))
    assert "cut 1 of 20 rows" in capsys.readouterr().out  # read whole: one line before training
    good = [row for row in streamed if row[UNDECODABLE] is None]
    assert [(row["input_ids"], row["labels"]) for row in good] == [
        (row["input_ids"], row["labels"]) for row in whole
    ]
    assert len(good) == 20 and max(len(row["input_ids"]) for row in good) == 128
    bad = [row[UNDECODABLE] for row in streamed if row[UNDECODABLE] is not None]
    assert bad == ["a row (turn 0 has no role)", "a row (a chat without an assistant turn)"]
    cut, read, empty = (
        sum(column) for column in zip(*(row[CUTS] for row in streamed), strict=True)
    )
    assert (cut, read, empty) == (1, 20, 0)


def test_a_streamed_split_is_packed_as_trl_packs_the_split_read_whole(chats):
    from datasets import Dataset
    from trl.data_utils import pack_dataset

    streamed, whole = streamed_and_whole(str(chats), packing=True, max_seq_length=256)
    packed = pack_dataset(Dataset.from_list(whole), 256, "bfd").to_list()
    good = [row for row in streamed if row[UNDECODABLE] is None]
    assert [(r["input_ids"], r["labels"], r["seq_lengths"]) for r in good] == [
        (r["input_ids"], r["labels"], r["seq_lengths"]) for r in packed
    ]
    assert len(good) < 20  # several chats in a sequence


def test_a_shard_set_of_chats_streams_the_same_examples(chats, tmp_path):
    shards = tmp_path / "shards"
    make_shards(chats, shards, "--task", "text-generation", "--shard_size_mb", "0.001")
    streamed, _ = streamed_and_whole(str(shards))
    _, whole = streamed_and_whole(str(chats))
    good = [row for row in streamed if row[UNDECODABLE] is None]
    assert [row["input_ids"] for row in good] == [row["input_ids"] for row in whole]
    bad = [row[UNDECODABLE] for row in streamed if row[UNDECODABLE] is not None]
    assert bad == [
        "row train/12 (turn 0 has no role)",
        "row train/14 (a chat without an assistant turn)",
    ]  # by their shard keys


def trained_on_the_stream(chats: Path, tmp_path: Path, **options):
    """Two steps of the task's ChatTrainer on its resumable stream, as the training program
    builds them (trainer/training/stream_training.py)."""
    from transformers import TrainingArguments

    from trainer.data.bad_examples import StreamSkips
    from trainer.data.streams import StreamStart, prepare_stream
    from trainer.training.stream_training import streaming_trainer

    family = FAMILIES["llama"]
    tokenizer = family_tokenizer(family)
    task = chat_task(str(chats), True, **options)
    stream, _ = task.load_datasets(tokenizer)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=5, per_device_train_batch_size=4,
                             report_to=[], use_cpu=True, save_strategy="no")  # fmt: skip
    skips = StreamSkips("5", "split train")
    trainer_class = streaming_trainer(task.trainer_class, StreamStart(), None, skips)
    trainer = trainer_class(model=family_model(family, tokenizer), args=args,
                            train_dataset=prepare_stream(stream, 0, 100, None),
                            processing_class=tokenizer)  # fmt: skip
    trainer.train()
    return trainer, skips


def test_trls_trainer_trains_on_the_stream_and_counts_its_cut_rows(chats, tmp_path, capsys):
    trainer, skips = trained_on_the_stream(chats, tmp_path)
    assert trainer.state.global_step == 5
    assert trainer.cuts == [1, 20, 0]  # the 20 chats, in 5 steps of 4
    assert sorted(skips._new_names) == [  # for the stream's --max_bad_examples
        "a row (a chat without an assistant turn)",
        "a row (turn 0 has no role)",
    ]
    lines = [line for line in capsys.readouterr().out.splitlines() if "cut" in line]
    assert lines == [f"warning: cut 1 of {trainer.cuts[1]} rows read from the training stream "
                     f"(split train of {chats}) to --max_seq_length 128 tokens"]  # fmt: skip
    with pytest.raises(UserError, match="longer than --max_seq_length 128 tokens"):
        trained_on_the_stream(chats, tmp_path, refuse_long_examples=True)
