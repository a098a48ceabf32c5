"""What `python -m trainer.serve` answers beyond one clean request, on a real uvicorn
server on loopback with tiny real models: a batch prediction job's requests with bad
instances among good ones (replayed as Vertex AI sends and writes them), callers that leave
or wait too long, a batching loop that stops, raw bodies (rawPredict), and the gs:// prefixes
an instance may name. The clean contract: tests/unit/test_serve.py."""

from __future__ import annotations

import base64
import io
import json
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.batch_replay import replay
from tests.support.helpers import wait_until
from tests.support.labelled_models import COLOURS, png
from tests.support.served_app import serve, wait_ready
from trainer.serve.__main__ import read_prefixes


def test_a_batch_job_of_64_lines_with_3_bad_loses_no_good_instance(text_predictor, text_classifier):
    """64 jsonl lines, each with a `key` beside the instance (a job without instanceConfig
    sends the whole line), 3 of them bad in two different requests of 8: every good line's
    prediction is in predictions_*.jsonl, equal to a plain pipeline's, and nothing is in
    errors_*.jsonl; each bad line's prediction is an error saying why."""
    from transformers import pipeline

    lines = [{"key": f"review-{i}", "text": f"review {i} was {'great' if i % 3 else 'awful'}"}
             for i in range(64)]  # fmt: skip
    bad = {5: {"key": "review-5", "text": 5},
           6: {"key": "review-6", "text": "fine", "text_pari": "a misspelt field"},
           41: {"key": "review-41", "review": "no text field"}}  # fmt: skip
    for index, line in bad.items():
        lines[index] = line
    with serve(text_predictor) as url:
        wait_ready(url)
        predictions, errors = replay(url + "/predict", lines, batch_size=8)
    assert errors == []
    assert [line["instance"] for line in predictions] == lines
    plain = pipeline("text-classification", model=str(text_classifier))
    good = [i for i in range(64) if i not in bad]
    expected = plain([lines[i]["text"] for i in good])
    got = [predictions[i]["prediction"] for i in good]
    assert [p["label"] for p in got] == [e["label"] for e in expected]
    assert [p["score"] for p in got] == pytest.approx([e["score"] for e in expected], abs=1e-5)
    reasons = {i: predictions[i]["prediction"] for i in bad}
    assert reasons == {5: {"error": 'an instance needs "text" (a string)'},
                       6: {"error": 'an instance holds "text" and, for a pair, "text_pair" '
                                    "strings (not 'text_pari')"},
                       41: {"error": 'an instance needs "text" (a string)'}}  # fmt: skip


class HeldModel:
    """The model's forward pass held at its start until released (a torch forward hook on
    the real model), and the number of instances each forward pass was given."""

    def __init__(self, predictor) -> None:
        self.entered, self.released = threading.Event(), threading.Event()
        self.batches: list[int] = []
        self.hook = predictor.pipe.model.register_forward_pre_hook(self.hold, with_kwargs=True)

    def hold(self, _module, args, kwargs):
        tensor = kwargs.get("input_ids", args[0] if args else None)
        self.batches.append(int(tensor.shape[0]))
        self.entered.set()
        self.released.wait(60)

    def remove(self) -> None:
        self.released.set()
        self.hook.remove()


def logged(capsys, lines: list[dict]) -> list[dict]:
    """The JSON log lines printed since the last call, added to `lines`."""
    lines += [json.loads(line) for line in capsys.readouterr().out.splitlines()
              if line.startswith("{")]  # fmt: skip
    return lines


def queued(url: str) -> int:
    return httpx.get(url + "/health").json()["queued"]


def post(url: str, text: str, timeout: float = 120) -> httpx.Response:
    return httpx.post(url + "/predict", json={"instances": [text]}, timeout=timeout)


def test_a_request_whose_caller_has_gone_is_dropped_before_its_forward_pass(text_predictor, capsys):
    held = HeldModel(text_predictor)
    lines: list[dict] = []
    try:
        with serve(text_predictor) as url, ThreadPoolExecutor(1) as pool:
            wait_ready(url)
            first = pool.submit(post, url, "first")
            assert held.entered.wait(60)
            # a caller that sends its request and leaves before the answer
            address = urlsplit(url)
            body = json.dumps({"instances": ["gone"]}).encode()
            with socket.create_connection((address.hostname, address.port)) as caller:
                caller.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: "
                               b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                               % (len(body), body))  # fmt: skip
                wait_until(lambda: queued(url) == 1, 60, "the request to be queued")
            wait_until(lambda: any("dropped" in line["message"] for line in logged(capsys, lines)),
                       60, "the server to see the caller go")  # fmt: skip
            held.released.set()
            assert first.result().status_code == 200
            assert post(url, "after").status_code == 200
    finally:
        held.remove()
    assert held.batches == [1, 1], "first, then after: never the request whose caller left"
    dropped = [line for line in logged(capsys, lines) if "dropped" in line["message"]]
    assert dropped == [{"message": "request dropped before its forward pass",
                        "severity": "WARNING", "reason": "the caller has gone",
                        "instances": 1}]  # fmt: skip


