"""Trainer callbacks that connect training to storage, to Vertex AI's tuning service, and
to the stop requests and save interval of trainer/training/preemption.py."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from transformers import TrainerCallback

from trainer.common.step_time import stop_advice
from trainer.storage.checkpoints import CheckpointUploader
from trainer.storage.file_modes import make_readable
from trainer.storage.store import Store
from trainer.training.failures import RunFailed
from trainer.training.preemption import EvaluationStopped, StopRequest, agree

logger = logging.getLogger(__name__)


def reports_to_tuning(env: Mapping[str, str]) -> bool:
    """Whether evaluations are reported to Vertex AI hyperparameter tuning (cloudml-hypertune).

    No Google page says what marks a trial for a custom container: cloudml-hypertune reads
    `CLOUD_ML_HP_METRIC_FILE`, AI Platform set `CLOUD_ML_TRIAL_ID`, CLUSTER_SPEC may carry
    `task.trial`. An unmarked trial would end without a metric, so on Vertex AI (any
    CLUSTER_SPEC) reports are always written (outside tuning, a small file nobody reads); off
    it, only when a variable asks."""
    return any(
        name in env for name in ("CLUSTER_SPEC", "CLOUD_ML_TRIAL_ID", "CLOUD_ML_HP_METRIC_FILE")
    )


class UploadsImpossible(RunFailed):
    """Checkpoint uploads cannot succeed at all (the bucket is gone, every upload
    refused): training on would only produce work that no restart can resume."""


class StoppedMidStep(Exception):
    """Every rank agreed, between two micro-batches of one step, that a stop was requested:
    the step is abandoned and the last completed one saved. `origin_node`: where the
    signal came."""

    def __init__(self, origin_node: int) -> None:
        super().__init__(f"stop requested on node {origin_node} during a step")
        self.origin_node = origin_node


def rng_states() -> dict:
    """The random generators a Trainer checkpoint saves (`Trainer._save_rng_state`)."""
    import random

    import numpy as np
    import torch

    states = {"python": random.getstate(), "numpy": np.random.get_state(),
              "cpu": torch.random.get_rng_state()}  # fmt: skip
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.random.get_rng_state_all()
    return states


def restore_rng_states(states: dict) -> None:
    import random

    import numpy as np
    import torch

    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if "cuda" in states:
        torch.cuda.random.set_rng_state_all(states["cuda"])


class NothingLeftToTrain(Exception):
    """The run resumed from a checkpoint of its last step: nothing is left to train."""


class NoStepPastTheEnd(TrainerCallback):
    """Ends `train()` before a step past `--max_steps`. The Trainer checks for the end after
    each step, so resumed from a checkpoint of the last step it would train one step more
    whenever --max_steps is not a whole number of epochs (a restart after a stop at the
    last step). Every rank raises at the same step: no collective is left waiting."""

    def on_step_begin(self, args, state, control, **kwargs):
        if 0 < state.max_steps <= state.global_step:
            raise NothingLeftToTrain


class CheckpointSyncCallback(TrainerCallback):
    """Hands every saved checkpoint to this node's uploader (trainer/storage/checkpoints.py),
    warns once when uploads fall a save behind, and stops training when they cannot succeed."""

    def __init__(self, uploader: CheckpointUploader | None) -> None:
        self.uploader = uploader
        self._warned = False

    def on_step_end(self, args, state, control, **kwargs):
        if self.uploader is not None and self.uploader.fatal:
            raise UploadsImpossible(
                f"checkpoint uploads cannot succeed: {self.uploader.fatal}; training stopped "
                f"after step {state.global_step} rather than go on without saving"
            )

    def on_save(self, args, state, control, **kwargs):
        from accelerate import PartialState

        # Every rank writes its own files (optimizer shard, RNG state) and the Trainer does
        # not wait for the others before this callback: wait here, then snapshot.
        PartialState().wait_for_everyone()
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if PartialState().is_local_main_process:  # readable to all, as kept and as uploaded
            make_readable(checkpoint)
        if self.uploader is not None:
            best = Path(state.best_model_checkpoint).name if state.best_model_checkpoint else None
            obsolete = self.uploader.submit(checkpoint, best)
            if obsolete and not self._warned:
                self._warned = True
                print(backlog_warning(self.uploader, obsolete, checkpoint.name), flush=True)


def backlog_warning(uploader: CheckpointUploader, obsolete: list[str], newest: str) -> str:
    """The line for uploads that fell a whole save interval behind: names, not the store's
    location (said at the start; a long one pushed the line past 300 characters)."""
    since = uploader.uploading_since
    running = f" ({time.monotonic() - since:.0f} s so far)" if since is not None else ""
    waited = obsolete[-1] if len(obsolete) == 1 else f"{len(obsolete)} older checkpoints"
    return (
        f"warning: checkpoint uploads are slower than saves: {newest} was saved while "
        f"{waited} waited behind {uploader.uploading or 'an upload'}{running}; only the "
        "newest is uploaded next, so a crash loses more steps. Save less often (--save_steps, "
        "--save_interval_minutes) or give uploads more bandwidth."
    )


class TensorBoardSyncCallback(TrainerCallback):
    """Copies the TensorBoard logs to their store every few seconds and at the end. Event files
    grow while written, so each sync uploads a consistent snapshot from a staging dir."""

    def __init__(self, local_dir: Path, store: Store, staging: Path, interval: float) -> None:
        self.local_dir = local_dir
        self.store = store
        self.staging = staging
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._synced: dict[str, tuple[int, int]] = {}

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tensorboard-sync", daemon=True)
            self._thread.start()

    def on_train_end(self, args, state, control, **kwargs):
        """Stops the periodic sync. The last one is the training program's to call, after
        the final evaluation (whose metrics it should carry) and after the model is safe."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except Exception as error:  # noqa: BLE001 - the next sync tries again
                logger.warning("TensorBoard sync to %s failed: %s", self.store.uri, error)

    def sync(self) -> None:
        if not self.local_dir.is_dir():
            return
        changed = []
        for path in sorted(p for p in self.local_dir.rglob("*") if p.is_file()):
            name = path.relative_to(self.local_dir).as_posix()
            stat = path.stat()
            if self._synced.get(name) != (stat.st_size, stat.st_mtime_ns):
                target = self.staging / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
                changed.append((name, (stat.st_size, stat.st_mtime_ns)))
        if changed:
            self.store.upload(self.staging, [name for name, _ in changed])
            self._synced.update(changed)


