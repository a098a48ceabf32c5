"""`python -m trainer.serve`'s contract, on a real uvicorn server on loopback (a thread of
this process) with tiny models of each task: routes and port from Vertex AI's variables,
health 503 until the model is loaded, one prediction per instance in order, every form an
instance's media comes in, batching across concurrent requests, limits and errors that name
the instance. The server as its own process, on the demo's model, is
tests/processes/test_serve_runs.py's."""

from __future__ import annotations

import base64
import json
import socket
import threading
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.helpers import wait_until
from tests.support.labelled_models import COLOURS, png
from tests.support.served_app import LOCAL, running, serve, wait_ready
from trainer.serve.__main__ import checked_model, main
from trainer.serve.app import make_app
from trainer.serve.contract import Contract
from trainer.tasks.served_model import load_predictor


def test_routes_and_port_come_from_vertex_ais_variables(text_predictor):
    contract = Contract.from_environment({
        "AIP_HTTP_PORT": "7080", "AIP_PREDICT_ROUTE": "/v1/endpoints/1/deployedModels/2:predict",
        "AIP_HEALTH_ROUTE": "/v1/endpoints/1/deployedModels/2", "AIP_STORAGE_URI": "gs://b/m",
    })  # fmt: skip
    assert (contract.port, contract.storage_uri) == (7080, "gs://b/m")
    assert (LOCAL.port, LOCAL.predict_route, LOCAL.health_route) == (8080, "/predict", "/health")
    with serve(text_predictor, contract) as url:
        wait_ready(url, contract.health_route)
        answer = httpx.post(url + contract.predict_route, json={"instances": ["fine"]})
        assert answer.status_code == 200 and len(answer.json()["predictions"]) == 1
        assert httpx.post(url + "/predict", json={"instances": ["fine"]}).status_code == 404
        assert httpx.get(url + "/health").status_code == 404
        # A classifier answers none of OpenAI's routes.
        chat = {"model": "m", "messages": [{"role": "user", "content": "fine"}]}
        for answer in (httpx.post(url + "/v1/chat/completions", json=chat),
                       httpx.get(url + "/v1/models")):  # fmt: skip
            assert answer.status_code == 404
            assert answer.json()["error"]["message"].startswith(
                "this text-classification model answers no /v1/")  # fmt: skip


def test_health_is_503_until_the_model_is_loaded_then_200(text_predictor):
    loaded = threading.Event()

    def slow_load():
        loaded.wait(30)
        return text_predictor

    app = make_app(LOCAL, slow_load, 8, 0.01, 2**20, 64)
    with running(app) as url:
        assert httpx.get(url + "/health").status_code == 503
        assert httpx.post(url + "/predict", json={"instances": ["x"]}).status_code == 503
        loaded.set()
        wait_ready(url)
        health = httpx.get(url + "/health").json()
    assert {key: health[key] for key in ("status", "task", "queued")} == {
        "status": "ready", "task": "text-classification", "queued": 0}  # fmt: skip
    assert health["model"] == {
        "name": text_predictor.pipe.model.name_or_path, "base_model": None,
        "architecture": "BertForSequenceClassification", "labels": ["negative", "positive"],
        "media_key": "text", "raw_media_types": ["text/plain"]}  # fmt: skip


def test_a_model_that_fails_to_load_says_so_and_stays_unhealthy(capfd):
    failed = []

    def broken():
        raise OSError("model.safetensors is truncated")

    app = make_app(LOCAL, broken, 8, 0.01, 2**20, 64, on_load_failure=lambda: failed.append(1))
    with running(app) as url:
        wait_until(lambda: failed, 30, "the load to fail")
        assert httpx.get(url + "/health").json() == {"status": "failed"}
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("error:")]
    assert lines == ["error: the model did not load: OSError: model.safetensors is truncated"]


def test_text_predictions_come_one_per_instance_in_order_with_the_models_labels(
    text_predictor, text_classifier
):
    from transformers import pipeline

    texts = ["a great film", "awful", "not bad at all", "the plot", "loved it"]
    plain = pipeline("text-classification", model=str(text_classifier))
    expected = [plain(text)[0] for text in texts]
    third = {"b64": base64.b64encode(texts[2].encode()).decode()}
    instances = [{"text": texts[0]}, texts[1], third, {"text": texts[3]}, {"text": texts[4]}]
    with serve(text_predictor) as url:
        wait_ready(url)
        predictions = httpx.post(url + "/predict", json={"instances": instances}).json()
    got = predictions["predictions"]
    assert [p["label"] for p in got] == [e["label"] for e in expected]
    assert [p["score"] for p in got] == pytest.approx([e["score"] for e in expected], abs=1e-5)
    assert {p["label"] for p in got} <= {"negative", "positive"}


