"""How long a request for many tokens holds up short ones on the generation server, with
each of its generation engines (`--generation_engine`, docs/serving.md, "Continuous batching").

- `continuous`: transformers' continuous batching; a request joins the running batch at its
  next decoding step and leaves it when it ends.
- `generate`: requests with equal parameters batched into one `generate()`, one batch at a
  time, so that a short request that arrives while a long batch generates waits for it.

On bench/serve.py's small Llama (greedy; its generation config names no end-of-turn token, so
every answer is exactly as long as asked), one server per engine, one after the other, each
driven in turns:

1. `short alone`: `--short_clients` clients asking for `--short_tokens` tokens each;
2. `short beside long`: the same clients while `--long_clients` others ask for
   `--long_tokens` tokens each, back to back.

Per engine and case: the short requests' p50 and p99 latency and requests/s, and the long
ones'. The ratio of the short requests' p50 (p99) beside long ones to their p50 (p99) alone is
the hold-up.

    python bench/generation_lengths.py [--duration 20] [--cores 2] [--engines continuous generate]
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


def row(engine: str, case: str, kind: str, tokens: int, clients: int, figures: dict) -> str:
    return (f"| {engine} | {case} | {kind} ({tokens} tokens) | {clients} | "
            f"{figures['per_second']:.2f} | {figures['p50_ms']:,.0f} | "
            f"{figures['p99_ms']:,.0f} |")  # fmt: skip


def measured(model_dir: Path, engine: str, args: argparse.Namespace) -> tuple[dict, dict, dict]:
    """The short clients' figures alone, then theirs and the long clients' beside each other,
    on a server of its own with `engine`."""
    server = Server(model_dir, args.cores, max_batch_size=8, max_wait_ms=10.0, engine=engine)
    try:
        server.wait_ready()
        alone = drive(server, bodies(args.short_tokens), args.short_clients,
                      {"duration": args.duration})  # fmt: skip
        return (alone, *beside(server, args))
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per case")
    parser.add_argument("--cores", type=int, default=2, help="the server's torch threads")
    parser.add_argument("--short_tokens", type=int, default=8)
    parser.add_argument("--long_tokens", type=int, default=256)
    parser.add_argument("--short_clients", type=int, default=4)
    parser.add_argument("--long_clients", type=int, default=2)
    parser.add_argument("--engines", nargs="+", default=["continuous", "generate"],
                        choices=["continuous", "generate"])  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        model_dir = Path(root) / "chat"
        build_small_llama(model_dir)
        results = {engine: measured(model_dir, engine, args) for engine in args.engines}
    print("| engine | case | requests | clients | requests/s | p50 (ms) | p99 (ms) |")
    print("|---|---|---|---|---|---|---|")
    for engine, (alone, short, long) in results.items():
        print(row(engine, "short alone", "short", args.short_tokens, args.short_clients, alone))
        print(row(engine, "short beside long", "short", args.short_tokens, args.short_clients,
                  short))  # fmt: skip
        print(row(engine, "short beside long", "long", args.long_tokens, args.long_clients,
                  long))  # fmt: skip
    print()
    for engine, (alone, short, _) in results.items():
        p50, p99 = short["p50_ms"] / alone["p50_ms"], short["p99_ms"] / alone["p99_ms"]
        print(f"{engine}: the short requests' p50 beside long ones {p50:.1f}x their p50 "
              f"alone; p99 {p99:.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
