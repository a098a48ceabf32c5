"""Text generation's launch-plan memory estimate against the peak a real training step takes, on
this CPU: each configuration in a fresh process, side by side in one run.

The models are tiny but not trivial causal LMs built offline from the real configuration classes
of Llama and Qwen2 (`LlamaForCausalLM`, `Qwen2ForCausalLM`), shrunk: width 384, 4 layers, MLP
width 1,024, 6 query heads and 2 key/value heads (grouped-query attention, as the released
models), a 16,384-token vocabulary, untied LM head (as Llama 3 8B and Qwen 2.5 7B); random
weights. Each trains fp32 on the CPU, AdamW as the Trainer builds it, one batch of `--batch`
sequences of `--max_length` tokens (the length the plan assumes: every row cut or packed to it)
with labels on every token, in full or with `--peft lora` as the product builds it (the task's
default targets for the family, rank 16: trainer/tasks/lora_adapters.py), with and without
gradient checkpointing (non-reentrant, as transformers' default).

- peak: the process's peak RSS (ru_maxrss) minus its RSS before the model was built, after one
  warm-up step and `--steps` more (the optimizer state exists from the first step): weights,
  gradients, optimizer state, activations, and every transient buffer the step made (the
  loss's fp32 logits and their softmax, attention temporaries, the allocator's slack). The
  same measure as bench/lora.py, whose table tests/processes/test_memory_estimate.py checks.
- estimate: `TrainingFootprint.step_bytes` (trainer/tasks/step_memory.py) with the task's own
  activation count (`ChatTask.activation_values_per_sample`) for the same model, batch,
  length and checkpointing, as `python -m trainer --dry-run` reports it.

    python bench/chat_memory.py [--family llama qwen2] [--max_length 256 1024] [--batch 1]
                                [--steps 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from itertools import product
from pathlib import Path

import psutil
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from trainer.settings.model_flags import ModelArguments  # noqa: E402
from trainer.tasks.lora_adapters import parameter_counts, with_lora  # noqa: E402
from trainer.tasks.step_memory import TrainingFootprint  # noqa: E402
from trainer.tasks.text_generation.spec import SPEC, ChatArguments  # noqa: E402

SHAPE = {"hidden_size": 384, "num_hidden_layers": 4, "intermediate_size": 1024,
         "num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 16384,
         "max_position_embeddings": 2048, "tie_word_embeddings": False}  # fmt: skip
CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
           "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}  # fmt: skip
SETTINGS = [("full", False), ("full", True), ("lora", False), ("lora", True)]
"""(training, gradient checkpointing) of each configuration."""


def measure(family: str, peft: str, checkpointing: bool, length: int, batch: int, steps: int):
    """One configuration, in this process: its peak memory and the plan's estimate."""
    import transformers

    from trainer.tasks.text_generation.training import ChatTask

    torch.manual_seed(0)
    before = psutil.Process().memory_info().rss
    config_class, model_class = (getattr(transformers, name) for name in CLASSES[family])
    config = config_class(**SHAPE, attn_implementation="sdpa")
    model = model_class(config)
    if peft == "lora":
        model = with_lora(model, ModelArguments(peft="lora", lora_dropout=0.0),
                          SPEC.lora_targets)  # fmt: skip
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(3, SHAPE["vocab_size"], (batch, length))
    for _ in range(steps + 1):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    task = ChatTask(None, None, ChatArguments(max_seq_length=length), {})
    full, recomputed = task.activation_values_per_sample(model)
    trained, total = parameter_counts(model)
    footprint = TrainingFootprint(
        parameters=total, trainable_parameters=trained, activation_values=full,
        checkpointed_activation_values=recomputed, batch_size=batch, mixed_precision=False,
        zero_stage=None, optimizer_offloaded=False, world_size=1,
    )  # fmt: skip
    return {"family": family, "training": "LoRA" if peft == "lora" else "full",
            "checkpointing": checkpointing, "max_length": length, "batch": batch,
            "trainable_parameters": trained, "total_parameters": total, "peak_bytes": peak,
            "estimated_bytes": footprint.step_bytes(checkpointing),
            "parts": footprint.describe(checkpointing)}  # fmt: skip


def in_fresh_process(family, peft, checkpointing, length, batch, steps) -> dict:
    argv = [sys.executable, __file__, "--one", peft, "--family", family, "--max_length",
            str(length), "--batch", str(batch), "--steps", str(steps)]  # fmt: skip
    if checkpointing:
        argv.append("--checkpointing")
    done = subprocess.run(argv, capture_output=True, text=True, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    mib = 2**20
    lines = ["| model | training | checkpointing | max_length | trainable / total parameters "
             "| peak (MiB) | estimate (MiB) | estimate / peak |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        lines.append(
            f"| {row['family']} | {row['training']} | {'yes' if row['checkpointing'] else 'no'} "
            f"| {row['max_length']} | {row['trainable_parameters']:,} / "
            f"{row['total_parameters']:,} | {row['peak_bytes'] / mib:,.0f} | "
            f"{row['estimated_bytes'] / mib:,.0f} | "
            f"{row['estimated_bytes'] / row['peak_bytes']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", nargs="+", default=list(CLASSES), choices=list(CLASSES))
    parser.add_argument("--max_length", nargs="+", type=int, default=[256, 1024])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--one", choices=("none", "lora"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.family[0], args.one, args.checkpointing,
                                 args.max_length[0], args.batch, args.steps)))  # fmt: skip
        return
    rows = []
    for family, length, (training, checkpointing) in product(
        args.family, args.max_length, SETTINGS
    ):
        peft = "lora" if training == "lora" else "none"
        rows.append(in_fresh_process(family, peft, checkpointing, length, args.batch, args.steps))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