def test_a_pair_is_scored_as_a_pair_and_a_text_too_long_is_truncated_with_a_notice(
    text_predictor, text_classifier
):
    from transformers import pipeline

    plain = pipeline("text-classification", model=str(text_classifier))
    pair = {"text": "a great film", "text_pair": "it was awful"}
    long_text = " ".join(["good"] * 400)  # the tiny model takes 128 tokens
    with serve(text_predictor) as url:
        wait_ready(url)
        got = httpx.post(url + "/predict", json={"instances": [pair, {"text": long_text}]}).json()
    first, second = got["predictions"]
    expected = plain(pair)
    expected = expected[0] if isinstance(expected, list) else expected
    assert first["score"] == pytest.approx(expected["score"], abs=1e-5)
    assert "truncated" not in first and second["truncated"] is True


def test_an_image_comes_in_every_form_and_gets_the_same_prediction(image_predictor, gcs):
    from trainer.storage.store import open_store

    picture = png(COLOURS["blue"])
    encoded = base64.b64encode(picture).decode()
    folder = Path(__import__("tempfile").mkdtemp())
    (folder / "blue.png").write_bytes(picture)
    open_store("gs://test-bucket/serving-media").upload(folder)
    forms = [{"image": {"b64": encoded}}, {"image": encoded}, {"b64": encoded},
             {"image": f"data:image/png;base64,{encoded}"},
             {"image": "gs://test-bucket/serving-media/blue.png"}]  # fmt: skip
    with serve(image_predictor) as url:
        wait_ready(url)
        answer = httpx.post(url + "/predict", json={"instances": forms,
                                                    "parameters": {"top_k": 2}})  # fmt: skip
    predictions = answer.json()["predictions"]
    assert len(predictions) == 5 and all(p == predictions[0] for p in predictions)
    assert len(predictions[0]["labels"]) == 2 and set(predictions[0]["labels"]) <= set(COLOURS)
    assert predictions[0]["scores"] == sorted(predictions[0]["scores"], reverse=True)


def as_batch_prediction_sends(instances: list, batch_size: int) -> list[dict]:
    """The request bodies Vertex AI batch prediction posts to the container: `batch_size`
    instances (manualBatchTuningParameters.batchSize) in each `{"instances": [...]}`."""
    return [{"instances": instances[start : start + batch_size]}
            for start in range(0, len(instances), batch_size)]  # fmt: skip


def test_both_batch_prediction_inputs_get_the_same_predictions_for_the_same_media(
    image_predictor, gcs, tmp_path
):
    """A `jsonl` input sends each line's JSON as an instance; a `file-list` input (a text file
    of gs:// URIs) sends each file's bytes as `{"b64": ...}` ("Get batch predictions from a
    custom trained model"). Both are replayed, 2 instances a request, against the server."""
    from trainer.storage.store import open_store

    media = tmp_path / "media"
    media.mkdir()
    names = ["red", "green", "blue", "green", "red"]
    for index, name in enumerate(names):
        (media / f"{index}-{name}.png").write_bytes(png(COLOURS[name]))
    open_store("gs://test-bucket/batch-input").upload(media)
    store = open_store("gs://test-bucket/batch-input")
    file_list = [f"gs://test-bucket/batch-input/{index}-{name}.png"
                 for index, name in enumerate(names)]  # fmt: skip
    jsonl = "".join(
        json.dumps({"image": {"b64": base64.b64encode(png(COLOURS[name])).decode()}}) + "\n"
        for name in names
    )
    from_jsonl = [json.loads(line) for line in jsonl.splitlines()]
    from_file_list = []
    for uri in file_list:
        with store.open_read(uri.rsplit("/", 1)[1]) as stream:
            from_file_list.append({"b64": base64.b64encode(stream.read()).decode()})
    with serve(image_predictor) as url:
        wait_ready(url)

        def predictions(instances: list) -> list[dict]:
            answers = [httpx.post(url + "/predict", json=body, timeout=60)
                       for body in as_batch_prediction_sends(instances, batch_size=2)]  # fmt: skip
            assert [answer.status_code for answer in answers] == [200, 200, 200]
            return [p for answer in answers for p in answer.json()["predictions"]]

        by_line, by_file = predictions(from_jsonl), predictions(from_file_list)
    assert len(by_line) == len(by_file) == len(names)
    for line, file in zip(by_line, by_file, strict=True):
        # a request's instances may share a forward pass or not: equal to float precision
        assert set(line["labels"]) == set(COLOURS)
        assert dict(zip(file["labels"], file["scores"], strict=True)) == pytest.approx(
            dict(zip(line["labels"], line["scores"], strict=True)), abs=1e-5
        )


