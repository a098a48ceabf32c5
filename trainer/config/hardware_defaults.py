"""Training settings that make a run fast on the hardware it found, without changing its result.

`fast_defaults` is pure: the launcher passes the detected hardware and the flags the user gave,
and appends what it returns to the training flags (so `--dry-run` shows them). A flag the user
gave (command line or recipe) is never overridden. Gradient checkpointing depends on the model
and the batch, so the training processes decide it with the model loaded
(trainer/training/gradient_checkpointing.py): on only when a step's estimated memory does not
fit the GPU without it.

Checked and deliberately not a default: `--train_sampling_strategy group_by_length` (it changes
which examples share a batch, so the result; see docs/PERFORMANCE.md) and `--torch_compile`
(minutes of compilation on every start, and every new batch shape recompiles).
"""

from __future__ import annotations

from trainer.settings.run_config import Hardware

MAX_DATALOADER_WORKERS = 4
"""Whisper's log-mel features are computed in the collator; 4 workers keep a GPU fed."""


def fast_defaults(hardware: Hardware, user_flags: set[str]) -> list[str]:
    """Extra training flags for `hardware`, each only if its name is not in `user_flags`.

    - `--optim adamw_torch_fused` (everywhere): what transformers 5.23 already picks on torch
      2.13, made explicit so the plan shows it and an upgrade cannot silently fall back to the
      for-each AdamW (kernel launches per parameter tensor). Attention is not set: without
      `--attn_implementation`, `from_pretrained` picks SDPA where supported (Whisper, ViT,
      BERT; FlashAttention-2 kernels on Ampere+) and eager elsewhere, where `sdpa` would fail
      to load.
    - `--tf32 true` (compute capability 8.0+): PyTorch leaves TF32 off for CUDA matmuls and
      transformers turns it on only for torch.compile; the fp32 matmuls left under bf16 run on
      tensor cores (up to 8x an A100's fp32 rate) with bf16-level mantissa.
    - `--dataloader_num_workers N` (any GPU): the Trainer's default 0 stalls the GPU every step
      on decoding and log-mel features; N = min(4, CPUs per GPU // 2) leaves half of each GPU's
      CPUs to its training process.
    - `--dataloader_persistent_workers true` (with workers): kept alive across epochs and
      evaluations instead of forked again.
    - CPU: `--dataloader_pin_memory false` (pinning only speeds copies to a GPU, and the
      Trainer warns about it on every rank). Precision stays fp32 (no --bf16/--fp16), and no
      loader workers: they would compete with the training process for the same few cores."""
    defaults = [("--optim", "adamw_torch_fused")]
    if hardware.gpu_count == 0:
        defaults.append(("--dataloader_pin_memory", "false"))
    else:
        if hardware.supports_bf16:
            defaults.append(("--tf32", "true"))
        cpus_per_gpu = hardware.cpu_count // hardware.gpu_count
        workers = min(MAX_DATALOADER_WORKERS, cpus_per_gpu // 2)
        if workers > 0 and "--dataloader_num_workers" not in user_flags:
            defaults.append(("--dataloader_num_workers", str(workers)))
            defaults.append(("--dataloader_persistent_workers", "true"))
    return [token for flag, value in defaults if flag not in user_flags for token in (flag, value)]


MIB = 2**20
SHM_PER_LOADER_WORKER = 256 * MIB
"""/dev/shm one loader worker may fill: it hands each batch to its training process through shared
memory and keeps `prefetch_factor` (2) batches ready; 16 Whisper log-mel inputs are 15 MiB, 32
ViT images 18 MiB: room for larger batches and the collator's tensors."""

SHM_NCCL_RESERVE = 512 * MIB
"""/dev/shm kept for NCCL when a node runs several processes: without NVLink (L4, T4) its
intra-node transport goes through shared-memory buffers."""


def loader_workers_for_shm(
    shm_bytes: int | None, workers: int, procs_per_node: int
) -> tuple[int, str | None]:
    """Loader workers per process that /dev/shm can hold, and a warning when fewer than asked. A
    Vertex AI CustomJob cannot size /dev/shm, and a worker that runs out of it dies with a bus
    error mid-training. Rule: keep `SHM_NCCL_RESERVE` for NCCL with several processes, then
    give every worker of every process `SHM_PER_LOADER_WORKER`; 0 workers is always allowed."""
    if shm_bytes is None or workers <= 0:
        return workers, None
    reserve = SHM_NCCL_RESERVE if procs_per_node > 1 else 0
    fits = max(0, (shm_bytes - reserve) // (procs_per_node * SHM_PER_LOADER_WORKER))
    if fits >= workers:
        return workers, None
    return fits, (
        f"/dev/shm is {shm_bytes // MIB} MiB: lowering --dataloader_num_workers from {workers} "
        f"to {fits} ({procs_per_node} process(es), {SHM_PER_LOADER_WORKER // MIB} MiB per "
        "loader worker); give the container more shared memory (docker --shm-size or "
        "--ipc=host) to keep them."
    )


def flag_names(argv: list[str]) -> set[str]:
    """The flag names in a command line: `--name` and `--name=value` both give `--name`."""
    return {token.split("=", 1)[0] for token in argv if token.startswith("--")}
