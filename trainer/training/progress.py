"""Log lines that Cloud Logging reads well: one plain line per event, no progress bars.

Vertex AI collects stdout line by line, so tqdm's carriage-return bars arrive as noise.
The Trainer's logging steps become `step 20/40 (50%) | loss ... | samples/s | eta` lines
from the global main process, and each rank reports once what it is training on. Without a
`--logging_steps` from the user, lines come by time (`TimedLogSchedule`): the Trainer's
default of one line per 500 steps can mean an hour of silence on a slow model.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable
from datetime import timedelta

from transformers import TrainerCallback

from trainer.data.bad_examples import StreamSkips, skipped_per_epoch


def _duration(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


def _format_number(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 else f"{value:.4f}".rstrip("0").rstrip(".")
    return str(value)


class DataWaitClock:
    """Counts the seconds the training loop waits for batches from the data loader: a large share
    of step time means the GPU idles on input (more loader workers or `--log_mel_on device` fix
    it). Measured where the Trainer pulls batches (`get_batch_samples`), around each `next()`
    only, so the token count's all-reduce after it (waiting on slower ranks) is not in it.
    Kernels queued for the previous step may still run meanwhile: it is an upper bound of the
    GPU's idle time."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def attach(self, trainer) -> None:
        fetch = trainer.get_batch_samples

        def timed_fetch(epoch_iterator, num_batches, device):
            return fetch(self._timed(epoch_iterator), num_batches, device)

        trainer.get_batch_samples = timed_fetch

    def _timed(self, iterator):
        while True:
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                self.seconds += time.perf_counter() - start
            yield batch


LINE_EVERY_SECONDS = 60
"""The promise: a progress line at least this often (and at least every 5% of the run)."""

AIM_SECONDS = LINE_EVERY_SECONDS / 2
"""What the schedule aims at: steps may become twice as slow as measured and the next line
still comes within LINE_EVERY_SECONDS."""

LINES_PER_RUN = 20
"""At least one line per 1/20 (5%) of the run's steps."""


def slowest_rank(seconds: float) -> float:
    """The largest of every rank's value (the value itself in a single process). Logging gathers
    the loss from every rank, so all must log at the same steps: the slowest rank's step time
    decides for all. Called once per progress line, beside the Trainer's gather."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return seconds
    from accelerate import PartialState

    value = torch.tensor([seconds], dtype=torch.float64, device=PartialState().device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


class TimedLogSchedule:
    """The steps printing a progress line when the user chose no `--logging_steps`: the first,
    then each planned from the step time since the last line, at most AIM_SECONDS and 5% of the
    run ahead; step numbers, not deadlines, so all ranks (logging together) agree."""

    def __init__(self, total_steps: int, start_step: int) -> None:
        self.most_steps_between = max(1, total_steps // LINES_PER_RUN)
        self.next_step = start_step + 1

    def plan_after(self, step: int, seconds_per_step: float) -> int:
        by_time = math.floor(AIM_SECONDS / seconds_per_step) if seconds_per_step > 0 else math.inf
        self.next_step = step + max(1, min(self.most_steps_between, by_time))
        return self.next_step


def gather_lists(values: list) -> list:
    """Every rank's `values`, concatenated in rank order (`values` alone in one process)."""
    from accelerate.utils import gather_object

    return gather_object(values)


