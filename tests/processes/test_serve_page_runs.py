"""`GET /` of `python -m trainer.serve`, the page to try a model, in a real browser: the server
as its own process on the demo's tiny Whisper, its predict route from `AIP_PREDICT_ROUTE`;
Debian's Chromium, headless, driven by Selenium through Debian's chromedriver (never one
Selenium Manager would download) shows which model is served, uploads a held-out clip and
reads the transcript off the page, which must be what a plain `pipeline()` transcribes, with
the time it took; then records from the microphone (Chromium's fake device, playing the same
clip), plays the recording back and has it transcribed."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import wave
from pathlib import Path

import httpx
import pytest

from tests.support.helpers import free_port, trainer_env, wait_until_healthy

pytestmark = pytest.mark.slow

PREDICT = "/v1/endpoints/1/deployedModels/2:predict"
HEALTH = "/v1/endpoints/1/deployedModels/2"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def chromium(profile: Path, monkeypatch, microphone: Path):
    """Headless Chromium from the OS packages, driven through their chromedriver; its
    microphone plays `microphone` (a WAV file), granted without a prompt."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for binary in (CHROMIUM, CHROMEDRIVER):
        assert binary.is_file(), f"{binary} is missing: apt-get install chromium chromium-driver"
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager, were it asked, stays offline
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     f"--user-data-dir={profile}", "--use-fake-ui-for-media-stream",
                     "--use-fake-device-for-media-stream",
                     f"--use-file-for-fake-audio-capture={microphone}",
                     "--autoplay-policy=no-user-gesture-required"):  # fmt: skip
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)


