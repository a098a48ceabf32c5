"""`python -m trainer.predict MODEL INPUT OUTPUT`: a delivered model's predictions over a
folder of media files, a `.jsonl` file of serving instances or a saved dataset, offline
(docs/serving.md). The model is loaded as `python -m trainer.serve` loads it, and every
instance goes through the server's own predictor (`prepare`, then `predict` a batch): what a
test set gets here is what the endpoint would answer.

OUTPUT (a local folder or gs:// URI) gets predictions.jsonl, one line per example in the
input's order, and, when the input holds references, test_results.json with the task's
metrics as training computes them. The command line, the input and OUTPUT are checked before
the model loads (one `error:` line, exit 2); more undecodable examples than
`--max_bad_examples` allows, or a model that does not load, end it with one `error:` line
and exit 1, writing nothing to OUTPUT.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainer.common.errors import StorageUnavailable, UserError, exit_with_error
from trainer.predict.examples import input_kind, read_examples
from trainer.settings.data_flags import DEFAULT_MAX_BAD_EXAMPLES, max_bad
from trainer.storage.store import GcsStore, Store, open_store
from trainer.tasks.load_failure import load_failure_line
from trainer.tasks.registry import task_spec
from trainer.tasks.served_model import (
    DEFAULT_MAX_BATCH_SIZE,
    checked_location,
    load_predictor,
    model_folder,
    task_of_model_dir,
)

PREDICTIONS = "predictions.jsonl"
RESULTS = "test_results.json"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer.predict",
        description="Predict over a test set offline with the serving code; score it when "
        "it holds references.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("model", help="a local model folder or gs:// URI, as python -m trainer.serve "
                   "takes it")  # fmt: skip
    p.add_argument("input", help="a folder of media files (audio, images or .txt files, with "
                   "an optional metadata.csv or metadata.jsonl), a .jsonl file of serving "
                   "instances, or a dataset saved with save_to_disk")  # fmt: skip
    p.add_argument("output", help="a local folder or gs:// URI for predictions.jsonl and "
                   "test_results.json")  # fmt: skip
    p.add_argument("--batch_size", type=int, default=DEFAULT_MAX_BATCH_SIZE,
                   help="instances in one forward pass")  # fmt: skip
    p.add_argument("--max_bad_examples", default=DEFAULT_MAX_BAD_EXAMPLES,
                   help="examples that cannot be read or decoded are skipped and counted, up "
                   "to this many (a count, or a share of all with a percent sign); past it "
                   "the run stops")  # fmt: skip
    p.add_argument("--split", default="test", help="the split of a saved DatasetDict")
    p.add_argument("--parameters", default="{}", help="the serving request's parameters, as "
                   'JSON (e.g. \'{"language": "en"}\', \'{"top_k": 1}\')')  # fmt: skip
    return p


@dataclass(frozen=True)
class Request:
    """The command line, checked."""

    model: str
    input: Path
    kind: str
    output: Store
    parameters: dict


def checked(args: argparse.Namespace) -> Request:
    """The checked command line, or ValueError / UserError saying what is wrong."""
    model = checked_location(args.model)
    if args.batch_size < 1:
        raise ValueError("--batch_size must be at least 1")
    max_bad(args.max_bad_examples, 0)
    try:
        parameters = json.loads(args.parameters)
    except ValueError:
        parameters = None
    if not isinstance(parameters, dict):
        raise ValueError(f"--parameters {args.parameters}: give a JSON object")
    path = Path(args.input).expanduser()
    return Request(model, path, input_kind(path), output_store(args.output), parameters)


def output_store(location: str) -> Store:
    """Where the files go: a gs:// location must take a write, a local one be a folder."""
    store = open_store(location)
    if isinstance(store, GcsStore):
        store.check_writable()
    elif store.root.exists() and not store.root.is_dir():
        raise ValueError(f"{location} is a file: OUTPUT is a folder")
    return store


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        request = checked(args)
    except (ValueError, FileNotFoundError, UserError) as error:
        exit_with_error(error, 2)
    except StorageUnavailable as error:
        exit_with_error(error, 1)

    from trainer.common.quiet import silence_known_noise

    silence_known_noise()  # the libraries' own bars and listed warnings: ours is the one bar
    predict(request, args)


def predict(request: Request, args: argparse.Namespace) -> None:
    from trainer.predict.offline import OfflineRun
    from trainer.tasks.instance_media import InstanceError

    folder = model_folder(request.model)
    try:
        task = task_spec(task_of_model_dir(folder))
        found = read_examples(request.input, request.kind, task, args.split)
    except (ValueError, FileNotFoundError, UserError) as error:
        exit_with_error(str(error).replace(str(folder), request.model), 2)
    try:
        predictor = load_predictor(folder)
    except Exception as error:  # noqa: BLE001 - said in one line, as the server says it
        exit_with_error(f"the model did not load: {load_failure_line(error, folder)}", 1)
    try:
        parameters = predictor.checked_parameters(request.parameters)
    except InstanceError as error:
        exit_with_error(f"--parameters: {error}", 2)
    pipe = predictor.pipe
    print(f"predicting {found.total} examples of {request.input} with {predictor.task} on "
          f"{pipe.device} in {pipe.model.dtype}", flush=True)  # fmt: skip
    run = OfflineRun(predictor, parameters, args.batch_size, args.max_bad_examples,
                     str(request.input))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="predictions-") as staging:
        try:
            with (Path(staging) / PREDICTIONS).open("w", encoding="utf-8") as lines:
                outcome = run.predict(found.examples, found.total, lines)
        except UserError as error:
            exit_with_error(error, 1)
        written = [PREDICTIONS]
        if outcome.scored:
            results = test_results(predictor.score(outcome.scored, parameters), outcome)
            (Path(staging) / RESULTS).write_text(json.dumps(results, indent=2) + "\n")
            written.append(RESULTS)
        request.output.upload(Path(staging), written)
    print(f"predicted {outcome.predicted} of {found.total} examples, skipped "
          f"{len(outcome.skipped)}: {' and '.join(written)} in {request.output.uri}",
          flush=True)  # fmt: skip


def test_results(metrics: dict[str, float], outcome) -> dict[str, float]:
    """The metrics with the `test_` prefix the Trainer gives a test set's, and how many
    predictions were scored (test_results.json, as `--do_predict` writes it)."""
    prefixed = {f"test_{name}": value for name, value in metrics.items()}
    return prefixed | {"test_samples": len(outcome.scored)}


if __name__ == "__main__":
    main()
