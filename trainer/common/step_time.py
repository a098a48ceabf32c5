"""How long one micro-batch's forward and backward pass takes on one GPU, estimated before
launch from the model's FLOPs and the GPU's peak.

Why before launch: the ranks can agree on a stop only between micro-batches
(trainer/training/callbacks.py), so a micro-batch longer than `--stop_grace_seconds` means a
preemption loses the work since the newest complete checkpoint. The training processes say so
once they have timed a few steps; the plan (trainer/preflight/stop_grace.py) says it from this
estimate before any GPU is rented, and `python -m trainer.jobspec --spot` warns.

The arithmetic, per example (a multiply-add is 2 FLOPs):

- forward: 2 x each weight x the positions it applies to (Kaplan et al. 2020, "Scaling Laws
  for Neural Language Models", C = 6N per token of which the forward is 2N), plus attention's
  scores and weighted sums, 4 x layers x width x queries x keys (Chowdhery et al. 2022,
  "PaLM", appendix B: 12 x layers x width x sequence per token for forward and backward);
  embedding lookups, norms, softmax, activations and the loss are left out;
- backward: each weight's input gradient (as much as its forward: frozen weights too, since
  the gradient flows through them to the adapters below them) plus each trainable weight's
  own gradient (as much again): full fine-tuning costs 3 x forward, LoRA about 2 x forward
  (two thirds: the frozen weights' gradients are skipped, the adapters' are small), attention
  2 x its forward either way (both its operands are activations);
- gradient checkpointing runs the forward once more during backward.

Divided by the GPU's dense peak (`PEAK_TFLOPS`) times an assumed model-FLOPs utilisation
(`ASSUMED_UTILISATION`), calibrated by bench/step_time.py. Not counted: the optimizer step
(once per step, small beside a micro-batch's passes), ZeRO-3's weight gathers and a CPU
optimizer's step with offload, 8-bit weights' slower matmuls, data loading.

It reads only a model's `named_parameters()` and `config` and imports nothing: the task
modules (trainer/tasks) load datasets, accelerate and peft, and bench/step_time.py must
import this on a machine that has only torch and transformers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ASSUMED_UTILISATION = 0.2
"""The share of the GPU's dense peak a training micro-batch reaches (model FLOPs utilisation,
counted as above). Measured on an H100 SXM (bench/step_time.py's passes, torch 2.11,
transformers 5.17, docs/benchmarks.md "A micro-batch's time"): the micro-batches long enough
to matter (whisper-small at 32-64 examples, whisper-large-v3 at 8-16) reached 0.21-0.34 in
bf16 weights as DeepSpeed trains them, 0.17-0.23 under autocast; short ones (ViT and BERT
under 64 examples, tens of milliseconds) less, bound by kernel launches. Large-model training
reports 21-46% (Chowdhery et al. 2022, PaLM, Table 3). 0.2 is about the lowest of the long
micro-batches: a lower figure makes the estimate longer, so the warning errs towards saying it
(LoRA-like passes under autocast, 0.17-0.18, are up to 15% longer than estimated)."""

PEAK_TFLOPS: dict[str, tuple[float, float | None, float]] = {
    # NVIDIA data sheets; the tensor-core figures they mark "with sparsity" are halved to dense.
    "H100 PCIe": (756, 378, 51),  # H100 data sheet, PCIe: BF16 1,513*, TF32 756*, FP32 51
    "H100": (989, 494, 67),  # H100 data sheet, SXM: BF16/FP16 1,979*, TF32 989*, FP32 67
    "H200": (989, 494, 67),  # H200 data sheet, SXM: BF16/FP16 1,979*, TF32 989*, FP32 67
    "A100": (312, 156, 19.5),  # A100 data sheet (40 and 80 GB): BF16 312, TF32 156, FP32 19.5
    "L4": (121, 60, 30.3),  # L4 data sheet: BF16/FP16 242*, TF32 120*, FP32 30.3
    "T4": (65, None, 8.1),  # T4 data sheet: mixed precision (FP16) 65, FP32 8.1; no TF32
}
"""GPU name as torch reports it (a whole word of it) -> dense TFLOP/s peaks for 16-bit
tensor-core matmuls (bf16, or fp16 on a T4, which has no bf16), TF32 (None: the GPU has none)
and plain FP32: every GPU of trainer/preflight/vertex_machines.py. Matched in this order, so
the PCIe H100 comes before the SXM one."""

PRECISIONS = ("16-bit", "tf32", "fp32")


def peak_flops(gpu_name: str | None, precision: str) -> float | None:
    """The GPU's dense peak in FLOP/s for `precision` (one of `PRECISIONS`; TF32 on a GPU
    without it is FP32), or None for a GPU not in `PEAK_TFLOPS`."""
    for name, peaks in PEAK_TFLOPS.items():
        if gpu_name and re.search(rf"\b{re.escape(name)}\b", gpu_name):
            sixteen, tf32, fp32 = peaks
            return 1e12 * {"16-bit": sixteen, "tf32": tf32 or fp32, "fp32": fp32}[precision]
    return None


@dataclass(frozen=True)
class ForwardFlops:
    """One example's forward pass, in FLOPs, split as the backward pass needs it."""

    weights: float
    """2 x each weight x the positions it applies to."""
    trainable_weights: float
    """The part of `weights` that trainable weights do: their gradients cost as much again."""
    attention: float
    """Attention's scores and weighted sums."""
    reference: float = 0.0
    """A frozen second model's forward pass over the same example, without gradients (a
    preference-tuning reference; `Task.reference_parameters`); 0 for a task with one model."""

    def training(self, checkpointing: bool) -> float:
        """Forward and backward of one example, and the reference's forward (the module
        docstring says why)."""
        forward = self.weights + self.attention
        backward = self.weights + self.trainable_weights + 2 * self.attention
        return forward * (2 if checkpointing else 1) + backward + self.reference


