"""Known-harmless library output, silenced in one place, each entry with its reason.

On Vertex AI every line a process prints is a Cloud Logging entry, per process, per node:
a harmless deprecation repeated by 16 ranks at every checkpoint buries the lines that
matter. Only what is listed here is hidden; any other warning still shows, and a test
(tests/unit/test_quiet_logs.py) fails on warning-looking output that is not on this list.
`silence_known_noise()` runs first in every training process and in the launcher.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class KnownNoise:
    pattern: str
    """A regular expression searched for in the warning or log message."""
    reason: str
    """Why hiding it loses nothing."""
    category: type[Warning] | None = None
    """A Python warning of this category; None: a log record (transformers' loggers)."""


ALLOWED = [
    KnownNoise(
        r"torch\.distributed\.all_gather_into_tensor` is deprecated",
        "raised inside DeepSpeed's ZeRO checkpoint and step code (deepspeed 0.19 on torch "
        "2.13), not ours to change; it says nothing about the run",
        FutureWarning,
    ),
    KnownNoise(
        r"Passing `generation_config` together with generation-related arguments",
        "Seq2SeqTrainer passes max_length/num_beams next to the model's generation config "
        "when it evaluates with generate; the explicit values win, as intended",
    ),
    KnownNoise(
        r"The attention mask is not set with a batched input",
        "Whisper's decoder starts from fixed prompt tokens of equal length, so no padding "
        "is there to mask; the encoder input (log-mel features) needs no mask",
    ),
    KnownNoise(
        r"torch\.distributed\.reduce_scatter_tensor` is deprecated",
        "raised inside DeepSpeed's ZeRO-3 gradient reduction (deepspeed 0.19 on torch "
        "2.13), many times a step; not ours to change",
        FutureWarning,
    ),
    KnownNoise(
        r"`?torch\.distributed\._all_gather_base`? is a private function",
        "the same deprecation as all_gather_into_tensor, from older DeepSpeed code paths",
        FutureWarning,
    ),
    KnownNoise(
        r"MPU is not provided, setting tp size to 1 in checkpoint loading",
        "DeepSpeed 0.19 logs it on every rank at every resume of a ZeRO checkpoint; this "
        "project uses no tensor parallelism, so a tensor-parallel size of 1 is right",
    ),
    KnownNoise(
        r"`is_gradient_checkpointing` is deprecated",
        "PEFT 0.21 reads transformers 5's renamed attribute by its old name when it adds "
        "LoRA adapters (--peft lora); the value it gets is right",
        FutureWarning,
    ),
    KnownNoise(
        r"You seem to be using the pipelines sequentially on GPU",
        "python -m trainer.serve calls the task's pipeline once per batch on purpose: the "
        "batching across requests is its own (trainer/serve/batching.py)",
    ),
    KnownNoise(
        r"Failed to load CPU gemm_4bit_forward from kernels-community",
        "bitsandbytes 0.50 (the image's `gpu` extra) looks for the optional `kernels` package "
        "when it is imported on a CPU with AVX-512 BF16, for 4-bit matrix products on the CPU; "
        "this project quantizes to 8 bits, on GPUs only (--load_in_8bit)",
    ),
    KnownNoise(
        r"No CUDA runtime is found, using CUDA_HOME=",
        "torch's extension builder, compiling DeepSpeed's CPU shared-memory op in a CPU run of "
        "the CUDA image (whose base has /usr/local/cuda); that op has no CUDA code",
    ),
]

NOISY_LOGGERS = ("bitsandbytes.backends.cpu.ops", "torch.utils.cpp_extension")
"""Loggers that print one of the ALLOWED messages through handlers of their own library
(torch's) or none at all (Python's last resort): the filter sits on the logger itself."""

DEEPSPEED_LOGGER = "DeepSpeed"
"""The logger deepspeed.utils.logging creates (propagating nowhere)."""

PROGRESS_BAR_VARIABLES = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # huggingface_hub and transformers' bars
    # ("Loading weights", "Writing model shards", downloads)
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",  # "Generating train split", map/filter bars
}
"""tqdm bars redraw with carriage returns: in Cloud Logging each redraw is an entry and
every rank draws its own. trainer.training.progress prints plain lines instead."""


def silence_known_noise() -> None:
    """Hide exactly the ALLOWED messages and the libraries' progress bars, in this process
    (and, through the environment, in the processes it starts)."""
    os.environ.update(PROGRESS_BAR_VARIABLES)
    for noise in ALLOWED:
        if noise.category is not None:
            warnings.filterwarnings("ignore", message=f".*{noise.pattern}", category=noise.category)
    _filter_library_logs()
    _disable_loaded_progress_bars()


class _KnownNoiseFilter(logging.Filter):
    patterns = [re.compile(noise.pattern) for noise in ALLOWED if noise.category is None]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(pattern.search(message) for pattern in self.patterns)


def _filter_library_logs() -> None:
    """transformers logs through its own handler on the `transformers` logger: a filter on the
    emitting loggers would miss child loggers' records, so it sits on the handlers
    (transformers' and the root's). DeepSpeed logs on one logger, "DeepSpeed", whose handler is
    made when DeepSpeed is imported (later, in a training process): the filter sits on it, as
    on the NOISY_LOGGERS."""
    from transformers.utils import logging as hf_logging

    hf_logging.get_logger()  # makes sure transformers' handler exists
    noise_filter = _KnownNoiseFilter()
    for target in [*logging.getLogger("transformers").handlers, *logging.getLogger().handlers,
                    logging.getLogger(DEEPSPEED_LOGGER),
                    *(logging.getLogger(name) for name in NOISY_LOGGERS)]:  # fmt: skip
        if not any(isinstance(f, _KnownNoiseFilter) for f in target.filters):
            target.addFilter(noise_filter)


def _disable_loaded_progress_bars() -> None:
    """The variables are read at import; libraries imported already are told directly.
    `datasets` is told only if imported (it reads the variable when it is): the serving
    image's server has no use for it and does not import it."""
    import huggingface_hub.utils
    from transformers.utils import logging as hf_logging

    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    huggingface_hub.utils.disable_progress_bars()
    hf_logging.disable_progress_bar()
