"""Text generation's training throughput against plain TRL, and what packing saves.

Side by side in one process, on the same tiny Qwen2 (the demo's shape: real `Qwen2Config`,
width 128, 2 layers; a byte-level BPE tokenizer trained here with Qwen 2.5's special tokens and
released chat template), the same chats and the same settings (batch 8, fp32, AdamW, no
evaluation, loss on the assistant's turns):

- `plain TRL`: `trl.SFTTrainer` given the raw chats and `assistant_only_loss=True` (TRL swaps
  in its marked copy of the Qwen 2.5 template and masks by it);
- `this project`: the task's own tokenisation (trainer/tasks/text_generation/: rows checked,
  the loss mask found by rendering) and its `ChatTrainer` (an `SFTTrainer` subclass) with the
  keep-work mixin the training program adds (trainer/training/keep_work.py).

Each trains `--steps` optimizer steps after `--warmup` steps; the figure is trained tokens
(non-padding) per second of those steps. With `--packing`, both pack to `--max_length` (TRL's
best-fit decreasing, padding-free). The chats' lengths follow a log-normal distribution
(median about 120 tokens, a long tail), as chat sets do.

Packing efficiency: the share of the positions of a step's batches that hold tokens of an
example (not padding), over one epoch of batches of `--batch` rows, with and without packing.

python bench/chat_sft.py [--steps 30] [--batch 8] [--max_length 512]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import tempfile
import time
from pathlib import Path

COUNTRIES = [f"Land{i}" for i in range(50)]
WORDS = ("the", "a", "of", "capital", "city", "river", "mountain", "people", "language", "old",
         "new", "north", "south", "east", "west")  # fmt: skip


def chats(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        words = max(4, int(math.exp(rng.gauss(math.log(60), 0.7))))
        answer = " ".join(rng.choice(WORDS) for _ in range(words))
        country = rng.choice(COUNTRIES)
        rows.append({"messages": [
            {"role": "user", "content": f"Tell me about {country}."},
            {"role": "assistant", "content": answer},
        ]})  # fmt: skip
    return rows


class Timed:
    """A callback timing the steps after the warm-up ones, and the tokens they trained."""

    def __init__(self, warmup: int) -> None:
        from transformers import TrainerCallback

        timed = self

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                if state.global_step == warmup:
                    timed.start = time.perf_counter()

            def on_train_end(self, args, state, control, **kwargs):
                timed.end = time.perf_counter()

        self.callback = Callback()
        self.start = self.end = 0.0


def tokens_per_second(trainer, warmup: int, steps: int, timed: Timed) -> float:
    trainer.add_callback(timed.callback)
    loader = trainer.get_train_dataloader()
    batches = iter(loader)
    trained = 0
    for step in range(warmup + steps):
        batch = next(batches, None)
        if batch is None:  # the next epoch
            batches = iter(loader)
            batch = next(batches)
        if step >= warmup:
            trained += int((batch["input_ids"] != trainer.processing_class.pad_token_id).sum())
    trainer.train()
    return trained / (timed.end - timed.start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max_length", type=int, default=512)
    parser.add_argument("--packing", action="store_true")
    options = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer
    from trl.data_utils import pack_dataset

    from trainer.settings.data_flags import DataArguments
    from trainer.settings.model_flags import ModelArguments
    from trainer.tasks.causal_lm import save_tiny_qwen2
    from trainer.tasks.text_generation.spec import ChatArguments
    from trainer.tasks.text_generation.trainer import ChatTrainer
    from trainer.tasks.text_generation.training import ChatTask
    from trainer.training.keep_work import work_keeping_trainer

    torch.set_num_threads(1)
    rows = chats(options.batch * (options.warmup + options.steps) * 2)
    work = Path(tempfile.mkdtemp())
    save_tiny_qwen2(work / "model", [json.dumps(row) for row in rows[:200]])
    tokenizer = AutoTokenizer.from_pretrained(work / "model")
    chat = ChatArguments(max_seq_length=options.max_length, packing=options.packing)
    settings = dict(output_dir=str(work / "out"), per_device_train_batch_size=options.batch,
                    max_steps=options.warmup + options.steps, report_to=[], save_strategy="no",
                    logging_steps=1000, learning_rate=1e-3, use_cpu=True, bf16=False,
                    gradient_checkpointing=False, disable_tqdm=True, seed=0,
                    dataloader_drop_last=True)  # fmt: skip

    def model():
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_pretrained(work / "model", dtype=torch.float32)

    trl_config = SFTConfig(**settings, max_length=options.max_length, packing=options.packing,
                           assistant_only_loss=True)  # fmt: skip
    plain = SFTTrainer(model=model(), processing_class=tokenizer,
                       train_dataset=Dataset.from_list(rows), args=trl_config)  # fmt: skip
    task = ChatTask(ModelArguments(model_name_or_path=str(work / "model")),
                    DataArguments(dataset_name=str(work)), chat, {})  # fmt: skip
    task._tokenizer = tokenizer
    ours_data = task.tokenised(Dataset.from_list(rows), "train", True)
    from transformers import TrainingArguments

    ours = work_keeping_trainer(task.trainer_class)(
        model=model(), args=TrainingArguments(**settings), train_dataset=ours_data,
        processing_class=tokenizer, data_collator=None, compute_metrics=None,
    )  # fmt: skip
    assert isinstance(ours, ChatTrainer)
    results = {}
    for name, trainer in (("plain TRL SFTTrainer", plain), ("this project", ours)):
        results[name] = tokens_per_second(trainer, options.warmup, options.steps,
                                          Timed(options.warmup))  # fmt: skip
    print(f"| trainer | tokens/s (batch {options.batch}, packing {options.packing}) |")
    print("|---|---|")
    for name, rate in results.items():
        print(f"| {name} | {rate:.0f} |")
    base = results["plain TRL SFTTrainer"]
    print(f"ratio: {results['this project'] / base:.2f}x")

    lengths = [len(ids) for ids in ours_data["input_ids"]]
    unpacked = [lengths[i : i + options.batch] for i in range(0, len(lengths), options.batch)]
    useful = sum(lengths)
    padded = sum(max(group) * len(group) for group in unpacked)
    packed = pack_dataset(ours_data.select_columns(["input_ids", "labels"]),
                          options.max_length, "bfd")  # fmt: skip
    rows_packed = [len(ids) for ids in packed["input_ids"]]
    print(f"\n| batches of {options.batch} rows | useful tokens / positions |")
    print("|---|---|")
    print(f"| without packing (padded to each batch's longest) | {useful / padded:.1%} |")
    print(f"| with packing to {options.max_length} (padding-free rows) | "
          f"{useful / (len(rows_packed) * options.max_length):.1%} |")  # fmt: skip
    print(f"(lengths: median {sorted(lengths)[len(lengths) // 2]}, max {max(lengths)}, "
          f"{len(lengths)} examples into {len(rows_packed)} packed rows)")  # fmt: skip


if __name__ == "__main__":
    main()
