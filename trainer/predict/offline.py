"""The examples through the server's predictor, offline: each instance prepared on a pool of
threads (as the server prepares a request's instances), in order, a few batches ahead; one
forward pass per `batch_size` prepared instances; one line per prediction.

An example that cannot be prepared (unreadable, not audio or an image, a wrong schema) is
skipped and counted, with one `warning:` line; more than `--max_bad_examples` allows (a count,
or a share of all the examples, as training counts them) stops the run with a UserError.
"""

from __future__ import annotations

import json
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TextIO

from tqdm import tqdm

from trainer.data.bad_examples import NAMES_SHOWN, check_limit
from trainer.predict.examples import Example
from trainer.tasks.instance_media import InstanceError
from trainer.tasks.predictor import Predictor

BATCHES_AHEAD = 4
"""How many batches of instances are being prepared while the model computes one."""


@dataclass
class Outcome:
    total: int
    scored: list[tuple[Any, dict]] = field(default_factory=list)
    """(reference, prediction) of every predicted example that has a reference."""
    predicted: int = 0
    skipped: list[str] = field(default_factory=list)


@dataclass
class OfflineRun:
    predictor: Predictor
    parameters: dict
    batch_size: int
    max_bad_examples: str
    where: str
    """The input, as the lines about skipped examples name it."""

    def predict(self, examples: Iterable[Example], total: int, lines: TextIO) -> Outcome:
        """Write every example's prediction line to `lines`, in the input's order."""
        outcome = Outcome(total)
        batch: list[tuple[Example, Any]] = []
        bar = tqdm(total=total, unit="example", desc="predicting", file=sys.stderr)
        with ThreadPoolExecutor(thread_name_prefix="prepare") as pool, bar:
            for example, prepared in self._prepared(pool, examples):
                try:
                    batch.append((example, prepared.result()))
                except InstanceError as error:
                    self._skip(example, str(error), outcome)
                    bar.update()
                    continue
                if len(batch) == self.batch_size:
                    self._write(batch, outcome, lines)
                    bar.update(len(batch))
                    batch = []
            self._write(batch, outcome, lines)
            bar.update(len(batch))
        return outcome

    def _prepared(
        self, pool: ThreadPoolExecutor, examples: Iterable[Example]
    ) -> Iterator[tuple[Example, Future]]:
        pending: deque[tuple[Example, Future]] = deque()
        for example in examples:
            pending.append((example, pool.submit(self._prepare, example)))
            if len(pending) > BATCHES_AHEAD * self.batch_size:
                yield pending.popleft()
        yield from pending

    def _prepare(self, example: Example) -> Any:
        return self.predictor.prepare(example.instance())

    def _write(self, batch: list[tuple[Example, Any]], outcome: Outcome, lines: TextIO) -> None:
        if not batch:
            return
        predictions = self.predictor.predict([item for _, item in batch], self.parameters)
        for (example, _), prediction in zip(batch, predictions, strict=True):
            line: dict[str, Any] = {"id": example.id}
            if example.reference is not None:
                line["reference"] = example.reference
                outcome.scored.append((example.reference, prediction))
            line["prediction"] = prediction
            lines.write(json.dumps(line, ensure_ascii=False) + "\n")
        outcome.predicted += len(batch)

    def _skip(self, example: Example, reason: str, outcome: Outcome) -> None:
        outcome.skipped.append(str(example.id))
        tqdm.write(f"warning: skipped {example.id}: {reason}", file=sys.stderr)
        names = ", ".join(outcome.skipped[:NAMES_SHOWN])
        if len(outcome.skipped) > NAMES_SHOWN:
            names += ", ..."
        what = f"examples in {self.where}"
        check_limit(len(outcome.skipped), outcome.total, what, self.max_bad_examples, names)
