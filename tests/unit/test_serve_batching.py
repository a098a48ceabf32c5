"""trainer.serve's batcher on its own: which instances share a forward pass when requests
are sent together but decoded at different speeds (the server's tests, tests/unit/test_serve.py,
drive it through HTTP with real models)."""

from __future__ import annotations

import asyncio
import time

from trainer.serve.batching import Batcher

FORWARD_SECONDS = 0.4
WINDOW_SECONDS = 0.01


def run_clients(decode_seconds: list[float], rounds: int) -> list[list[float]]:
    """Clients sending `rounds` requests back to back, each request one instance whose
    decoding takes its client's `decode_seconds`; the instances of every forward pass."""
    batches: list[list[float]] = []

    def forward(items: list, parameters: dict) -> list:
        time.sleep(FORWARD_SECONDS)
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
    # pass timed yet, so nothing to wait for) holds the fastest client alone. From then on,
    # the four are answered together and send together, and every batch waits for the
    # instances still being decoded (the last holds three: the fastest client is done).
    # Before, the split repeated for good: 1, 3, 1, 3, ...
    decode = [0.015, 0.03, 0.045, 0.06]
    batches = run_clients(decode, rounds=4)
    assert batches[0] == [0.015]
    assert [sorted(batch) for batch in batches[1:]] == [decode] * 3 + [decode[1:]], batches


def test_a_batch_does_not_wait_for_an_instance_decoded_longer_than_its_share_of_a_forward():
    # The third client's decoding (1.5 s) outlasts the model's allowed idle time (a quarter of
    # a 0.4 s forward pass): the other two are never held for it, and it always goes alone.
    batches = run_clients([0.015, 0.03, 1.5], rounds=2)
    assert [batch for batch in batches if 1.5 in batch] == [[1.5], [1.5]], batches
    assert sorted(value for batch in batches for value in batch) == [0.015, 0.015, 0.03, 0.03,
                                                                      1.5, 1.5]  # fmt: skip