def test_bad_requests_get_json_naming_the_instance_and_the_server_keeps_serving(
    image_predictor, gcs
):
    good = {"image": {"b64": base64.b64encode(png(COLOURS["red"])).decode()}}
    with serve(image_predictor, max_request_bytes=50_000) as url:
        wait_ready(url)

        def post(body):
            answer = httpx.post(url + "/predict", content=body if isinstance(body, bytes)
                                else json.dumps(body))  # fmt: skip
            return answer.status_code, answer.json()

        not_an_image = {"image": {"b64": base64.b64encode(b"this is text").decode()}}
        missing = {"image": "gs://test-bucket/no/such.png"}
        code, body = post({"instances": [good, not_an_image, {"picture": "x"}, good, missing]})
        assert code == 200, body
        first, *reasons, fourth = [body["predictions"][i] for i in (0, 1, 2, 4, 3)]
        # the same image twice in one forward pass: equal to float precision (its rows may
        # take different kernels)
        assert set(first) == {"labels", "scores"} and first["labels"] == fourth["labels"]
        assert first["scores"] == pytest.approx(fourth["scores"], abs=1e-5)
        assert [set(reason) for reason in reasons] == [{"error"}] * 3
        assert "not an image" in reasons[0]["error"] and "'image'" in reasons[1]["error"]
        assert "gs://test-bucket/no/such.png" in reasons[2]["error"]
        assert "NotFound" in reasons[2]["error"]
        code, body = post({"instances": [not_an_image, missing]})
        assert code == 400 and body["error"] == "2 of 2 instances cannot be predicted"
        assert [item["index"] for item in body["instances"]] == [0, 1]
        assert "not an image" in body["instances"][0]["error"]
        assert post({"instances": []}) == (400, {"error": "instances is empty"})
        assert post(b"{not json") == (400, {"error": "the body is not JSON"})
        assert post({"inputs": [good]})[0] == 400
        assert post({"instances": [good], "parameters": {"top_k": "2"}}) == (
            400, {"error": "parameter 'top_k' must be int"})  # fmt: skip
        code, body = post({"instances": [good] * 100})
        assert code == 400 and "at most 64 instances" in body["error"], body
        code, body = post({"instances": [good] * 400})
        assert code == 413 and "50000 bytes" in body["error"]
        code, body = post({"instances": [good]})
        assert code == 200 and len(body["predictions"]) == 1


def test_concurrent_requests_share_forward_passes_and_each_gets_its_own_prediction(
    text_predictor, capsys
):
    texts = [f"review number {i} was {'great' if i % 2 else 'awful'}" for i in range(16)]
    with serve(text_predictor) as url:
        wait_ready(url)
        alone = [httpx.post(url + "/predict", json={"instances": [t]}).json()["predictions"][0]
                 for t in texts]  # fmt: skip
        capsys.readouterr()
        with serve(text_predictor, max_wait=0.5) as batched_url:
            wait_ready(batched_url)
            with ThreadPoolExecutor(16) as pool:
                together = list(pool.map(lambda t: httpx.post(
                    batched_url + "/predict", json={"instances": [t]}, timeout=60
                ).json()["predictions"][0], texts))  # fmt: skip
    assert [p["label"] for p in together] == [p["label"] for p in alone]
    assert [p["score"] for p in together] == pytest.approx([p["score"] for p in alone], abs=1e-5)
    batches = [json.loads(line) for line in capsys.readouterr().out.splitlines()
               if line.startswith("{")]  # fmt: skip
    sizes = [b["batch_size"] for b in batches if b["message"] == "prediction batch"]
    assert sum(sizes) == 16 and max(sizes) > 1, sizes
    assert all(set(b) == {"message", "severity", "batch_size", "queue_wait_ms", "latency_ms"}
               for b in batches)  # fmt: skip


