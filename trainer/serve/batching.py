"""The instances of every request, concurrent ones included, through one bounded queue into
one forward pass per batch.

A batch closes when it holds `max_batch_size` instances or when its window has passed,
whichever comes first. The window is `max_wait` seconds after its first instance was ready,
or, when that instance had to wait for the model, after the model became free (then at most
`IDLE_SHARE` of the last forward pass). After the window, the batch still takes instances of
requests that arrived before it closed and are still being decoded, for as long as the
model's thread has then idled less than `IDLE_SHARE` of the last forward pass.

Why: requests sent together are not ready together. A clip's ffmpeg decode and log-mel take
tens of milliseconds, more than a 10 ms window, so four clients sending at once used to split
into batches of 1 and 3, or 2 and 2; and since the clients of one batch are answered and send
again together, the split then repeats for good (measured: a mean batch of 2.0 at 4 clients
on the demo's Whisper). Waiting for requests already in the server costs the model's thread
at most a quarter of a forward pass and saves it a whole one; a lone request, with nothing
else in the server, never waits past its window.

Instances whose requests asked for different `parameters` never share a batch. Forward
passes run on one thread of their own, so the event loop keeps accepting requests (and
answering health) while the model computes. A full queue answers 503 at once instead of
letting requests time out behind it. An instance whose request is no longer waiting for it
(its caller has gone, or it waited past the server's deadline: its future is cancelled) is
dropped when a batch is gathered, before any forward pass, and makes room for another.

A predictor may have an engine of its own (`Engine`: text generation's continuous batching,
trainer/tasks/text_generation/continuous_batching.py): the instances it takes go to it as they
come, awaited on the event loop, and never occupy the model's thread (they count against the
queue's size while it answers them); the others are batched here as above. If the engine
stops, the loop stops with it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

IDLE_SHARE = 0.25
"""The longest the model's thread waits, past a batch's own window, for instances on their
way, as a share of the last forward pass's time."""
ARRIVAL_POLL = 0.005
"""How often (s) a batch waiting for instances being decoded checks that they still are: a
request whose instance cannot be decoded is answered 400 and never queued."""


def parameters_key(parameters: dict) -> str:
    return json.dumps(parameters, sort_keys=True)


class Engine(Protocol):
    """What answers some instances by itself, a request joining its running batch at its next
    step (the predictor's `engine()`)."""

    def takes(self, item: Any, parameters: dict) -> bool:
        """Whether it answers this instance as the predictor's `predict` would."""

    async def answer(self, item: Any, parameters: dict) -> tuple[Any, dict]:
        """The instance's prediction, as `predict` gives it, and what to log of it."""

    async def run(self) -> None:
        """Returns or raises only when the engine has stopped."""

    def stop(self) -> None:
        """Stops it (the server is stopping): what it still holds is failed."""


class QueueFull(RuntimeError):
    """More instances wait than the queue holds: the server is overloaded, try again."""


class NotServing(RuntimeError):
    """The batching loop has stopped (the server is ending, for Vertex AI to start it
    again): nothing given to it now would be answered."""


@dataclass
class Waiting:
    item: Any
    parameters: dict
    future: asyncio.Future
    queued_at: float = field(default_factory=time.monotonic)

    @property
    def key(self) -> str:
        return parameters_key(self.parameters)


@dataclass(eq=False)
class Arrival:
    """A request whose instances are being decoded and pre-processed."""

    key: str
    at: float = field(default_factory=time.monotonic)


async def first_to_end(*work) -> None:
    """Runs `work` until one of them returns or raises (raised here); the others cancelled."""
    tasks = [asyncio.ensure_future(one) for one in work]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()


def hand_out(batch: list[Waiting], results: list) -> None:
    """Each result to its instance's request (an exception raised there), unless the request
    stopped waiting."""
    for entry, result in zip(batch, results, strict=True):
        if entry.future.done():
            continue
        if isinstance(result, Exception):
            entry.future.set_exception(result)
        else:
            entry.future.set_result(result)


