"""trainer.serve's batcher on its own: which instances share a forward pass when requests
are sent together but decoded at different speeds (the server's tests, tests/unit/test_serve.py,
drive it through HTTP with real models)."""

from __future__ import annotations

import asyncio
import time

from trainer.serve.batching import Batcher

WINDOW_SECONDS = 0.01


def run_clients(
    decode_seconds: list[float], rounds: int, forward_seconds: float
) -> list[list[float]]:
    """Clients sending `rounds` requests back to back, each request one instance whose
    decoding takes its client's `decode_seconds`, to a model whose forward pass takes
    `forward_seconds`; the instances of every forward pass."""
    batches: list[list[float]] = []

    def forward(items: list, parameters: dict) -> list:
        time.sleep(forward_seconds)
        batches.append(items)
        return items

    async def scenario() -> None:
        batcher = Batcher(forward, max_batch_size=8, max_wait=WINDOW_SECONDS, queue_size=64,
                          log=lambda record: None)  # fmt: skip
        running = asyncio.create_task(batcher.run())

        async def client(seconds: float) -> None:
            for _ in range(rounds):
                with batcher.preparing({}):
                    await asyncio.sleep(seconds)  # decoding, on a pre-processing thread
                assert await batcher.predict([seconds], {}) == [seconds]

        await asyncio.gather(*(client(seconds) for seconds in decode_seconds))
        running.cancel()

    asyncio.run(scenario())
    return batches


def test_clients_sending_together_share_a_batch_though_their_decoding_outlasts_the_window():
    # Decoding takes 15 to 60 ms, longer than the 10 ms window: the first batch (no forward
    # pass timed yet, so nothing to wait for) closes without the slower clients. From then
    # on, the four are answered together and send together, and every batch waits for the
    # instances still being decoded (up to a quarter of the 0.8 s forward pass: 200 ms, room
    # for a loaded machine); the last holds the clients not done yet. Before, the first
    # split repeated for good: 1, 3, 1, 3, ...
    decode = [0.015, 0.03, 0.045, 0.06]
    batches = run_clients(decode, rounds=4, forward_seconds=0.8)
    middle = batches[1:-1]
    assert len(middle) >= 3 and all(sorted(batch) == decode for batch in middle), batches


def test_a_batch_does_not_wait_for_an_instance_decoded_longer_than_its_share_of_a_forward():
    # The third client's decoding (1.5 s) outlasts the model's allowed idle time (a quarter of
    # a 0.4 s forward pass): the other two are never held for it, and it always goes alone.
    batches = run_clients([0.015, 0.03, 1.5], rounds=2, forward_seconds=0.4)
    assert [batch for batch in batches if 1.5 in batch] == [[1.5], [1.5]], batches
    assert sorted(value for batch in batches for value in batch) == [0.015, 0.015, 0.03, 0.03,
                                                                      1.5, 1.5]  # fmt: skip
