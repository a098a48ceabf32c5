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

Then time to the first streamed token: one client streaming chat completions of
`--stream_tokens` tokens back to back through the OpenAI Python SDK (`stream=True`), timing each
one's first content chunk and its end,

3. `stream alone`: that client alone;
4. `stream beside long`: the same while `--long_clients` others ask for `--long_tokens` tokens.

    python bench/generation_lengths.py [--duration 20] [--cores 2] [--engines continuous generate]
                                       [--stream_tokens 32] [--short_parameters JSON]

`--short_parameters '{"temperature": 0.7, "top_p": 0.9}'` makes the short requests samples
(as most chat clients send them), the long ones staying greedy.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve import SENTENCES, Server, build_small_llama, drive, percentile  # noqa: E402


def bodies(tokens: int, more: dict | None = None) -> list[bytes]:
    """One-prompt requests asking for `tokens` new tokens (and the parameters `more`)."""
    parameters = {"max_new_tokens": tokens, **(more or {})}
    return [json.dumps({"instances": [{"prompt": sentence}], "parameters": parameters}).encode()
            for sentence in SENTENCES]  # fmt: skip


def beside(server: Server, args: argparse.Namespace, measure: Callable[[], dict]
           ) -> tuple[dict, dict]:  # fmt: skip
    """`measure`'s figures and the long clients', driven at the same time."""
    results: dict[str, dict] = {}

    def long_ones() -> None:
        results["long"] = drive(server, bodies(args.long_tokens), args.long_clients,
                                {"duration": args.duration})  # fmt: skip

    thread = threading.Thread(target=long_ones)
    thread.start()
    figures = measure()
    thread.join()
    return figures, results["long"]


def streams(server: Server, tokens: int, duration: float) -> dict:
    """One client streaming chat completions of `tokens` tokens back to back for `duration`
    seconds through the OpenAI SDK: the p50 and p99 of each one's time to its first content
    chunk and to its end."""
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    first: list[float] = []
    whole: list[float] = []
    deadline = time.perf_counter() + duration
    while time.perf_counter() < deadline:
        sentence = SENTENCES[len(whole) % len(SENTENCES)]
        sent, first_at = time.perf_counter(), None
        for chunk in client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": sentence}], max_tokens=tokens,
            stream=True,
        ):  # fmt: skip
            if first_at is None and chunk.choices and chunk.choices[0].delta.content:
                first_at = time.perf_counter()
        if first_at is None:
            raise RuntimeError("a streamed answer had no content")
        first.append(first_at - sent)
        whole.append(time.perf_counter() - sent)
    client.close()
    return {"streams": len(whole),
            "first_p50_ms": percentile(first, 0.5) * 1000,
            "first_p99_ms": percentile(first, 0.99) * 1000,
            "whole_p50_ms": percentile(whole, 0.5) * 1000,
            "whole_p99_ms": percentile(whole, 0.99) * 1000}  # fmt: skip


def row(engine: str, case: str, kind: str, tokens: int, clients: int, figures: dict) -> str:
    return (f"| {engine} | {case} | {kind} ({tokens} tokens) | {clients} | "
            f"{figures['per_second']:.2f} | {figures['p50_ms']:,.0f} | "
            f"{figures['p99_ms']:,.0f} |")  # fmt: skip


def stream_row(engine: str, case: str, figures: dict) -> str:
    return (f"| {engine} | {case} | {figures['streams']} | {figures['first_p50_ms']:,.0f} | "
            f"{figures['first_p99_ms']:,.0f} | {figures['whole_p50_ms']:,.0f} | "
            f"{figures['whole_p99_ms']:,.0f} |")  # fmt: skip


def measured(model_dir: Path, engine: str, args: argparse.Namespace) -> dict[str, dict]:
    """On a server of its own with `engine`: the short clients' figures alone, then theirs and
    the long clients' beside each other; then the streaming client's alone and beside long
    ones."""
    server = Server(model_dir, args.cores, max_batch_size=8, max_wait_ms=10.0, engine=engine)
    try:
        server.wait_ready()
        short = bodies(args.short_tokens, args.short_parameters)
        alone = drive(server, short, args.short_clients, {"duration": args.duration})
        short_beside, long = beside(
            server, args, lambda: drive(server, short, args.short_clients,
                                        {"duration": args.duration}))  # fmt: skip
        stream_alone = streams(server, args.stream_tokens, args.duration)
        stream_beside, _ = beside(
            server, args, lambda: streams(server, args.stream_tokens, args.duration)
        )
        return {"alone": alone, "short": short_beside, "long": long,
                "stream alone": stream_alone, "stream beside": stream_beside}  # fmt: skip
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
    parser.add_argument("--short_parameters", type=json.loads, default={},
                        help='more parameters of the short requests, as JSON: '
                        '\'{"temperature": 0.7, "top_p": 0.9}\' samples them')  # fmt: skip
    parser.add_argument("--stream_tokens", type=int, default=32,
                        help="the streamed chat completions' max_tokens")  # fmt: skip
    parser.add_argument("--engines", nargs="+", default=["continuous", "generate"],
                        choices=["continuous", "generate"])  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        model_dir = Path(root) / "chat"
        build_small_llama(model_dir)
        results = {engine: measured(model_dir, engine, args) for engine in args.engines}
    print("| engine | case | requests | clients | requests/s | p50 (ms) | p99 (ms) |")
    print("|---|---|---|---|---|---|---|")
    for engine, got in results.items():
        print(row(engine, "short alone", "short", args.short_tokens, args.short_clients,
                  got["alone"]))  # fmt: skip
        print(row(engine, "short beside long", "short", args.short_tokens, args.short_clients,
                  got["short"]))  # fmt: skip
        print(row(engine, "short beside long", "long", args.long_tokens, args.long_clients,
                  got["long"]))  # fmt: skip
    print()
    for engine, got in results.items():
        alone, short = got["alone"], got["short"]
        p50, p99 = short["p50_ms"] / alone["p50_ms"], short["p99_ms"] / alone["p99_ms"]
        print(f"{engine}: the short requests' p50 beside long ones {p50:.1f}x their p50 "
              f"alone; p99 {p99:.1f}x")  # fmt: skip
    print()
    print(f"Streamed chat completions of {args.stream_tokens} tokens, one client:")
    print()
    print("| engine | case | streams | first token p50 (ms) | first token p99 (ms) "
          "| whole answer p50 (ms) | whole answer p99 (ms) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for engine, got in results.items():
        print(stream_row(engine, "stream alone", got["stream alone"]))
        print(stream_row(engine, "stream beside long", got["stream beside"]))
    print()
    for engine, got in results.items():
        alone, near = got["stream alone"], got["stream beside"]
        print(f"{engine}: time to first token beside long ones "
              f"{near['first_p50_ms'] / alone['first_p50_ms']:.1f}x its p50 alone; "
              f"p99 {near['first_p99_ms'] / alone['first_p99_ms']:.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