def test_speech_is_transcribed_as_a_plain_pipeline_transcribes_it(demo_assets):
    from transformers import pipeline

    clip = next((demo_assets.dataset_dir / "test").glob("*.wav"))
    plain = pipeline("automatic-speech-recognition", model=str(demo_assets.model_dir))
    expected = plain(str(clip), chunk_length_s=30, ignore_warning=True)["text"].strip()
    encoded = base64.b64encode(clip.read_bytes()).decode()
    with serve(load_predictor(demo_assets.model_dir)) as url:
        wait_ready(url)
        answer = httpx.post(
            url + "/predict",
            json={"instances": [{"audio": {"b64": encoded}}, {"b64": encoded}]},
            timeout=60,
        )
        timed = httpx.post(url + "/predict", json={
            "instances": [{"audio": encoded}], "parameters": {"return_timestamps": True}},
            timeout=60)  # fmt: skip
        bad = httpx.post(url + "/predict", json={"instances": [{"audio": "bm90IGF1ZGlv"}]})
        unknown = httpx.post(
            url + "/predict",
            json={"instances": [{"audio": encoded}], "parameters": {"language": "klingon"}},
        )
        english = httpx.post(url + "/predict", json={"instances": [{"audio": encoded}],
                                                     "parameters": {"language": "English"}},
                             timeout=60)  # fmt: skip
        raw = httpx.post(url + "/predict?language=en", content=clip.read_bytes(),
                         headers={"Content-Type": "audio/wav"}, timeout=60)  # fmt: skip
    first, second = answer.json()["predictions"]
    assert first == second == {"text": expected}
    assert set(timed.json()["predictions"][0]) == {"text", "segments"}
    assert bad.status_code == 400
    assert bad.json()["instances"] == [{"index": 0, "error": "not audio that ffmpeg can decode"}]
    assert unknown.status_code == 400
    assert unknown.json() == {"error": "unknown language 'klingon' for Whisper"}
    assert english.status_code == 200 and len(english.json()["predictions"]) == 1
    assert raw.status_code == 200 and raw.json() == english.json(), "rawPredict: the clip itself"


