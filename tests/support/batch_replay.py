"""A batch prediction job's traffic, replayed against a server on loopback, and its output
written as Vertex AI writes it ("Get batch predictions from a custom trained model";
`OutputConfig.gcsDestination`): the input's lines `batch_size` at a time in one
`{"instances": [...], "parameters": modelParameters}` request each; an answered request's
instances as `{"instance", "prediction"}` lines of predictions_*.jsonl, a refused request's
as `{"instance", "error": {"code", "message"}}` lines of errors_*.jsonl (every instance of
it: the job cannot tell which one was bad)."""

from __future__ import annotations

import httpx


def replay(
    url: str, lines: list, batch_size: int, parameters: dict | None = None
) -> tuple[list[dict], list[dict]]:
    """The predictions_*.jsonl and errors_*.jsonl lines of a job over `lines` (one instance
    each), sent in order as a job with `manualBatchTuningParameters.batchSize` does."""
    predictions: list[dict] = []
    errors: list[dict] = []
    for start in range(0, len(lines), batch_size):
        instances = lines[start : start + batch_size]
        body = {"instances": instances}
        if parameters is not None:
            body["parameters"] = parameters
        answer = httpx.post(url, json=body, timeout=120)
        if answer.status_code == 200:
            answered = answer.json()["predictions"]
            assert len(answered) == len(instances), "one per instance, or the job fails"
            pairs = zip(instances, answered, strict=True)
            predictions += [{"instance": i, "prediction": p} for i, p in pairs]
        else:
            status = {"code": answer.status_code, "message": answer.text}
            errors += [{"instance": instance, "error": status} for instance in instances]
    return predictions, errors
