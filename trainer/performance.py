"""Training flags that make a run fast on the hardware it found, without changing its result.

`fast_defaults` is pure: the launcher passes the detected hardware and the flags the user
gave, and appends what it returns to the training flags (so `--dry-run` shows them). A flag
the user gave (on the command line or in a recipe) is never overridden.

Only flags that change behaviour are added. Checked against the pinned versions (torch 2.13,
transformers 5.23) and left to the libraries:

- optimizer: `TrainingArguments.optim` already defaults to `adamw_torch_fused` on torch >= 2.8
  (transformers/training_args.py), and the fused kernel also runs on CPU (torch >= 2.4).
- attention: Whisper declares `_supports_sdpa` and `from_pretrained` already picks `sdpa`
  (`model.config._attn_implementation == "sdpa"`); the project has no attention flag.
- gradient checkpointing: off unless asked for (`--gradient_checkpointing true`); it
  recomputes every activation in the backward pass (about a third more compute) and is only
  worth it when a batch does not fit otherwise.
- `--train_sampling_strategy group_by_length` is not used: Whisper pads every clip to its
  30 s window, so only label padding would shrink, and the Trainer cannot infer lengths from
  our raw audio+text rows (no `length` column, no `input_features` key).
"""

from __future__ import annotations

from trainer.hardware import Hardware

MAX_DATALOADER_WORKERS = 4
"""Whisper's log-mel features are computed in the collator; 4 workers keep a GPU fed."""


def fast_defaults(hardware: Hardware, user_flags: set[str]) -> list[str]:
    """Extra training flags for `hardware`, each only if its name is not in `user_flags`.

    - `--tf32 true` (compute capability 8.0+): PyTorch leaves TF32 off for CUDA matmuls and
      transformers only turns it on for torch.compile; the fp32 matmuls left under bf16 run
      on tensor cores (up to 8x an A100's fp32 rate) with bf16-level mantissa.
    - `--dataloader_num_workers N` (any GPU): the Trainer's default is 0, so decoding audio and
      computing log-mel features stalls the GPU every step; N = min(4, CPUs per GPU // 2)
      leaves half of each GPU's CPUs to its training process.
    - `--dataloader_persistent_workers true` (with workers): keeps them alive across epochs
      and evaluations instead of forking them again.
    - CPU: nothing. Precision stays fp32 (the launcher adds no --bf16/--fp16), and extra
      loader processes compete with the training process for the same few cores.
    """
    defaults: list[tuple[str, str]] = []
    if hardware.gpu_count > 0:
        if hardware.supports_bf16:
            defaults.append(("--tf32", "true"))
        cpus_per_gpu = hardware.cpu_count // hardware.gpu_count
        workers = min(MAX_DATALOADER_WORKERS, cpus_per_gpu // 2)
        if workers > 0 and "--dataloader_num_workers" not in user_flags:
            defaults.append(("--dataloader_num_workers", str(workers)))
            defaults.append(("--dataloader_persistent_workers", "true"))
    return [token for flag, value in defaults if flag not in user_flags for token in (flag, value)]


def flag_names(argv: list[str]) -> set[str]:
    """The flag names in a command line: `--name` and `--name=value` both give `--name`."""
    return {token.split("=", 1)[0] for token in argv if token.startswith("--")}