class HypertuneCallback(TrainerCallback):
    """Reports `metric_for_best_model` after each evaluation to Vertex AI's tuning service, once
    per step, from the global main process, with one HyperTune (a second overwrites its file)."""

    def __init__(self, metric: str) -> None:
        import hypertune

        self.metric = metric.removeprefix("eval_")
        self._reporter = hypertune.HyperTune()
        self._reported_steps: set[int] = set()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        value = (metrics or {}).get(f"eval_{self.metric}")
        reported = state.global_step in self._reported_steps
        if not state.is_world_process_zero or value is None or reported:
            return
        self._reported_steps.add(state.global_step)
        self._reporter.report_hyperparameter_tuning_metric(
            hyperparameter_metric_tag=self.metric,
            metric_value=float(value),
            global_step=state.global_step,
        )


FIRST_STEPS = 2
"""Steps that may be slow for reasons of their own (engine warm-up, first batches)."""


def long_step_warning(took: float, grace: float) -> str:
    return (
        f"warning: a stop can be agreed only every {took:.0f} s here (a training step, or a "
        f"micro-batch under gradient accumulation), longer than --stop_grace_seconds "
        f"{grace:g}: a preemption would lose the work since the newest complete checkpoint. "
        + stop_advice()
    )


class SaveOnStopOrInterval(TrainerCallback):
    """After each step: on an agreed stop request, save and stop; when rank 0's clock says the
    interval has passed since the last save (whatever triggered it), save. Between the
    micro-batches of one step (gradient accumulation) and between evaluation batches: on an
    agreed stop, abandon the step (`StoppedMidStep`; trainer/training/run.py saves the last
    completed step) or the evaluation (`EvaluationStopped`; trainer/training/keep_work.py
    saves the step then): a step or an evaluation can take longer than the grace.
    `stopped_at_step`, `stop_origin_node` and `agreed_at` (this rank's clock) say what
    happened; `clock` and `agree` are for tests."""

    def __init__(
        self,
        stop: StopRequest,
        interval_minutes: float | None,
        clock: Callable[[], float] = time.monotonic,
        agree: Callable[[list[float]], list[float]] = agree,
        uploader: CheckpointUploader | None = None,
        num_nodes: int = 1,
        stop_grace: float | None = None,
    ) -> None:
        self._stop = stop
        self._stop_grace = stop_grace
        self._last_agreement: float | None = None
        self._warned_long_step = False
        self._uploader = uploader
        self._num_nodes = num_nodes
        self._interval = interval_minutes * 60 if interval_minutes else None
        self._clock = clock
        self._agree = agree
        self._last_save = clock()
        self._node = int(os.environ.get("GROUP_RANK", "0"))
        self._step_start_rng: dict | None = None
        self.stopped_at_step: int | None = None
        self.stop_origin_node: int | None = None
        self.agreed_at: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._last_save = self._clock()

    def on_step_begin(self, args, state, control, **kwargs):
        if args.gradient_accumulation_steps > 1:  # what a checkpoint of the last step holds
            self._step_start_rng = rng_states()
        self._last_agreement = self._clock()

    def on_substep_end(self, args, state, control, **kwargs):
        self._time_since_last_agreement(state)
        if self._agreed_stop(state.global_step):  # the last completed step
            raise StoppedMidStep(self.stop_origin_node)

    def on_step_end(self, args, state, control, **kwargs):
        self._time_since_last_agreement(state)
        stop_here = self._node + 1 if self._stop.requested else 0
        due = bool(
            self._interval is not None
            and state.is_world_process_zero
            and self._clock() - self._last_save >= self._interval
        )
        stop_origin, save_due, *abandoned = self._agree(
            [float(stop_here), float(due), *self._uploads_word()]
        )
        self._hear(abandoned)
        if stop_origin:
            self._stopped(state.global_step, stop_origin)
            control.should_save = True
            control.should_training_stop = True
            control.should_evaluate = False  # no time for it: the notice is seconds long
        elif save_due:
            control.should_save = True

    def _time_since_last_agreement(self, state) -> None:
        """Once, after the first steps (the first one warms up): a `warning:` when more time
        passes between two points where a stop can be agreed (a step, or a micro-batch under
        gradient accumulation) than --stop_grace_seconds: a stop would then outlast what
        torchrun waits, and a preemption lose the work since the newest complete checkpoint."""
        now, last = self._clock(), self._last_agreement
        self._last_agreement = now
        if self._stop_grace is None or self._warned_long_step or last is None:
            return
        took = now - last
        if state.global_step > FIRST_STEPS and took > self._stop_grace:
            self._warned_long_step = True
            if state.is_world_process_zero:
                print(long_step_warning(took, self._stop_grace), flush=True)

    def settle_uploads(self) -> None:
        """After the last step, on every rank: agree once a second until no node's uploads are
        pending, carrying each node's word on the checkpoints it gave up (as after each step),
        so that the chief waits for no peer whose part will not come. Ends at a stop."""
        if self._num_nodes == 1:
            return
        while True:
            busy = self._uploader is not None and self._uploader.busy
            stopping = self._stop.requested
            busy_anywhere, stop_anywhere, *abandoned = self._agree(
                [float(busy), float(stopping), *self._uploads_word()]
            )
            self._hear(abandoned)
            if not busy_anywhere or stop_anywhere:
                return
            time.sleep(1)

    def _uploads_word(self) -> list[float]:
        """This node's slot: the newest checkpoint step its uploader gave up on (others -1;
        every rank takes part, the local main process speaks for the node)."""
        if self._num_nodes == 1:
            return []
        word = [-1.0] * self._num_nodes
        if self._uploader is not None:
            word[self._node] = float(self._uploader.abandoned_through)
        return word

    def _hear(self, abandoned: list[float]) -> None:
        if abandoned and self._uploader is not None and self._uploader.is_global_main:
            self._uploader.hear_peers(abandoned)

    def rewind_to_step_start(self) -> None:
        """The random generators back where the abandoned step began, so that the checkpoint
        of the last completed step holds what a save at its end would have (dropout draws
        of the abandoned micro-batches would otherwise make the resumed run differ)."""
        if self._step_start_rng is not None:
            restore_rng_states(self._step_start_rng)

    def _agreed_stop(self, step: int) -> bool:
        """Whether any rank got a stop request (one collective: every rank calls it at the
        same point); if so, the stop is recorded as keeping `step`."""
        stop_here = self._node + 1 if self._stop.requested else 0
        (stop_origin,) = self._agree([float(stop_here)])
        if stop_origin:
            self._stopped(step, stop_origin)
        return bool(stop_origin)

    def _stopped(self, step: int, stop_origin: float) -> None:
        self.stopped_at_step = step
        self.stop_origin_node = int(stop_origin) - 1
        self.agreed_at = self._clock()

    def on_prediction_step(self, args, state, control, **kwargs):
        """Every rank runs the same number of evaluation batches (the sampler pads), so
        this agreement lines up like the one after each step."""
        if self._agreed_stop(state.global_step):
            raise EvaluationStopped(self.stop_origin_node)

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.stopped_at_step is not None:  # saved already; no time to evaluate
            control.should_evaluate = control.should_save = False

    def on_save(self, args, state, control, **kwargs):
        self._last_save = self._clock()
