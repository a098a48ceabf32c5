"""`python -m trainer.serve [MODEL_DIR_OR_GS_URI]`: serve a delivered model (docs/serving.md).

Without a model it serves `AIP_STORAGE_URI`, where Vertex AI puts a copy of the model's
artifactUri. The arguments are checked before the port opens (one `error:` line, exit 2);
the port then opens at once, for Vertex AI's liveness probe, while the model downloads (a
gs:// model: in parallel, every file's CRC32C verified, by the project's storage layer) and
loads; health answers 503 until one warm-up prediction has run, then 200. A model that
cannot be loaded ends the server with exit 1 and one `error:` line.
"""

from __future__ import annotations

import argparse
import os
import sys

from trainer.serve.contract import Contract
from trainer.serve.listening import opened
from trainer.tasks.served_model import (
    DEFAULT_MAX_BATCH_SIZE,
    GENERATION_ENGINES,
    checked_location,
)

DEFAULT_MAX_WAIT_MS = 10.0
DEFAULT_QUEUE_SIZE = 256
DEFAULT_MAX_REQUEST_BYTES = 10 * 2**20
"""Vertex AI's limit on dedicated and private endpoints (1.5 MB on a shared public one)."""
DEPLOYMENT_TIMEOUTS_S = {"shared": 50.0, "dedicated": 590.0, "batch": 0.0}
"""The default deadline (s) for what the server is deployed as: below a shared public
endpoint's 60 s and a dedicated endpoint's default 10 minutes (its `inferenceTimeout`, at
most 1 h, is set when the endpoint is created: raise --request_timeout_s with it), so that a
request past it is answered 504 and dropped before its forward pass while its caller still
waits; none of its own for a batch job (a long generation or clip is answered, not retried;
a caller that gives up is still noticed). 0: no deadline."""
DEFAULT_DEPLOYMENT = "shared"
BATCHING_STOPPED = "the server ends (exit 1), for Vertex AI to start the container again"
"""What one process does when its batching loop stops: a server whose health stayed 503
would keep its open port, which is all Vertex AI's liveness check looks at, and never serve
again (`--workers N` starts another worker instead)."""


def parser(env) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer.serve",
        description="Serve a model this project delivered on Vertex AI's prediction contract.",
    )
    p.add_argument("model", nargs="?", help="a local model folder or gs:// URI (default: "
                   "$AIP_STORAGE_URI)")  # fmt: skip
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, help="default: $AIP_HTTP_PORT, else 8080; 0: any free "
                   "port, said on the first line")  # fmt: skip
    p.add_argument("--max_batch_size", type=int,
                   default=int(env.get("SERVE_MAX_BATCH_SIZE", DEFAULT_MAX_BATCH_SIZE)),
                   help="instances in one forward pass ($SERVE_MAX_BATCH_SIZE)")  # fmt: skip
    p.add_argument("--max_wait_ms", type=float,
                   default=float(env.get("SERVE_MAX_WAIT_MS", DEFAULT_MAX_WAIT_MS)),
                   help="how long a batch waits for more instances after its first is "
                        "ready; past it, only for requests already being decoded, at most a "
                        "quarter of a forward pass ($SERVE_MAX_WAIT_MS)")  # fmt: skip
    p.add_argument("--queue_size", type=int,
                   default=int(env.get("SERVE_QUEUE_SIZE", DEFAULT_QUEUE_SIZE)),
                   help="instances that may wait; beyond, 503 ($SERVE_QUEUE_SIZE)")  # fmt: skip
    p.add_argument("--max_request_bytes", type=int,
                   default=int(env.get("SERVE_MAX_REQUEST_BYTES", DEFAULT_MAX_REQUEST_BYTES)),
                   help="larger bodies get 413 ($SERVE_MAX_REQUEST_BYTES)")  # fmt: skip
    p.add_argument("--deployment", default=env.get("SERVE_DEPLOYMENT", DEFAULT_DEPLOYMENT),
                   help="what the server is deployed as, which sets the default "
                        "--request_timeout_s: shared (a shared public endpoint, 50 s), "
                        "dedicated (a dedicated endpoint, 590 s) or batch (a batch "
                        "prediction job, none) ($SERVE_DEPLOYMENT)")  # fmt: skip
    timeout = env.get("SERVE_REQUEST_TIMEOUT_S")
    p.add_argument("--request_timeout_s", type=float,
                   default=float(timeout) if timeout else None,
                   help="a request not answered by then gets 504 and is dropped before its "
                        "forward pass; 0: no limit (default: --deployment's) "
                        "($SERVE_REQUEST_TIMEOUT_S)")  # fmt: skip
    p.add_argument("--gcs_read_prefixes", default=env.get("SERVE_GCS_READ_PREFIXES", ""),
                   help="comma-separated gs:// buckets or folders an instance may name, read "
                        "with the server's credentials; the model's bucket is always one "
                        "($SERVE_GCS_READ_PREFIXES)")  # fmt: skip
    p.add_argument("--workers", type=int, default=int(env.get("SERVE_WORKERS", 1)),
                   help="model workers behind the one port, each with its own copy of the "
                        "model on the same device, its own batching and its share of the CPU "
                        "threads ($SERVE_WORKERS)")  # fmt: skip
    p.add_argument("--generation_engine",
                   default=env.get("SERVE_GENERATION_ENGINE", GENERATION_ENGINES[0]),
                   help="text generation only: continuous (transformers' continuous batching: "
                        "a request joins the running batch at its next decoding step and "
                        "leaves it when it ends; a seeded sample or a request for logprobs "
                        "still uses generate()) or generate (one generate() per batch of "
                        "requests with equal parameters) ($SERVE_GENERATION_ENGINE)")  # fmt: skip
    return p