def test_the_page_transcribes_an_uploaded_clip_in_a_headless_browser(
    tmp_path, demo_assets, demo_cache, monkeypatch
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait
    from transformers import pipeline

    clip = sorted((demo_assets.dataset_dir / "test").glob("*.wav"))[0]
    plain = pipeline("automatic-speech-recognition", model=str(demo_assets.model_dir))
    expected = plain(str(clip), chunk_length_s=30, ignore_warning=True)["text"].strip()
    port = free_port()
    env = trainer_env(demo_cache, AIP_HTTP_PORT=str(port), AIP_PREDICT_ROUTE=PREDICT,
                      AIP_HEALTH_ROUTE=HEALTH)  # fmt: skip
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "trainer.serve", str(demo_assets.model_dir)],
        env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    browser = None
    try:
        wait_until_healthy(server, url + HEALTH, tmp_path / "serve.log")

        page = httpx.get(url + "/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert f'data-predict-route="{PREDICT}"' in page.text
        assert f'data-health-route="{HEALTH}"' in page.text
        assert "/predict" not in page.text and "/health" not in page.text  # no route of its own
        assert not re.search(r"(https?:)?//[\w.-]+\.\w", page.text), "loads nothing from elsewhere"
        assert "default-src 'none'" in page.headers["content-security-policy"]
        for elsewhere in ("/index.html", "/page.html", "/predict", "/health", "/v1/"):
            assert httpx.get(url + elsewhere).status_code == 404, elsewhere
        assert httpx.post(url + "/", json={"instances": [{}]}).status_code == 405
        assert httpx.get(url + PREDICT).status_code == 405

        browser = chromium(tmp_path / "chromium-profile", monkeypatch, clip)
        browser.get(url + "/")
        wait = WebDriverWait(browser, 120)
        wait.until(expected_conditions.visibility_of_element_located((By.ID, "file")))
        text_of = {name: browser.find_element(By.ID, name).text for name in (
            "status", "model-name", "model-architecture", "model-base")}  # fmt: skip
        assert text_of == {"status": "Task: speech-recognition",
                           "model-name": str(demo_assets.model_dir),
                           "model-architecture": "WhisperForConditionalGeneration",
                           "model-base": "not recorded in the model's folder"}  # fmt: skip
        assert not browser.find_element(By.ID, "model-labels").is_displayed()
        assert not browser.find_element(By.ID, "text").is_displayed()
        browser.find_element(By.ID, "file").send_keys(str(clip))
        playback = browser.find_element(By.ID, "playback")
        assert playback.is_displayed() and playback.get_attribute("src").startswith("blob:")
        browser.find_element(By.ID, "submit").click()
        result = browser.find_element(By.ID, "result")
        wait.until(lambda _: result.get_attribute("data-state") in ("done", "error"))
        shown = result.get_property("textContent")
        print(f"the page shows the transcript {shown!r}; a plain pipeline() gives {expected!r}")
        assert result.get_attribute("data-state") == "done", shown
        assert shown == expected and result.text == expected.strip()
        timing = browser.find_element(By.ID, "timing")
        assert re.fullmatch(r"answered in \d+ ms", timing.text), timing.text

        # the microphone: record (Chromium plays the clip into it), stop, play back, predict
        record, recording = (browser.find_element(By.ID, name) for name in ("record", "recording"))
        record.click()
        wait.until(lambda _: int(recording.get_attribute("data-parts") or 0) >= 8)  # 2 s in
        record.click()
        wait.until(lambda _: recording.text.startswith("recorded "))
        recorded = playback.get_attribute("src")
        assert recorded.startswith("blob:") and record.text == "Record from the microphone"
        assert browser.execute_script(
            "return document.getElementById('playback').play().then(() => true)")  # fmt: skip
        say_before = result.get_property("textContent")
        browser.find_element(By.ID, "submit").click()
        wait.until(lambda _: result.get_attribute("data-state") in ("done", "error"))
        heard = result.get_property("textContent")
        print(f"the recording is transcribed as {heard!r} (the upload: {say_before!r})")
        assert result.get_attribute("data-state") == "done", heard
        assert re.fullmatch(r"answered in \d+ ms", timing.text), timing.text

        server.send_signal(signal.SIGTERM)  # uvicorn shuts down, then ends by that signal
        assert server.wait(timeout=60) == -signal.SIGTERM
    finally:
        if browser is not None:
            browser.quit()
        if server.poll() is None:
            server.kill()
        log.close()
    output = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in output, output[-3000:]
    assert output.count('"batch_size": 1,') == 2  # each of the page's clips, one forward pass


def test_the_page_is_a_chat_with_a_served_language_model(tmp_path, monkeypatch):
    """A tiny Qwen2 (tests/support/chat_models.py): the page shows the chat fields, sends the
    conversation so far through the model's template, shows each answer growing piece by
    piece as the server streams it (/v1/chat/completions), and ends with the server's own JSON
    answer for the same request."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.support.chat_models import FAMILIES, save_family_model

    model = save_family_model(FAMILIES["qwen2"], tmp_path / "model")
    port = free_port()
    env = trainer_env(tmp_path / "cache", AIP_HTTP_PORT=str(port), AIP_PREDICT_ROUTE=PREDICT,
                      AIP_HEALTH_ROUTE=HEALTH)  # fmt: skip
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "trainer.serve", str(model)], env=env,
                              cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    browser = None

    def served(messages: list[dict]) -> dict:
        body = {"instances": [{"messages": messages}], "parameters": {"max_new_tokens": 8}}
        return httpx.post(url + PREDICT, json=body, timeout=60).json()["predictions"][0]

    try:
        wait_until_healthy(server, url + HEALTH, tmp_path / "serve.log")
        silence = tmp_path / "silence.wav"
        with wave.open(str(silence), "wb") as clip:
            clip.setnchannels(1), clip.setsampwidth(2), clip.setframerate(16_000)
            clip.writeframes(b"\0\0" * 16_000)
        browser = chromium(tmp_path / "chromium-profile", monkeypatch, silence)
        browser.get(url + "/")
        wait = WebDriverWait(browser, 120)
        wait.until(expected_conditions.visibility_of_element_located((By.ID, "message")))
        assert browser.find_element(By.ID, "status").text == "Task: text-generation"
        assert browser.find_element(By.ID, "model-architecture").text == "Qwen2ForCausalLM"
        assert not browser.find_element(By.ID, "file").is_displayed()
        tokens = browser.find_element(By.ID, "max-new-tokens")
        tokens.clear()
        tokens.send_keys("8")
        result = browser.find_element(By.ID, "result")
        # every text the result shows, in order (each assignment adds a new text node)
        browser.execute_script(
            "window.shown = []; new MutationObserver((records) => records.forEach((record) =>"
            " record.addedNodes.forEach((node) => window.shown.push(node.textContent))))"
            ".observe(document.getElementById('result'), {childList: true});"
        )
        asked: list[dict] = []
        for message in ("What is two plus two?", "And the capital of France?"):
            browser.find_element(By.ID, "message").send_keys(message)
            browser.find_element(By.ID, "submit").click()
            wait.until(lambda _: result.get_attribute("data-state") in ("done", "error"))
            shown = result.get_property("textContent")
            assert result.get_attribute("data-state") == "done", shown
            asked.append({"role": "user", "content": message})
            answer = served(asked)  # the same conversation, asked of the server directly
            ended = ("stopped at the token limit" if answer["finish_reason"] == "length"
                     else "ended")  # fmt: skip
            assert shown == f"{answer['text']}\n({answer['completion_tokens']} tokens, {ended})"
            growing = browser.execute_script("return window.shown.splice(0)")[1:-1]
            assert len(growing) >= 2, growing  # shown before the answer was whole
            assert all(answer["text"].startswith(text) for text in growing), growing
            assert growing == sorted(growing, key=len) and len(set(growing)) == len(growing)
            timing = browser.find_element(By.ID, "timing").text
            assert re.fullmatch(r"first words in \d+ ms, answered in \d+ ms", timing), timing
            asked.append({"role": "assistant", "content": answer["text"]})
            browser.execute_script("document.getElementById('result').dataset.state = ''")
        lines = [p.get_property("textContent") for p in
                 browser.find_elements(By.CSS_SELECTOR, "#conversation p")]  # fmt: skip
        assert lines == [("You: " if turn["role"] == "user" else "Model: ") + turn["content"]
                         for turn in asked]  # fmt: skip
    finally:
        if browser is not None:
            browser.quit()
        server.kill()
        log.close()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()
