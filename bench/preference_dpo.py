"""Preference tuning's training throughput against plain TRL `DPOTrainer`, with LoRA and in full.

Side by side in one process, on the text-generation demo's tiny Qwen2 (the real `Qwen2Config`,
width 128, 2 layers; a byte-level BPE tokenizer trained here with Qwen 2.5's special tokens and
released chat template), the same pairs and the same settings (batch 8 pairs, fp32, AdamW,
sigmoid DPO with beta 0.1, no evaluation):

- `plain TRL`: `trl.DPOTrainer` given the raw conversational pairs (prompt, chosen, rejected);
  with LoRA it gets the same `LoraConfig` as `peft_config` (its reference: the base, adapter
  disabled); in full it loads its frozen reference copy from the model's folder;
- `this project`: the task's path (trainer/tasks/preference_tuning/: rows checked, bad ones
  counted, then TRL's tokenisation) and its `PreferenceTrainer` (a `DPOTrainer` subclass,
  the run's arguments as its `DPOConfig`) with the keep-work mixin the training program adds
  (trainer/training/keep_work.py); with LoRA the model arrives with its adapter as the
  training program builds it (`with_lora`), and the reference is the base, adapter disabled.

Each trains `--steps` optimizer steps after `--warmup` steps; the figures are pairs per second
of those steps (`--batch` pairs a step), by the wall clock and by the process's CPU time (on a
shared machine the second is the steadier), in `--repeats` rounds with fresh trainers, plain
TRL first in every other one; both reach the same mean loss (the same batches, the same
updates). The answers' lengths follow a log-normal
distribution (median about 60 words, a long tail), as preference sets do; pairs are cut to
`--max_length` tokens.

python bench/preference_dpo.py [--steps 20] [--warmup 3] [--batch 8] [--max_length 512]
                               [--repeats 4] [--training lora full]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import tempfile
import time
from itertools import product
from pathlib import Path
from statistics import median

COUNTRIES = [f"Land{i}" for i in range(50)]
PLAIN, OURS = "plain TRL DPOTrainer", "this project"
TRAININGS = {"lora": "LoRA", "full": "full"}
WORDS = ("the", "a", "of", "capital", "city", "river", "mountain", "people", "language", "old",
         "new", "north", "south", "east", "west")  # fmt: skip


def pairs(count: int, seed: int = 0) -> list[dict]:
    """Conversational pairs with an explicit prompt; the chosen answer is polite."""
    rng = random.Random(seed)

    def answer() -> str:
        words = max(4, int(math.exp(rng.gauss(math.log(60), 0.7))))
        return " ".join(rng.choice(WORDS) for _ in range(words))

    rows = []
    for _ in range(count):
        country = rng.choice(COUNTRIES)
        rows.append({
            "prompt": [{"role": "user", "content": f"Tell me about {country}."}],
            "chosen": [{"role": "assistant", "content": f"Gladly. {answer()}"}],
            "rejected": [{"role": "assistant", "content": answer()}],
        })  # fmt: skip
    return rows


class Timed:
    """A callback timing the steps after the warm-up ones: wall-clock, and this process's CPU
    time (one thread: the work done, whatever else the shared machine runs)."""

    def __init__(self, warmup: int) -> None:
        from transformers import TrainerCallback

        timed = self

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                if state.global_step == warmup:
                    timed.start = time.perf_counter(), time.process_time()

            def on_train_end(self, args, state, control, **kwargs):
                timed.end = time.perf_counter(), time.process_time()

        self.callback = Callback()
        self.start = self.end = (0.0, 0.0)


def pairs_per_second(trainer, warmup: int, steps: int, batch: int) -> dict:
    """Pairs per second and per CPU second over the steps after the warm-up, and the mean
    training loss."""
    timed = Timed(warmup)
    trainer.add_callback(timed.callback)
    trainer.train()
    loss = next(row["loss"] for row in reversed(trainer.state.log_history) if "loss" in row)
    wall, cpu = (end - start for start, end in zip(timed.start, timed.end, strict=True))
    return {"pairs_per_second": steps * batch / wall, "pairs_per_cpu_second": steps * batch / cpu,
            "loss": loss}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max_length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--training", nargs="+", default=["lora", "full"],
                        choices=["lora", "full"])  # fmt: skip
    options = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments
    from trl import DPOConfig, DPOTrainer

    from trainer.settings.data_flags import DataArguments
    from trainer.settings.model_flags import ModelArguments
    from trainer.tasks.lora_adapters import with_lora
    from trainer.tasks.preference_tuning.spec import SPEC, PreferenceArguments
    from trainer.tasks.preference_tuning.trainer import PreferenceTrainer
    from trainer.tasks.preference_tuning.training import PreferenceTask
    from trainer.tasks.text_generation.demo import save_tiny_qwen2
    from trainer.training.keep_work import work_keeping_trainer

    torch.set_num_threads(1)
    steps = options.warmup + options.steps
    rows = pairs(options.batch * steps)
    work = Path(tempfile.mkdtemp())
    corpus = [json.dumps(row) for row in rows[:200]]
    save_tiny_qwen2(work / "model", corpus)
    (work / "pairs").mkdir()
    (work / "pairs" / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(work / "model")
    preference = PreferenceArguments(max_seq_length=options.max_length)
    settings = dict(output_dir=str(work / "out"), per_device_train_batch_size=options.batch,
                    max_steps=steps, report_to=[], save_strategy="no", logging_steps=steps,
                    learning_rate=1e-4, use_cpu=True, bf16=False, gradient_checkpointing=False,
                    disable_tqdm=True, seed=0, dataloader_drop_last=True)  # fmt: skip

    def model():
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_pretrained(work / "model", dtype=torch.float32)

    def trainer(training: str, name: str):
        """A fresh trainer: plain TRL's, or this project's path."""
        model_args = ModelArguments(model_name_or_path=str(work / "model"), peft=training
                                    if training == "lora" else "none")  # fmt: skip
        policy = model()
        if training == "lora":
            policy = with_lora(policy, model_args, SPEC.lora_targets)
        if name == PLAIN:
            config = DPOConfig(**settings, max_length=options.max_length, beta=preference.beta,
                               loss_type=["sigmoid"], truncation_mode="keep_start",
                               pad_to_multiple_of=None)  # fmt: skip
            lora = policy.peft_config["default"] if training == "lora" else None
            return DPOTrainer(model=model(), args=config, processing_class=tokenizer,
                              train_dataset=Dataset.from_list(rows), peft_config=lora)  # fmt: skip
        data = DataArguments(dataset_name=str(work / "pairs"), eval_split_name=None)
        task = PreferenceTask(model_args, data, preference, {})
        train, _ = task.load_datasets(tokenizer)
        ours = work_keeping_trainer(task.trainer_class)(
            model=policy, args=TrainingArguments(**settings), train_dataset=train,
            processing_class=tokenizer, data_collator=None, compute_metrics=None,
        )  # fmt: skip
        assert isinstance(ours, PreferenceTrainer)
        return ours

    results = {}
    for repeat in range(options.repeats):
        for training in options.training:
            # plain TRL first in even repeats, this project first in odd ones
            for name in (PLAIN, OURS)[:: 1 if repeat % 2 == 0 else -1]:
                result = pairs_per_second(trainer(training, name), options.warmup,
                                          options.steps, options.batch)  # fmt: skip
                results[repeat, training, name] = result
                print(json.dumps({"repeat": repeat, "training": training, "trainer": name,
                                  **result}), flush=True)  # fmt: skip
    print(table(results, options.repeats, options.training))


def table(results: dict, repeats: int, trainings: list[str]) -> str:
    lines = ["| run | training | plain TRL (pairs/s) | ours (pairs/s) | ratio | plain TRL "
             "(pairs/CPU-s) | ours (pairs/CPU-s) | ratio | mean loss (plain / ours) |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    ratios = {}
    for repeat, training in product(range(repeats), trainings):
        base, ours = (results[repeat, training, name] for name in (PLAIN, OURS))
        wall, cpu = (ours[key] / base[key] for key in ("pairs_per_second",
                                                       "pairs_per_cpu_second"))  # fmt: skip
        ratios.setdefault(training, []).append((wall, cpu))
        first = "plain first" if repeat % 2 == 0 else "ours first"
        lines.append(f"| {repeat + 1} ({first}) | {TRAININGS[training]} | "
                     f"{base['pairs_per_second']:.1f} | {ours['pairs_per_second']:.1f} | "
                     f"{wall:.2f}x | {base['pairs_per_cpu_second']:.1f} | "
                     f"{ours['pairs_per_cpu_second']:.1f} | {cpu:.2f}x | "
                     f"{base['loss']:.4f} / {ours['loss']:.4f} |")  # fmt: skip
    for training, pairs_of in ratios.items():
        walls, cpus = zip(*pairs_of, strict=True)
        lines.append(f"\n{TRAININGS[training]}: median ratio {median(walls):.2f}x (wall-clock), "
                     f"{median(cpus):.2f}x (CPU time)")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
