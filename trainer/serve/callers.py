"""A request's work raced against its caller: when the caller disconnects (or the server's
deadline passes) first, the work is cancelled, so that nothing is generated for an answer
nobody reads (a queued instance leaves the queue; one in the continuous batching engine
leaves its batch at the next step)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

from fastapi import Request


class Dropped(Exception):
    """A request no longer waited for: its caller has gone, or it is past its deadline."""


async def waited_for(request: Request, work: Awaitable, deadline: float | None):
    """`work`'s result, or Dropped (and `work` cancelled: its instances leave the queue
    unpredicted) when the caller disconnects or `deadline` passes first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(caller_gone(request))
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    try:
        done, _ = await asyncio.wait({task, gone}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
    finally:
        gone.cancel()
    if task in done:
        return task.result()
    task.cancel()
    raise Dropped("the caller has gone" if gone in done else "it waited past the server's "
                  "--request_timeout_s")  # fmt: skip


async def caller_gone(request: Request) -> None:
    """Returns when the caller disconnects (the body has been read: the server's next message
    is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
