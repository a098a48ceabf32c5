"""How long a request for many tokens holds up short ones on the generation server.

The server batches generation requests with equal parameters into one `generate()` and runs
one batch at a time (docs/serving.md, "Generation"): it does not batch continuously, so a
short request that arrives while a long batch generates waits for that batch to end. This
measures what that costs, on bench/serve.py's small Llama (greedy; its generation config names
no end-of-turn token, so every answer is exactly as long as asked), one server, driven in
turns:

1. `short alone`: `--short_clients` clients asking for `--short_tokens` tokens each;
2. `short beside long`: the same clients while `--long_clients` others ask for
   `--long_tokens` tokens each, back to back.

Per case: the short requests' p50 and p99 latency and requests/s, and the long ones'. The
ratio of the short requests' p99 beside long ones to their p99 alone is the hold-up.

    python bench/generation_lengths.py [--duration 20] [--cores 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve import SENTENCES, Server, build_small_llama, drive  # noqa: E402


def bodies(tokens: int) -> list[bytes]:
    """One-prompt requests asking for `tokens` new tokens."""
    parameters = {"max_new_tokens": tokens}
    return [json.dumps({"instances": [{"prompt": sentence}], "parameters": parameters}).encode()
            for sentence in SENTENCES]  # fmt: skip


def beside(server: Server, args: argparse.Namespace) -> tuple[dict, dict]:
    """The short clients' and the long clients' figures, driven at the same time."""
    budget = {"duration": args.duration}
    results: dict[str, dict] = {}

    def long_ones() -> None:
        results["long"] = drive(server, bodies(args.long_tokens), args.long_clients, budget)

    thread = threading.Thread(target=long_ones)
    thread.start()
    short = drive(server, bodies(args.short_tokens), args.short_clients, budget)
    thread.join()
    return short, results["long"]


def row(case: str, kind: str, tokens: int, clients: int, figures: dict) -> str:
    return (f"| {case} | {kind} ({tokens} tokens) | {clients} | {figures['per_second']:.2f} | "
            f"{figures['p50_ms']:,.0f} | {figures['p99_ms']:,.0f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per case")
    parser.add_argument("--cores", type=int, default=2, help="the server's torch threads")
    parser.add_argument("--short_tokens", type=int, default=8)
    parser.add_argument("--long_tokens", type=int, default=256)
    parser.add_argument("--short_clients", type=int, default=4)
    parser.add_argument("--long_clients", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        model_dir = Path(root) / "chat"
        build_small_llama(model_dir)
        server = Server(model_dir, args.cores, max_batch_size=8, max_wait_ms=10.0)
        try:
            server.wait_ready()
            alone = drive(server, bodies(args.short_tokens), args.short_clients,
                          {"duration": args.duration})  # fmt: skip
            short, long = beside(server, args)
        finally:
            server.stop()
    print("| case | requests | clients | requests/s | p50 (ms) | p99 (ms) |")
    print("|---|---|---|---|---|---|")
    print(row("short alone", "short", args.short_tokens, args.short_clients, alone))
    print(row("short beside long", "short", args.short_tokens, args.short_clients, short))
    print(row("short beside long", "long", args.long_tokens, args.long_clients, long))
    print(f"\nthe short requests' p99 beside long ones: {short['p99_ms'] / alone['p99_ms']:.1f}x "
          f"their p99 alone; p50 {short['p50_ms'] / alone['p50_ms']:.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