class ProgressLogCallback(TrainerCallback):
    """Prints training progress, evaluation results and the final summary as single lines.

    `timed` (no logging interval given) adds lines on a `TimedLogSchedule`; `clock` and `agree`
    (how ranks agree on a step time) are for tests. With `stream_skips` (a streamed training
    split) every rank merges its undecodable examples with the others' at each progress line
    and the summary (`gather`), where `--max_bad_examples` applies: one small collective per
    line, none per step."""

    def __init__(
        self,
        data_wait: DataWaitClock,
        timed: bool = False,
        clock: Callable[[], float] = time.monotonic,
        agree: Callable[[float], float] = slowest_rank,
        stream_skips: StreamSkips | None = None,
        gather: Callable[[list], list] = gather_lists,
    ) -> None:
        self._data_wait = data_wait
        self._timed = timed
        self._clock = clock
        self._agree = agree
        self._schedule: TimedLogSchedule | None = None
        self._stream_skips = stream_skips
        self._gather = gather

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = self._clock()
        self._last_time, self._last_step = self._start, state.global_step
        self._planned_at, self._planned_step = self._start, state.global_step
        self._last_wait = self._data_wait.seconds
        self._samples_per_step = (
            args.train_batch_size * args.gradient_accumulation_steps * (args.world_size)
        )
        if self._timed:
            self._schedule = TimedLogSchedule(state.max_steps, state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if self._schedule is None or state.global_step < self._schedule.next_step:
            return
        control.should_log = True
        now = self._clock()
        local = (now - self._planned_at) / max(state.global_step - self._planned_step, 1)
        self._schedule.plan_after(state.global_step, self._agree(local))
        self._planned_at, self._planned_step = now, state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        training_line = bool(logs) and ("train_runtime" in logs or "loss" in logs)
        if training_line and self._stream_skips is not None:
            self._agree_on_skips(state)
        line = self._line(state, logs) if state.is_world_process_zero and logs else None
        if line is not None:
            print(line, flush=True)

    def _agree_on_skips(self, state) -> None:
        """Every rank's stream skips, counted together at each training line (a collective:
        every rank takes part); the first ones get a line of their own."""
        if self._stream_skips.agree(self._gather) and state.is_world_process_zero:
            print(self._stream_skips.first_warning(), flush=True)

    def _line(self, state, logs: dict) -> str | None:
        if any(key.startswith("eval_") for key in logs):
            return self._eval_line(state, logs)
        if "train_runtime" in logs:
            return self._summary_line(logs)
        return self._step_line(state, logs) if "loss" in logs else None

    def _step_line(self, state, logs: dict) -> str:
        now = self._clock()
        steps = state.global_step - self._last_step
        interval = max(now - self._last_time, 1e-9)
        rate = steps * self._samples_per_step / interval
        wait = (self._data_wait.seconds - self._last_wait) / interval
        self._last_time, self._last_step = now, state.global_step
        self._last_wait = self._data_wait.seconds
        elapsed = now - self._start
        remaining = state.max_steps - state.global_step
        eta = elapsed / max(state.global_step, 1) * remaining
        parts = [
            f"step {state.global_step}/{state.max_steps} "
            f"({100 * state.global_step / max(state.max_steps, 1):.0f}%)",
            f"epoch {state.epoch:.2f}",
            f"loss {_format_number(logs['loss'])}",
        ]
        if "learning_rate" in logs:
            parts.append(f"lr {logs['learning_rate']:.2e}")
        parts += [
            f"{rate:.2f} samples/s",
            f"data wait {wait:.0%}",
            f"elapsed {_duration(elapsed)}",
            f"eta {_duration(eta)}",
        ]
        return " | ".join(parts + self._skipped_part())

    @staticmethod
    def _eval_line(state, logs: dict) -> str:
        metrics = [
            f"{key.removeprefix('eval_')} {_format_number(value)}"
            for key, value in logs.items()
            if key.startswith("eval_") and not key.endswith(("_per_second", "_runtime"))
        ]
        return " | ".join([f"eval at step {state.global_step}", *metrics])

    def _summary_line(self, logs: dict) -> str:
        """With CUDA, also this rank's peak of allocated GPU memory: how close the run came
        to running out, e.g. before raising the batch size."""
        import torch

        line = (
            f"training done in {_duration(logs['train_runtime'])} | "
            f"{logs.get('train_samples_per_second', 0):.2f} samples/s | "
            f"mean loss {_format_number(logs.get('train_loss', float('nan')))}"
        )
        if torch.cuda.is_available():
            line += f" | peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
        return " | ".join([line, *self._skipped_part()])

    def _skipped_part(self) -> list[str]:
        """Bad training examples skipped (trainer/data/bad_examples.py: undecodable media, a
        text task's examples without a text), if any: of a map-style split, the whole split's
        count per epoch, the same everywhere; of a stream, the files every process skipped so
        far, of the examples read."""
        skips = self._stream_skips
        if skips is not None:
            count = len(skips.names)
            return [f"skipped {count} undecodable of {skips.read} streamed"] if count else []
        skipped = skipped_per_epoch()
        return [f"skipped {skipped} bad examples per epoch"] if skipped else []


def _headline_number(value: object) -> str:
    """One decimal for percentages such as WER (92.9), three significant digits below 1."""
    if isinstance(value, float) and abs(value) >= 1:
        return f"{value:.1f}"
    return _format_number(value)


NOT_QUALITY_METRICS = ("eval_loss", "eval_runtime", "eval_samples_per_second",
                       "eval_steps_per_second", "epoch")  # fmt: skip


def headline_metric(metrics: dict, metric_for_best_model: str | None = None) -> str:
    """The metric a reader judges the run by: the one chosen to pick the best model, else
    the task's first own metric (WER, accuracy, ...), else the evaluation loss."""
    if metric_for_best_model:
        key = metric_for_best_model
        return key if key.startswith("eval_") else f"eval_{key}"
    own = [key for key in metrics if key.startswith("eval_") and key not in NOT_QUALITY_METRICS]
    return own[0] if own else "eval_loss"


def evaluation_logged_at(log_history: list[dict], step: int) -> dict | None:
    """The metrics of the evaluation logged at `step` (0: `--eval_on_start`), if any: every rank
    keeps the log history, so no rank is left alone in a collective by what it decides."""
    for logs in log_history:
        if logs.get("step") == step and "eval_loss" in logs:
            return {key: value for key, value in logs.items() if key != "step"}
    return None


def before_after_line(
    before: dict | None,
    after: dict,
    steps: int,
    examples: int,
    model_location: str,
    metric_for_best_model: str | None = None,
) -> str:
    """One closing line, e.g. `result: WER 112.0 before training -> 18.5 after 300 steps on 24
    eval examples; model in outputs/demo/model`. "Before" needs an evaluation at step 0
    (`--eval_on_start true`): a full evaluation more (generation, for speech), which a long run
    should not pay unasked; the demo recipe turns it on (24 short clips, ~2 s)."""
    key = headline_metric(after, metric_for_best_model)
    name = key.removeprefix("eval_")
    name = name.upper() if name in ("wer", "cer") else name
    result = f"{_headline_number(after.get(key, float('nan')))} after {steps} steps"
    if before is not None and key in before:
        result = f"{_headline_number(before[key])} before training -> {result}"
    return f"result: {name} {result} on {examples} eval examples; model in {model_location}"


class FirstBatchReport:
    """On its first training batch, each rank prints who it is and what it got: the fingerprint (a
    hash of the labels) shows at a glance whether ranks got different data, the first thing to
    check when scaling out goes wrong. Taken where the loop pulls batches (`get_batch_samples`,
    as `DataWaitClock`), not in the collator, which also makes evaluation batches
    (`--eval_on_start` comes first) and may run in loader workers."""

    def __init__(self) -> None:
        self._reported = False

    def attach(self, trainer) -> None:
        fetch = trainer.get_batch_samples

        def reporting_fetch(epoch_iterator, num_batches, device):
            batches, num_items = fetch(epoch_iterator, num_batches, device)
            if batches and not self._reported:
                self._reported = True
                print(self._line(batches[0]), flush=True)
            return batches, num_items

        trainer.get_batch_samples = reporting_fetch

    @staticmethod
    def _line(batch: dict) -> str:
        labels = batch.get("labels")
        first = labels if labels is not None else next(iter(batch.values()))
        digest = (
            hashlib.sha1(labels.cpu().numpy().tobytes()).hexdigest()[:12]
            if labels is not None
            else "-"
        )
        env = os.environ
        return (
            f"rank {env.get('RANK', '0')}/{env.get('WORLD_SIZE', '1')} "
            f"(node {env.get('GROUP_RANK', '0')}, local rank {env.get('LOCAL_RANK', '0')}): "
            f"first batch of {len(first)} examples, fingerprint {digest}"
        )


class StartupTimer(TrainerCallback):
    """Time from `python -m trainer` to the first optimizer step, phase by phase: a slow start
    costs every GPU of every node, and one line at the first step says where the time went."""

    def __init__(self, launched_at: float | None) -> None:
        self._start = self._last = launched_at or time.time()
        self._phases: list[tuple[str, float]] = []
        self._reported = False

    def mark(self, phase: str) -> None:
        """Record that `phase` ended now."""
        now = time.time()
        self._phases.append((phase, now - self._last))
        self._last = now

    def on_step_end(self, args, state, control, **kwargs):
        if self._reported:
            return
        self._reported = True
        self.mark("engine start and first step")
        if state.is_world_process_zero:
            phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self._phases)
            print(f"time to first step: {self._last - self._start:.1f} s ({phases})", flush=True)


def progress_by_time(given: tuple[str, ...]) -> bool:
    """Whether progress lines come by time: yes unless the command line or recipe chose a
    logging interval (`given`: the flags the user gave), which then wins."""
    return not set(given) & {"--logging_steps", "--logging_strategy"}