def test_long_audio_is_chunked_and_timestamped_in_a_batch_as_a_plain_pipeline_does(
    demo_assets, tmp_path
):
    """A 70 s clip (three 30 s chunks, prepared on the pre-processing side) batched with a
    short one: the transcripts and segments `pipeline(chunk_length_s=30,
    return_timestamps=True)` gives for the same two clips, batched as the server batches."""
    from transformers import pipeline

    short = next((demo_assets.dataset_dir / "test").glob("*.wav"))
    with wave.open(str(short)) as clip:
        params, frames = clip.getparams(), clip.readframes(clip.getnframes())
    long = tmp_path / "long.wav"
    with wave.open(str(long), "wb") as clip:
        clip.setparams(params)
        size = 70 * params.framerate * params.sampwidth * params.nchannels
        clip.writeframes((frames * (size // len(frames) + 1))[:size])
    predictor = load_predictor(demo_assets.model_dir)
    clips = [long.read_bytes(), short.read_bytes()]
    prepared = [predictor.prepare({"b64": base64.b64encode(c).decode()}) for c in clips]
    assert [len(p.model_inputs) for p in prepared] == [3, 1]
    got = predictor.predict(prepared, {"return_timestamps": True})
    plain = pipeline("automatic-speech-recognition", model=str(demo_assets.model_dir))
    expected = plain(clips, batch_size=2, chunk_length_s=30, return_timestamps=True,
                     ignore_warning=True)  # fmt: skip
    assert [p["text"] for p in got] == [e["text"].strip() for e in expected]
    assert [[(s["start"], s["end"], s["text"]) for s in p["segments"]] for p in got] == [
        [(*c["timestamp"], c["text"].strip()) for c in e["chunks"]] for e in expected
    ]


def test_the_features_are_extracted_on_the_preprocessing_threads_not_the_models(
    text_predictor, image_predictor, demo_assets
):
    """Each task's real tiny model served, its threads watched as a request of two
    instances is answered: the tokenizer, the image processor, Whisper's feature extractor
    (their `__call__`, seen by a profile hook on the server's threads) run only on the
    pre-processing threads; the model's forward pass (a torch forward hook) only on the
    model's thread."""
    speech_predictor = load_predictor(demo_assets.model_dir)
    clip = next((demo_assets.dataset_dir / "test").glob("*.wav")).read_bytes()
    cases = [
        (text_predictor, text_predictor.pipe.tokenizer, {"text": "a great film"}),
        (image_predictor, image_predictor.pipe.image_processor,
         {"image": {"b64": base64.b64encode(png(COLOURS["red"])).decode()}}),
        (speech_predictor, speech_predictor.pipe.feature_extractor,
         {"audio": {"b64": base64.b64encode(clip).decode()}}),
    ]  # fmt: skip
    for predictor, extractor, instance in cases:
        extracting = type(extractor).__call__.__code__
        threads: dict[str, set[str]] = {"extractor": set(), "forward": set()}

        def watch(frame, event, _arg, extracting=extracting, threads=threads):
            if event == "call" and frame.f_code is extracting:
                threads["extractor"].add(threading.current_thread().name)

        def forward(*_args, threads=threads):
            threads["forward"].add(threading.current_thread().name)

        hook = predictor.pipe.model.register_forward_hook(forward)
        threading.setprofile(watch)  # every thread started from here on: the server's
        try:
            with serve(predictor) as url:
                wait_ready(url)
                answer = httpx.post(url + "/predict", json={"instances": [instance] * 2},
                                    timeout=60)  # fmt: skip
        finally:
            threading.setprofile(None)
            hook.remove()
        assert answer.status_code == 200 and len(answer.json()["predictions"]) == 2
        extracting_on = {name.split("_")[0] for name in threads["extractor"]}
        forwarding_on = {name.split("_")[0] for name in threads["forward"]}
        assert (extracting_on, forwarding_on) == ({"prepare"}, {"model"}), (predictor.task, threads)


def test_the_model_is_checked_before_the_port_opens(tmp_path, text_classifier):
    with pytest.raises(ValueError, match="no model"):
        checked_model(None, LOCAL)
    with pytest.raises(ValueError, match="no config.json"):
        checked_model(str(tmp_path), LOCAL)
    assert checked_model(None, Contract(8080, "/p", "/h", str(text_classifier))) == str(
        text_classifier
    )
    assert checked_model("gs://bucket/model", LOCAL) == "gs://bucket/model"


def test_a_bad_command_line_is_one_error_line_and_exit_2(tmp_path, capsys):
    for argv, message in [([str(tmp_path)], f"error: {tmp_path} is not a model folder"),
                          (["gs://"], "error: gs:// names no bucket"),
                          (["gs://b/m", "--max_batch_size", "0"],
                           "error: --max_batch_size must be at least 1"),
                          (["gs://b/m", "--generation_engine", "vllm"],
                           "error: --generation_engine (or SERVE_GENERATION_ENGINE) is 'vllm': "
                           "one of continuous, generate")]:  # fmt: skip
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2
        assert capsys.readouterr().err.splitlines() == [message + (
            " (no config.json in it)" if "folder" in message else "")]  # fmt: skip


def test_a_port_that_cannot_be_bound_is_one_error_line_and_exit_2(capsys):
    """Bound before anything loads, by one process or by the workers' supervisor."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for workers in ("1", "2"):
            with pytest.raises(SystemExit) as stopped:
                main(["gs://b/m", "--host", "127.0.0.1", "--port", str(port), "--workers",
                      workers])  # fmt: skip
            assert stopped.value.code == 2
            assert capsys.readouterr().err.splitlines() == [
                f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
            ]


def test_an_english_only_whisper_refuses_a_language_and_takes_its_other_parameters(
    family_checkpoints,
):
    """A real family's English-only checkpoint (tiny.en's configuration and tokenizer):
    `language` would make generate() raise inside a shared batch; it is refused alone."""
    from trainer.tasks.instance_media import InstanceError

    predictor = load_predictor(family_checkpoints("tiny.en"))
    with pytest.raises(InstanceError, match="English-only model takes no 'language'"):
        predictor.checked_parameters({"language": "en"})
    assert predictor.checked_parameters({"return_timestamps": False}) == {
        "return_timestamps": False
    }
