"""The instances of every request, concurrent ones included, through one bounded queue into
one forward pass per batch.

A batch closes when it holds `max_batch_size` instances or `max_wait` seconds after its
first instance arrived, whichever comes first; instances whose requests asked for different
`parameters` never share a batch. Forward passes run on one thread of their own, so the
event loop keeps accepting requests (and answering health) while the model computes. A
full queue answers 503 at once instead of letting requests time out behind it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


class QueueFull(RuntimeError):
    """More instances wait than the queue holds: the server is overloaded, try again."""


@dataclass
class Waiting:
    item: Any
    parameters: dict
    future: asyncio.Future
    queued_at: float = field(default_factory=time.monotonic)

    @property
    def key(self) -> str:
        return json.dumps(self.parameters, sort_keys=True)


class Batcher:
    def __init__(
        self,
        forward: Callable[[list, dict], list],
        max_batch_size: int,
        max_wait: float,
        queue_size: int,
        log: Callable[[dict], None],
    ) -> None:
        self.forward, self.log = forward, log
        self.max_batch_size, self.max_wait = max_batch_size, max_wait
        self.queue: asyncio.Queue[Waiting] = asyncio.Queue(queue_size)
        self.model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        self.held_back: list[Waiting] = []

    async def predict(self, items: list, parameters: dict) -> list:
        """Each item's prediction, in order (a failure in its batch is raised here)."""
        loop = asyncio.get_running_loop()
        waiting = [Waiting(item, parameters, loop.create_future()) for item in items]
        if self.queue.maxsize - self.queue.qsize() < len(waiting):
            raise QueueFull(f"{self.queue.qsize()} instances are waiting; try again")
        for entry in waiting:
            self.queue.put_nowait(entry)
        return list(await asyncio.gather(*(entry.future for entry in waiting)))

    async def run(self) -> None:
        """Forever: gather a batch, run it on the model's thread, hand out the results."""
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            started = time.monotonic()
            try:
                results = await loop.run_in_executor(
                    self.model_thread, self.forward, [w.item for w in batch], batch[0].parameters
                )
            except Exception as error:  # noqa: BLE001 - every request of the batch is told
                for entry in batch:
                    if not entry.future.done():
                        entry.future.set_exception(error)
                results = None
            else:
                for entry, result in zip(batch, results, strict=True):
                    if not entry.future.done():
                        entry.future.set_result(result)
            self.log({
                "message": "prediction batch",
                "severity": "INFO" if results is not None else "ERROR",
                "batch_size": len(batch),
                "queue_wait_ms": round((started - batch[0].queued_at) * 1000, 1),
                "latency_ms": round((time.monotonic() - started) * 1000, 1),
            })  # fmt: skip

    async def _next_batch(self) -> list[Waiting]:
        first = self.held_back.pop(0) if self.held_back else await self.queue.get()
        batch, deadline = [first], first.queued_at + self.max_wait
        while len(batch) < self.max_batch_size:
            candidate = self._held_back_like(first.key)
            if candidate is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 and self.queue.empty():
                    break
                try:
                    candidate = (
                        self.queue.get_nowait()
                        if remaining <= 0
                        else await asyncio.wait_for(self.queue.get(), remaining)
                    )
                except (asyncio.TimeoutError, asyncio.QueueEmpty):
                    break
                if candidate.key != first.key:
                    self.held_back.append(candidate)  # the next batch starts with it
                    continue
            batch.append(candidate)
        return batch

    def _held_back_like(self, key: str) -> Waiting | None:
        for index, entry in enumerate(self.held_back):
            if entry.key == key:
                return self.held_back.pop(index)
        return None