def test_a_request_past_the_deadline_is_answered_504_and_never_reaches_the_model(
    text_predictor, capsys
):
    """The model busy past the deadline (1 s here, --request_timeout_s): the request in the
    forward pass and the one queued behind it are answered 504 at their deadline; the queued
    one's instance never reaches the model."""
    held = HeldModel(text_predictor)
    lines: list[dict] = []
    try:
        with serve(text_predictor, request_timeout=1.0) as url, ThreadPoolExecutor(2) as pool:
            wait_ready(url)
            first = pool.submit(post, url, "first")
            assert held.entered.wait(60)
            queued_one = pool.submit(post, url, "queued")
            answers = [first.result(), queued_one.result()]
            held.released.set()
            assert post(url, "after").status_code == 200
    finally:
        held.remove()
    assert [answer.status_code for answer in answers] == [504, 504]
    assert answers[1].json() == {"error": "dropped: it waited past the server's "
                                 "--request_timeout_s"}  # fmt: skip
    assert held.batches == [1, 1], "first, then after: never the queued one"
    reasons = [line["reason"] for line in logged(capsys, lines) if "dropped" in line["message"]]
    assert reasons == ["it waited past the server's --request_timeout_s"] * 2


def test_a_stopped_batching_loop_turns_health_to_503_with_one_line_saying_why(
    text_predictor, capsys, monkeypatch
):
    """The loop's log stream breaks (stdout closed under it, as a broken pipe would): the
    request whose batch was logged is answered, health turns 503, the log's one line says
    why, and further requests get 503 instead of waiting for a loop that is gone."""
    with serve(text_predictor) as url:
        wait_ready(url)
        broken = io.StringIO()
        broken.close()
        monkeypatch.setattr(sys, "stdout", broken)
        assert post(url, "fine").status_code == 200
        wait_until(lambda: httpx.get(url + "/health").status_code == 503, 60, "health 503")
        assert httpx.get(url + "/health").json() == {"status": "failed"}
        later = post(url, "later")
        monkeypatch.undo()
    assert later.status_code == 503
    assert later.json() == {"error": "the model is not serving (see the server's log)"}
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == ["error: the batching loop stopped: ValueError: I/O operation on closed "
                      "file; health answers 503 from now on"]  # fmt: skip


def test_raw_bodies_are_one_instance_with_parameters_in_the_query_string(
    text_predictor, image_predictor
):
    """rawPredict's body is the media itself: text/plain for text, image/* for images (its
    `top_k` in the query string), each answered as the same instance sent as JSON is."""
    picture = png(COLOURS["green"])
    with serve(text_predictor) as url:
        wait_ready(url)
        as_json = httpx.post(url + "/predict", json={"instances": ["a fine film"]}).json()
        raw = httpx.post(url + "/predict", content=b"a fine film",
                         headers={"Content-Type": "text/plain; charset=utf-8"})  # fmt: skip
        wrong = httpx.post(url + "/predict", content=picture,
                           headers={"Content-Type": "image/png"})  # fmt: skip
        not_utf8 = httpx.post(url + "/predict", content=b"\xff\xfe",
                              headers={"Content-Type": "text/plain"})  # fmt: skip
    assert raw.status_code == 200 and raw.json() == as_json
    assert wrong.status_code == 415
    assert wrong.json() == {"error": "this text-classification model takes application/json "
                            "or the media itself as text/plain, not image/png"}  # fmt: skip
    assert not_utf8.status_code == 400
    assert not_utf8.json()["instances"] == [{"index": 0, "error": "the body is not UTF-8 text"}]
    with serve(image_predictor) as url:
        wait_ready(url)
        as_json = httpx.post(url + "/predict", json={
            "instances": [{"image": {"b64": base64.b64encode(picture).decode()}}],
            "parameters": {"top_k": 2}}).json()  # fmt: skip
        raw = httpx.post(url + "/predict?top_k=2", content=picture,
                         headers={"Content-Type": "image/png"})  # fmt: skip
        bad_parameter = httpx.post(url + "/predict?top_k=two", content=picture,
                                   headers={"Content-Type": "image/png"})  # fmt: skip
    assert raw.status_code == 200 and raw.json() == as_json
    assert len(raw.json()["predictions"][0]["labels"]) == 2
    assert bad_parameter.status_code == 400
    assert bad_parameter.json() == {"error": "parameter 'top_k' must be int"}


def test_an_instance_reads_gs_objects_only_under_the_allowed_prefixes(
    image_predictor, gcs, tmp_path
):
    from trainer.storage.store import open_store

    folder = tmp_path / "media"
    folder.mkdir()
    (folder / "red.png").write_bytes(png(COLOURS["red"]))
    open_store("gs://test-bucket/callers").upload(folder)
    open_store("gs://test-bucket/private").upload(folder)
    allowed = ("gs://test-bucket/callers/",)
    instances = [{"image": "gs://test-bucket/callers/red.png"},
                 {"image": "gs://test-bucket/private/red.png"},
                 {"image": "gs://test-bucket/callers/../private/red.png"},
                 {"image": "gs://test-bucket/callersX/red.png"}]  # fmt: skip
    with serve(image_predictor, gcs_read_prefixes=allowed) as url:
        wait_ready(url)
        predictions = httpx.post(url + "/predict", json={"instances": instances}).json()[
            "predictions"]  # fmt: skip
    assert set(predictions[0]) == {"labels", "scores"}
    for refused, instance in zip(predictions[1:], instances[1:], strict=True):
        assert refused == {"error": f"{instance['image']} is not under a prefix this server "
                           "reads for its callers (--gcs_read_prefixes)"}  # fmt: skip


def test_the_allowed_prefixes_are_the_models_bucket_and_the_operators():
    assert read_prefixes("", "/models/local") == ()
    assert read_prefixes("", "gs://models/job/model") == ("gs://models/",)
    assert read_prefixes(" gs://in/clips , gs://other/", "gs://models/m") == (
        "gs://models/", "gs://in/clips/", "gs://other/")  # fmt: skip
    assert read_prefixes("gs://models/", "gs://models/m") == ("gs://models/",)
    for bad in ("s3://in", "gs://", "/gcs/in"):
        with pytest.raises(ValueError, match="is not gs://BUCKET"):
            read_prefixes(bad, "gs://models/m")
