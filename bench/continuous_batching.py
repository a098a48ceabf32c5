"""transformers' own continuous batching (`model.init_continuous_batching()`, transformers 5.x)
on bench/serve.py's small Llama, driven as bench/generation_lengths.py drives the server: a
short request beside long ones, without a server around the engine.

Clients are threads that submit one request at a time to the engine's manager and wait for
it (greedy, every answer exactly as long as asked), in two turns of `--duration` seconds:

1. `short alone`: `--short_clients` clients asking for `--short_tokens` tokens each;
2. `short beside long`: the same while `--long_clients` others ask for `--long_tokens`.

And, for the lone client, one request at a time through a plain `model.generate()`. The
answers of both engines are compared token for token first (greedy: they must be equal).

    python bench/continuous_batching.py [--duration 10] [--cores 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve import SENTENCES, build_small_llama  # noqa: E402


def engine_request(manager, ids: list[int], tokens: int) -> list[int]:
    request = manager.add_request(ids, max_new_tokens=tokens)
    for output in manager.request_id_iter(request):
        if output.is_finished():
            return list(output.generated_tokens)
    raise RuntimeError("the engine ended the request unfinished")


def drive(ask, prompts: list[list[int]], tokens: int, clients: int, until: float) -> dict:
    """Requests of `tokens` tokens from `clients` threads, back to back, until `until`."""
    latencies: list[float] = []

    def client(index: int) -> None:
        turn = index
        while time.monotonic() < until:
            started = time.monotonic()
            ask(prompts[turn % len(prompts)], tokens)
            latencies.append(time.monotonic() - started)
            turn += clients

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    latencies.sort()
    last = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    return {"count": len(latencies), "p50_ms": statistics.median(latencies) * 1000,
            "p99_ms": last * 1000}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per case")
    parser.add_argument("--cores", type=int, default=2, help="torch threads")
    parser.add_argument("--short_tokens", type=int, default=8)
    parser.add_argument("--long_tokens", type=int, default=256)
    parser.add_argument("--short_clients", type=int, default=4)
    parser.add_argument("--long_clients", type=int, default=2)
    args = parser.parse_args()

    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        ContinuousBatchingConfig,
        GenerationConfig,
    )

    from trainer.tasks.text_generation.continuous_batching import CPU_CACHE_TOKENS

    torch.set_num_threads(args.cores)
    with tempfile.TemporaryDirectory() as root:
        build_small_llama(Path(root) / "chat")
        tokenizer = AutoTokenizer.from_pretrained(Path(root) / "chat")
        model = AutoModelForCausalLM.from_pretrained(Path(root) / "chat")
    prompts = [tokenizer(sentence)["input_ids"] for sentence in SENTENCES]

    def generated(ids: list[int], tokens: int) -> list[int]:
        with torch.inference_mode():
            out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=tokens,
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, eos_token_id=None)  # fmt: skip
        return out[0, len(ids) :].tolist()

    config = GenerationConfig(max_new_tokens=args.long_tokens, do_sample=False, eos_token_id=-1)
    cache = ContinuousBatchingConfig(num_blocks=CPU_CACHE_TOKENS // 256)  # as the server's
    manager = model.init_continuous_batching(generation_config=config,
                                             continuous_batching_config=cache)  # fmt: skip
    manager.start()
    try:
        engine = lambda ids, tokens: engine_request(manager, ids, tokens)  # noqa: E731
        same = all(engine(ids, 16) == generated(ids, 16) for ids in prompts[:4])
        generated(prompts[0], 2)  # first-call costs
        lone = drive(generated, prompts, args.short_tokens, 1, time.monotonic() + args.duration)
        lone_engine = drive(engine, prompts, args.short_tokens, 1,
                            time.monotonic() + args.duration)  # fmt: skip
        alone = drive(engine, prompts, args.short_tokens, args.short_clients,
                      time.monotonic() + args.duration)  # fmt: skip
        until = time.monotonic() + args.duration
        longs: dict = {}
        thread = threading.Thread(target=lambda: longs.update(drive(
            engine, prompts, args.long_tokens, args.long_clients, until)))  # fmt: skip
        thread.start()
        beside = drive(engine, prompts, args.short_tokens, args.short_clients, until)
        thread.join()
    finally:
        manager.stop(block=True, timeout=30)
    print(f"greedy answers equal to generate(): {same}\n")
    print("| case | engine | requests | clients | requests/s | p50 (ms) | p99 (ms) |")
    print("|---|---|---|---|---|---|---|")
    rows = [("lone client", "generate()", args.short_tokens, 1, lone),
            ("lone client", "continuous", args.short_tokens, 1, lone_engine),
            ("short alone", "continuous", args.short_tokens, args.short_clients, alone),
            ("short beside long", "continuous", args.short_tokens, args.short_clients, beside),
            ("short beside long", "continuous", args.long_tokens, args.long_clients,
             longs)]  # fmt: skip
    for case, name, tokens, clients, figures in rows:
        print(f"| {case} | {name} | {tokens} tokens | {clients} | "
              f"{figures['count'] / args.duration:.2f} | {figures['p50_ms']:,.0f} | "
              f"{figures['p99_ms']:,.0f} |")  # fmt: skip
    print(f"\nthe short requests' p50 beside long ones: {beside['p50_ms'] / alone['p50_ms']:.1f}x "
          f"their p50 alone; p99 {beside['p99_ms'] / alone['p99_ms']:.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
