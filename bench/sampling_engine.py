"""What sampling costs a request in the server's continuous batching engines
(trainer/tasks/text_generation/continuous_batching.py), at a real vocabulary size, against
plain `generate()`, one request at a time in one process:

- greedy: `generate()`, the greedy engine (no logits processing), and the sampling engine
  given the one most likely token (its per-request top-k 1: what a greedy request would cost
  if one engine served both);
- sampled (temperature 0.7, top-p 0.9, top-k 50): `generate()` and the sampling engine.

transformers' per-request top-k and top-p sort the whole vocabulary at every step, where
`generate()`'s top-k takes only the k largest: the reason greedy requests have an engine of
their own. The model is a small Llama (4 layers of 256) with the vocabulary of `--vocab`
(Llama 3's 128,256 by default), random weights, 16 prompt tokens, `--tokens` new ones.

    python bench/sampling_engine.py [--vocab 128256] [--tokens 32] [--cores 2] [--rounds 9]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SAMPLED = {"temperature": 0.7, "top_p": 0.9, "top_k": 50}


def median_ms(ask: Callable[[], object], rounds: int) -> float:
    """The median of `rounds` timed calls, after two untimed."""
    for _ in range(2):
        ask()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        ask()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--cores", type=int, default=2, help="torch threads")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.tasks.text_generation.continuous_batching import GREEDY, ContinuousEngine

    torch.set_num_threads(args.cores)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=256, intermediate_size=688,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                         tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.update(do_sample=False, eos_token_id=None)
    ids, tokens = list(range(1, 17)), args.tokens

    def generated(**sampling) -> Callable[[], object]:
        def ask():
            with torch.inference_mode():
                return model.generate(input_ids=torch.tensor([ids]), max_new_tokens=tokens,
                                      attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                      do_sample=bool(sampling), **sampling)  # fmt: skip

        return ask

    def by_engine(engine: ContinuousEngine, arguments: dict) -> Callable[[], object]:
        return lambda: asyncio.run(engine.generated(ids, tokens, arguments))

    rows = [("greedy", "generate()", median_ms(generated(), args.rounds))]
    greedy = ContinuousEngine(model)
    rows.append(("greedy", "greedy engine", median_ms(by_engine(greedy, {}), args.rounds)))
    greedy.stop()
    sampling = ContinuousEngine(model, sampling=True)
    rows.append(("greedy", "sampling engine, top-k 1",
                 median_ms(by_engine(sampling, GREEDY), args.rounds)))  # fmt: skip
    rows.append(("sampled", "generate()", median_ms(generated(**SAMPLED), args.rounds)))
    rows.append(("sampled", "sampling engine",
                 median_ms(by_engine(sampling, SAMPLED), args.rounds)))  # fmt: skip
    sampling.stop()

    print(f"vocabulary {args.vocab}, {tokens} new tokens, {args.cores} torch threads, median of "
          f"{args.rounds}")  # fmt: skip
    print()
    print("| request | path | ms | vs generate() |")
    print("|---|---|---|---|")
    alone = {kind: ms for kind, path, ms in rows if path == "generate()"}
    for kind, path, ms in rows:
        print(f"| {kind} | {path} | {ms:,.0f} | {ms / alone[kind]:.2f}x |")


if __name__ == "__main__":
    main()