def _weight_flops(weighted: list[tuple[object, int]]) -> tuple[float, float]:
    """(all, trainable) forward FLOPs of (parameter, positions it applies to) pairs."""
    total = trainable = 0.0
    for parameter, positions in weighted:
        flops = 2.0 * parameter.numel() * positions
        total += flops
        trainable += flops if parameter.requires_grad else 0.0
    return total, trainable


WHISPER_AUDIO_SIDE = re.compile(r"(^|\.)encoder\.|encoder_attn\.[kv]_proj\.")
"""Whisper weights that apply to the audio positions: the encoder's, and the decoder's
cross-attention keys and values (over the encoder's states)."""


def whisper_forward_flops(model, label_tokens: int) -> ForwardFlops:
    """A Whisper model (or a PEFT model around one): the encoder's weights over its
    `max_source_positions` (1500 for the 30 s window: the first convolution, which runs over
    twice as many mel frames, is counted over these too), the decoder's and the output
    projection (tied to the token embedding: `remove_duplicate=False` lists it) over
    `label_tokens`, the cross-attention keys and values over the audio; attention: encoder
    self-attention, decoder self- and cross-attention (causal masking not subtracted)."""
    config = model.config
    frames = config.max_source_positions
    weighted = [
        (parameter, frames if WHISPER_AUDIO_SIDE.search(name) else label_tokens)
        for name, parameter in model.named_parameters(remove_duplicate=False)
        if "embed_" not in name  # lookups: token and position embeddings
    ]
    weights, trainable = _weight_flops(weighted)
    queries_by_keys = config.encoder_layers * frames * frames
    queries_by_keys += config.decoder_layers * label_tokens * (label_tokens + frames)
    return ForwardFlops(weights, trainable, 4.0 * config.d_model * queries_by_keys)


ENCODER_HEAD = re.compile(r"(^|\.)(pooler|pre_classifier|classifier|score)\.")
"""Modules of a sequence-classification encoder that see one position (the [CLS] token's, or
the pooled one): the pooler and the classification head."""


def encoder_forward_flops(model, positions: int) -> ForwardFlops:
    """A BERT-style text or ViT image classifier (or a PEFT model around one): every weight
    outside the embeddings over `positions` (ViT's patch projection, a matmul over the
    patches, is counted over them too), the pooler and head over one; self-attention over
    `positions` in every layer."""
    weighted = [
        (parameter, 1 if ENCODER_HEAD.search(name) else positions)
        for name, parameter in model.named_parameters()
        if "embeddings." not in name or "patch_embeddings." in name
    ]
    weights, trainable = _weight_flops(weighted)
    config = model.config
    attention = 4 * config.num_hidden_layers * config.hidden_size * positions * positions
    return ForwardFlops(weights, trainable, float(attention))


def micro_batch_seconds(training_flops_per_example: float, batch_size: int, peak: float) -> float:
    """Seconds of one micro-batch of `batch_size` examples on a GPU of dense `peak` FLOP/s."""
    return batch_size * training_flops_per_example / (peak * ASSUMED_UTILISATION)


def stop_advice(fitting_batch: int | None = None) -> str:
    """What to change when a stop cannot be agreed within the grace: the runtime warning's
    advice (trainer/training/callbacks.py) and the plan's, one wording; `fitting_batch`, the
    plan's, the examples whose micro-batch the estimate ends within the grace."""
    smaller = (
        f" (micro-batches of at most about {examples(fitting_batch)} end within the grace, "
        "which the save needs too)"
        if fitting_batch
        else ""
    )
    return (
        "Save more often (--save_steps, --save_interval_minutes), or use more gradient "
        f"accumulation steps of fewer examples{smaller}"
    )


def examples(count: int) -> str:
    return f"{count} example{'' if count == 1 else 's'}"