class Batcher:
    def __init__(
        self,
        forward: Callable[[list, dict], list],
        max_batch_size: int,
        max_wait: float,
        queue_size: int,
        log: Callable[[dict], None],
        engine: Engine | None = None,
    ) -> None:
        self.forward, self.log, self.engine = forward, log, engine
        self.max_batch_size, self.max_wait = max_batch_size, max_wait
        self.queue: asyncio.Queue[Waiting] = asyncio.Queue(queue_size)
        self.model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        self.held_back: list[Waiting] = []
        self.arrivals: list[Arrival] = []
        self.last_forward = 0.0
        """Seconds the last batch's forward pass took (0 before the first)."""
        self.model_free_at = 0.0
        self.engine_holds = 0
        """Instances the engine is answering: they count against the queue's size too."""
        self.in_forward: list[Waiting] = []
        """The batch on the model's thread now."""
        self.stopped: BaseException | None = None
        """Why the loop stopped, once it has."""

    @contextmanager
    def preparing(self, parameters: dict) -> Iterator[None]:
        """Around the pre-processing of a request's instances: a batch about to close may
        wait for them."""
        arrival = Arrival(parameters_key(parameters))
        self.arrivals.append(arrival)
        try:
            yield
        finally:
            self.arrivals.remove(arrival)

    async def predict(self, items: list, parameters: dict | list[dict]) -> list:
        """Each item's prediction, in order (a failure in its batch is raised here);
        `parameters` the request's, or each item's own (items of other parameters go in other
        batches)."""
        return list(await self.submit(items, parameters))

    def submit(self, items: list, parameters: dict | list[dict]) -> asyncio.Future:
        """`predict`'s items queued (or handed to the engine) now, QueueFull raised now when
        they do not fit: a streamed answer is refused before its response starts. The
        future's result is their predictions; cancelling it drops them."""
        if self.stopped is not None:  # a request read and prepared while the loop stopped
            raise NotServing(f"the model is not serving: {self.stopped}")
        loop = asyncio.get_running_loop()
        each = parameters if isinstance(parameters, list) else [parameters] * len(items)
        engine = self.engine
        by_engine = [engine is not None and engine.takes(item, asked)
                     for item, asked in zip(items, each, strict=True)]  # fmt: skip
        waiting = self.queue.qsize() + self.engine_holds
        if self.queue.maxsize - waiting < len(items):
            raise QueueFull(f"{waiting} instances are waiting; try again")
        answers = []
        for item, asked, taken in zip(items, each, by_engine, strict=True):
            if taken:
                answers.append(self._by_engine(item, asked))
            else:
                entry = Waiting(item, asked, loop.create_future())
                self.queue.put_nowait(entry)
                answers.append(entry.future)
        return asyncio.gather(*answers)

    async def _by_engine(self, item: Any, parameters: dict) -> Any:
        started = time.monotonic()
        self.engine_holds += 1
        try:
            prediction, facts = await self.engine.answer(item, parameters)
        finally:
            self.engine_holds -= 1
        latency_ms = round((time.monotonic() - started) * 1000, 1)
        self.log({"message": "continuous batching prediction", "severity": "INFO",
                  "latency_ms": latency_ms, **facts})  # fmt: skip
        return prediction

    async def run(self) -> None:
        """Forever: gather a batch, run it on the model's thread, hand out the results. An
        error of the loop itself (not of a forward pass, which fails only its batch's
        requests) fails every instance still waiting and is raised: the server then stops
        saying it is healthy."""
        try:
            if self.engine is None:
                await self._batches()
            else:
                await first_to_end(self._batches(), self.engine.run())
                raise RuntimeError("the engine stopped")  # run() returned: it ended quietly
        except BaseException as error:
            self.stopped = error
            self.fail_waiting(error)
            raise

    async def _batches(self) -> None:
        while True:
            await self._one_batch()

    def fail_waiting(self, error: BaseException) -> None:
        """Every instance queued, held back or in the forward pass the loop stopped waiting
        for (the engine's end stops it there) gets `error` (a stopped loop answers them)."""
        if isinstance(error, asyncio.CancelledError):
            error = RuntimeError("the server is stopping")
        waiting = self.in_forward + self.held_back
        while not self.queue.empty():
            waiting.append(self.queue.get_nowait())
        for entry in waiting:
            if not entry.future.done():
                entry.future.set_exception(error)

    async def _one_batch(self) -> None:
        loop = asyncio.get_running_loop()
        batch = [entry for entry in await self._next_batch() if not entry.future.done()]
        if not batch:  # every instance's request stopped waiting while the batch gathered
            return
        started = time.monotonic()
        self.in_forward = batch
        try:
            results = await loop.run_in_executor(
                self.model_thread, self.forward, [w.item for w in batch], batch[0].parameters
            )
            if len(results) != len(batch):
                raise RuntimeError(f"{len(results)} predictions for {len(batch)} instances")
        except Exception as error:  # noqa: BLE001 - every request of the batch is told
            results = None
            hand_out(batch, [error] * len(batch))
        else:
            hand_out(batch, results)
        self.in_forward = []  # not reached when the loop is cancelled: `fail_waiting` answers it
        self.model_free_at = time.monotonic()
        self.last_forward = self.model_free_at - started
        self.log({
            "message": "prediction batch",
            "severity": "INFO" if results is not None else "ERROR",
            "batch_size": len(batch),
            "queue_wait_ms": round((started - batch[0].queued_at) * 1000, 1),
            "latency_ms": round((time.monotonic() - started) * 1000, 1),
        })  # fmt: skip

    async def _next_batch(self) -> list[Waiting]:
        first = await self._first()
        idle = IDLE_SHARE * self.last_forward
        if first.queued_at < self.model_free_at:  # it waited for the model: window from then
            deadline = self.model_free_at + min(self.max_wait, idle)
        else:
            deadline = first.queued_at + self.max_wait
        idle_until = max(deadline, time.monotonic()) + idle
        batch = [first]
        while len(batch) < self.max_batch_size:
            candidate = self._held_back_like(first.key)
            if candidate is None:
                candidate = await self._next_ready(first.key, deadline, idle_until)
                if candidate is None:
                    break
                if candidate.key != first.key:
                    self.held_back.append(candidate)  # the next batch starts with it
                    continue
            batch.append(candidate)
        return batch

    async def _next_ready(self, key: str, deadline: float, idle_until: float) -> Waiting | None:
        """The next ready instance: one queued already, or one that comes before the window
        closes (`deadline`), or after it one of the instances with these parameters whose
        requests arrived before it closed and are still being decoded, up to `idle_until`;
        None when there is nothing more to wait for."""
        while True:
            if not self.queue.empty():
                entry = self.queue.get_nowait()
                if entry.future.done():  # its request stopped waiting: not worth a slot
                    continue
                return entry
            now = time.monotonic()
            if now < deadline:
                timeout = deadline - now
            elif now < idle_until and self._on_their_way(key, deadline):
                timeout = min(idle_until - now, ARRIVAL_POLL)
            else:
                return None
            try:
                entry = await asyncio.wait_for(self.queue.get(), timeout)
            except asyncio.TimeoutError:
                continue
            if not entry.future.done():
                return entry

    def _on_their_way(self, key: str, deadline: float) -> bool:
        return any(arrival.key == key and arrival.at <= deadline for arrival in self.arrivals)

    async def _first(self) -> Waiting:
        """The instance a batch starts with: one held back, else the next queued, skipping
        those whose request stopped waiting."""
        while True:
            first = self.held_back.pop(0) if self.held_back else await self.queue.get()
            if not first.future.done():
                return first

    def _held_back_like(self, key: str) -> Waiting | None:
        self.held_back = [entry for entry in self.held_back if not entry.future.done()]
        for index, entry in enumerate(self.held_back):
            if entry.key == key:
                return self.held_back.pop(index)
        return None