def read_prefixes(given: str, location: str) -> tuple[str, ...]:
    """The gs:// prefixes instances may name: the model's bucket (a gs:// model's) and those
    given, each checked; ValueError for one that is not gs://BUCKET[/FOLDER]."""
    prefixes = [prefix.strip() for prefix in given.split(",") if prefix.strip()]
    for prefix in prefixes:
        if not prefix.startswith("gs://") or not prefix.removeprefix("gs://").split("/")[0]:
            raise ValueError(f"--gcs_read_prefixes: {prefix!r} is not gs://BUCKET[/FOLDER]")
    if location.startswith("gs://"):
        prefixes.insert(0, "gs://" + location.removeprefix("gs://").split("/")[0] + "/")
    return tuple(dict.fromkeys(prefix.rstrip("/") + "/" for prefix in prefixes))


def checked_model(model: str | None, contract: Contract) -> str:
    """The model's location (the argument, else Vertex AI's AIP_STORAGE_URI), or ValueError
    saying what is wrong with it."""
    location = model or contract.storage_uri
    if not location:
        raise ValueError("no model: name a folder or gs:// URI, or set AIP_STORAGE_URI")
    return checked_location(location)


def checked_arguments(args: argparse.Namespace, contract: Contract) -> tuple[str, tuple]:
    """The model's location and the gs:// prefixes instances may name, or ValueError (or
    FileNotFoundError) saying what is wrong with the command line."""
    location = checked_model(args.model, contract)
    for name in ("max_batch_size", "queue_size", "max_request_bytes", "workers"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be at least 1")
    if args.deployment not in DEPLOYMENT_TIMEOUTS_S:
        raise ValueError(f"--deployment (or SERVE_DEPLOYMENT) is {args.deployment!r}: one of "
                         f"{', '.join(DEPLOYMENT_TIMEOUTS_S)}")  # fmt: skip
    if args.generation_engine not in GENERATION_ENGINES:
        engines = ", ".join(GENERATION_ENGINES)
        raise ValueError(f"--generation_engine (or SERVE_GENERATION_ENGINE) is "
                         f"{args.generation_engine!r}: one of {engines}")  # fmt: skip
    if args.request_timeout_s is None:
        args.request_timeout_s = DEPLOYMENT_TIMEOUTS_S[args.deployment]
    if args.max_wait_ms < 0 or args.request_timeout_s < 0:
        raise ValueError("--max_wait_ms and --request_timeout_s must not be negative")
    return location, read_prefixes(args.gcs_read_prefixes, location)


def deadline_words(args: argparse.Namespace) -> str:
    """The deadline said on the server's first line, and where it comes from."""
    limit = f"{args.request_timeout_s:g} s" if args.request_timeout_s else "no limit"
    return f"request deadline {limit} (deployed as {args.deployment})"


def loader(location: str, engine: str):
    """What loads the predictor on the server's loading thread: downloads a gs:// model
    first, then loads and warms it, and starts its engine (`--generation_engine`)."""

    def load():
        from trainer.tasks.served_model import load_predictor, model_folder, started_engine

        predictor = load_predictor(model_folder(location))
        predictor.source = location
        predictor.warm_up()
        started_engine(predictor, engine)
        # Where it runs, said once: a GPU node whose driver torch cannot use would else
        # serve from the CPU without a word.
        pipe = predictor.pipe
        print(f"model ready: {predictor.task} on {pipe.device} in {pipe.model.dtype}", flush=True)
        return predictor

    return load


def main(argv: list[str] | None = None) -> None:
    env = os.environ
    args = parser(env).parse_args(argv)
    contract = Contract.from_environment(env)
    try:
        location, prefixes = checked_arguments(args, contract)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)

    if args.workers > 1:
        from trainer.serve.workers import serve_with_workers

        sys.exit(serve_with_workers(args, contract, location, prefixes))
    sock = opened(args.host, args.port, contract.port)
    if sock is None:
        sys.exit(2)
    import uvicorn

    from trainer.common.quiet import silence_known_noise
    from trainer.serve.app import make_app

    silence_known_noise()  # no progress bars or listed warnings in the endpoint's logs

    server: uvicorn.Server | None = None

    def stop_failed() -> None:
        server.should_exit = True
        failed.append(True)

    failed: list[bool] = []
    app = make_app(
        contract, loader(location, args.generation_engine), args.max_batch_size,
        args.max_wait_ms / 1000, args.max_request_bytes, args.queue_size,
        on_load_failure=stop_failed,
        request_timeout=args.request_timeout_s or None, gcs_read_prefixes=prefixes,
        model_location=location, on_batching_stopped=stop_failed,
        after_batching_stops=BATCHING_STOPPED,
    )  # fmt: skip
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host=args.host, port=port, log_level="warning", access_log=False)
    )
    print(f"serving {location} on {args.host}:{port} (predict {contract.predict_route}, "
          f"health {contract.health_route}); {deadline_words(args)}; instances may name "
          f"gs:// objects under: {', '.join(prefixes) or 'none'}; loading the model",
          flush=True)  # fmt: skip
    server.run(sockets=[sock])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
