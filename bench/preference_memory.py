"""Preference tuning's launch-plan memory estimate, the reference model counted, against the peak
a real DPO step takes on this CPU: each configuration in a fresh process, side by side in one
run.

The models are bench/chat_memory.py's: tiny but not trivial causal LMs built offline from the
real `LlamaForCausalLM` and `Qwen2ForCausalLM` classes (width 384, 4 layers, MLP 1,024, 6
query and 2 key/value heads, a 16,384-token vocabulary, untied LM head; random weights, saved
to a folder, from which TRL loads the full fine-tune's reference). Each trains fp32 on the
CPU through the task's own trainer (`PreferenceTrainer`, TRL's `DPOTrainer`, with the
keep-work mixin), AdamW, `--batch` pairs a step whose prompt and answers are cut to
`--max_length` tokens (the length the plan assumes: both sequences of every pair that long),
with and without gradient checkpointing (non-reentrant), in three ways of paying for the
reference:

- `full`: a frozen second model, loaded by TRL;
- `LoRA` (the task's default targets, rank 16): the base with the adapter disabled;
- `full, precomputed` (`--precompute_ref_log_probs`): the reference's log-probabilities
  computed once before training by the policy itself, no second model.

- peak: the process's peak RSS (ru_maxrss) minus its RSS before the model was loaded, after
  one warm-up step and `--steps` more: weights (the reference's too), gradients, optimizer
  state, activations, and every transient buffer (TRL's chunked log-probabilities, attention
  temporaries, the allocator's slack). The measure of bench/chat_memory.py.
- estimate: `TrainingFootprint.step_bytes` (trainer/tasks/step_memory.py) with the task's own
  activation count (`PreferenceTask.activation_values_per_sample`: a pair is two sequences)
  and its `reference_parameters`, as `python -m trainer --dry-run` reports it.

Two things a CPU adds that a GPU step does not hold, each of which the script can take out:

- TRL's fused LM head (trl/kernels/chunked_logprob.py) projects tiles of up to 4,096 tokens
  by 32,768 vocabulary entries; on a GPU a Triton kernel folds each tile in place, but its
  torch fallback on a CPU makes several fp32 copies of the tile at once (a pair of 1,024
  tokens by 16,384 entries: 128 MiB each). `--token_tile 64` cuts its tiles to 64 tokens,
  near what the GPU kernel holds beside its one buffer.
- glibc's allocator raises its mmap threshold as large blocks are freed, after which freed
  memory stays in its heap and counts in the RSS peak: `MALLOC_MMAP_THRESHOLD_=65536` in the
  environment fixes the threshold, so the peak tracks live memory.

    python bench/preference_memory.py [--family llama qwen2] [--max_length 256 1024]
                                      [--training full lora precomputed]
                                      [--checkpointing no yes] [--token_tile 0]
                                      [--batch 1] [--steps 1]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
from itertools import product
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.chat_memory import CLASSES, SHAPE  # noqa: E402

WAYS = {"full": ("none", False), "lora": ("lora", False), "precomputed": ("none", True)}
"""How the reference is paid for: (--peft, --precompute_ref_log_probs)."""
MINUSCULE = "-minuscule"
MINUSCULE_SHAPE = {"hidden_size": 16, "num_hidden_layers": 1, "intermediate_size": 32,
                   "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip
"""The warm-up model's shape: the family's, with the vocabulary, nearly nothing else."""
NAMES = {"full": "full", "lora": "LoRA", "precomputed": "full, precomputed"}
WORDS = ("the", "a", "of", "capital", "city", "river", "mountain", "people", "language", "old",
         "new", "north", "south", "east", "west")  # fmt: skip


def save_model(family: str, folder: Path, shape: dict) -> None:
    """The family's model of `shape` with random weights, and the demo's tokenizer (its 512
    tokens are ids of the model's larger vocabulary)."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    from trainer.tasks.text_generation.demo import save_tiny_qwen2

    save_tiny_qwen2(folder / "tokenizer", [" ".join(WORDS)] * 20)
    tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")
    torch.manual_seed(0)
    config_class, model_class = (getattr(transformers, name) for name in CLASSES[family])
    config = config_class(**shape, pad_token_id=tokenizer.pad_token_id,
                          eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    model_class(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def save_pairs(folder: Path, count: int, length: int) -> None:
    """Text pairs whose prompt plus either answer is longer than `length` tokens."""
    rng = random.Random(0)
    words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    rows = [{"prompt": words(16), "chosen": words(length), "rejected": words(length)}
            for _ in range(count)]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")


def trained(
    model_dir: str,
    way: str,
    checkpointing: bool,
    length: int,
    batch: int,
    steps: int,
    before: int | None = None,
) -> dict | None:
    """Train the model in `model_dir` for a warm-up step and `steps` more through the task's
    trainer; with `before` (the RSS before its model was loaded) its peak and the plan's
    estimate."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

    from trainer.settings.data_flags import DataArguments
    from trainer.settings.model_flags import ModelArguments
    from trainer.tasks.lora_adapters import parameter_counts, with_lora
    from trainer.tasks.preference_tuning.spec import SPEC, PreferenceArguments
    from trainer.tasks.preference_tuning.training import PreferenceTask
    from trainer.tasks.step_memory import TrainingFootprint
    from trainer.training.keep_work import work_keeping_trainer

    peft, precompute = WAYS[way]
    work = Path(tempfile.mkdtemp())
    save_pairs(work / "pairs", batch * (steps + 1), length)
    model_args = ModelArguments(model_name_or_path=model_dir, peft=peft, lora_dropout=0.0)
    preference = PreferenceArguments(max_seq_length=length, precompute_ref_log_probs=precompute)
    data = DataArguments(dataset_name=str(work / "pairs"), eval_split_name=None)
    task = PreferenceTask(model_args, data, preference, {})
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train, _ = task.load_datasets(tokenizer)
    args = TrainingArguments(
        output_dir=str(work / "out"), per_device_train_batch_size=batch, max_steps=steps + 1,
        report_to=[], save_strategy="no", logging_steps=1000, learning_rate=1e-4, use_cpu=True,
        bf16=False, gradient_checkpointing=checkpointing, disable_tqdm=True, seed=0,
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )  # fmt: skip
    start = psutil.Process().memory_info().rss if before is None else before
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if peft == "lora":
        model = with_lora(model, model_args, SPEC.lora_targets)
    trainer = work_keeping_trainer(task.trainer_class)(
        model=model, args=args, train_dataset=train, processing_class=tokenizer,
        data_collator=None, compute_metrics=None,
    )  # fmt: skip
    trainer.train()
    if before is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - start
    full, recomputed = task.activation_values_per_sample(model)
    trainable, total = parameter_counts(model)
    footprint = TrainingFootprint(
        parameters=total, trainable_parameters=trainable, activation_values=full,
        checkpointed_activation_values=recomputed, batch_size=batch, mixed_precision=False,
        zero_stage=None, optimizer_offloaded=False, world_size=1,
        reference_parameters=task.reference_parameters(model),
    )  # fmt: skip
    return {"family": model.config.model_type, "way": way, "checkpointing": checkpointing,
            "max_length": length, "batch": batch, "trainable_parameters": trainable,
            "total_parameters": total, "reference_parameters": footprint.reference_parameters,
            "peak_bytes": peak, "estimated_bytes": footprint.step_bytes(checkpointing),
            "parts": footprint.describe(checkpointing)}  # fmt: skip


def measure(
    model_dir: str,
    way: str,
    checkpointing: bool,
    length: int,
    batch: int,
    steps: int,
    token_tile: int | None = None,
):
    """One configuration, in this process: first the same run on a minuscule model of the
    family (so that what the Trainer imports and sets up once, host memory no GPU holds, is
    in place before the measure starts), then the measured one. `token_tile`: the tokens of
    TRL's fused LM head's tile (see the module)."""
    import torch
    import trl.kernels.chunked_logprob as chunked

    torch.set_num_threads(1)
    if token_tile:
        chunked.TOKEN_CHUNK_SIZE = token_tile
    trained(f"{model_dir}{MINUSCULE}", way, checkpointing, 64, batch, 1)
    gc.collect()
    before = psutil.Process().memory_info().rss
    return trained(model_dir, way, checkpointing, length, batch, steps, before)


def in_fresh_process(model_dir, way, checkpointing, length, batch, steps, token_tile) -> dict:
    argv = [sys.executable, __file__, "--one", model_dir, way, "--max_length", str(length),
            "--batch", str(batch), "--steps", str(steps), "--checkpointing",
            "yes" if checkpointing else "no", "--token_tile", str(token_tile or 0)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    mib = 2**20
    lines = ["| model | training | checkpointing | max_length | trainable / total (+ reference) "
             "parameters | peak (MiB) | estimate (MiB) | estimate / peak |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        reference = f" + {row['reference_parameters']:,}" if row["reference_parameters"] else ""
        lines.append(
            f"| {row['family']} | {NAMES[row['way']]} | "
            f"{'yes' if row['checkpointing'] else 'no'} | {row['max_length']} | "
            f"{row['trainable_parameters']:,} / {row['total_parameters']:,}{reference} | "
            f"{row['peak_bytes'] / mib:,.0f} | {row['estimated_bytes'] / mib:,.0f} | "
            f"{row['estimated_bytes'] / row['peak_bytes']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", nargs="+", default=list(CLASSES), choices=list(CLASSES))
    parser.add_argument("--max_length", nargs="+", type=int, default=[256, 1024])
    parser.add_argument("--training", nargs="+", default=list(WAYS), choices=list(WAYS))
    parser.add_argument("--checkpointing", nargs="+", default=["no", "yes"], choices=["no", "yes"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--token_tile", type=int, default=0,
                        help="tokens of TRL's fused LM head's tile (0: TRL's 4,096)")  # fmt: skip
    parser.add_argument("--one", nargs=2, metavar=("MODEL_DIR", "WAY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        model_dir, way = args.one
        print(json.dumps(measure(model_dir, way, args.checkpointing == ["yes"],
                                 args.max_length[0], args.batch, args.steps,
                                 args.token_tile)))  # fmt: skip
        return
    work = Path(tempfile.mkdtemp())
    rows = []
    for family in args.family:
        save_model(family, work / family, SHAPE)
        save_model(family, work / f"{family}{MINUSCULE}", {**SHAPE, **MINUSCULE_SHAPE})
        for length, way, checkpointing in product(args.max_length, args.training,
                                                  args.checkpointing):  # fmt: skip
            rows.append(in_fresh_process(str(work / family), way, checkpointing == "yes",
                                         length, args.batch, args.steps,
                                         args.token_tile))  # fmt: skip
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
