"""The demo's offline assets built by the programs that build them: speech synthesized by
espeak-ng (a few clips, not a thousand: cache reuse, interrupted and concurrent builds) and
DeepSpeed's CPU op compiled by `python -m trainer.build_cpu_ops`. The tokenizer, the tiny
model and the session's synthesized set: tests/unit/test_demo_assets.py.
"""

import subprocess
import sys
import threading

import pytest

from tests.support.helpers import (
    PERSISTENT_EXTENSIONS_DIR,
    REPO_ROOT,
    speech_demo_in,
)
from tests.support.helpers import prepare_speech_demo as prepare_demo_assets
from trainer.tasks.speech_recognition import demo as demo_assets_module
from trainer.tasks.speech_recognition.demo import default_clips, synthesize_speech_dataset


@pytest.fixture
def few_clips_build(monkeypatch):
    """prepare_demo_assets builds the demo set's first two clips of each split, not ~1,000:
    the build mechanics are the same, in a second instead of 20."""
    clips = {split: listed[:2] for split, listed in default_clips().items()}
    monkeypatch.setattr(demo_assets_module, "default_clips", lambda: clips)
    return clips


def test_synthesized_clips_differ_between_splits(tmp_path):
    synthesize_speech_dataset(tmp_path, {"train": ["red green blue"], "test": ["red green blue"]})
    train_wav = (tmp_path / "train" / "0000.wav").read_bytes()
    test_wav = (tmp_path / "test" / "0000.wav").read_bytes()
    assert train_wav != test_wav
    assert (tmp_path / "test" / "metadata.csv").read_text().splitlines() == [
        "file_name,transcription",
        "0000.wav,red green blue",
    ]


def test_prepare_demo_assets_reuses_the_cache(few_clips_build, tmp_path):
    built = prepare_demo_assets(tmp_path)
    weights = built.model_dir / "model.safetensors"
    first_wav = built.dataset_dir / "train" / "0000.wav"
    before = (weights.stat().st_mtime_ns, first_wav.stat().st_mtime_ns)

    again = prepare_demo_assets(tmp_path)

    assert again == built
    assert (weights.stat().st_mtime_ns, first_wav.stat().st_mtime_ns) == before


def test_interrupted_build_is_not_mistaken_for_a_complete_one(
    few_clips_build, tmp_path, monkeypatch
):
    failing_bin = tmp_path / "bin"
    failing_bin.mkdir()
    (failing_bin / "espeak-ng").write_text("#!/bin/sh\nexit 1\n")
    (failing_bin / "espeak-ng").chmod(0o755)
    cache = tmp_path / "cache"
    with monkeypatch.context() as broken:
        broken.setenv("PATH", f"{failing_bin}:/usr/bin:/bin")
        with pytest.raises(subprocess.CalledProcessError):
            prepare_demo_assets(cache)
    assert (speech_demo_in(cache).model_dir / "model.safetensors").exists()
    assert not speech_demo_in(cache).dataset_dir.exists()

    assets = prepare_demo_assets(cache)
    assert len(list((assets.dataset_dir / "train").glob("*.wav"))) == len(few_clips_build["train"])
    assert not [path for path in cache.iterdir() if path.name.endswith(".partial")]


def test_concurrent_callers_share_one_build(few_clips_build, tmp_path, monkeypatch):
    builds = []
    for name in ("build_tiny_whisper", "synthesize_speech_dataset"):
        real = getattr(demo_assets_module, name)

        def counted(target, real=real, name=name):
            builds.append(name)
            real(target)

        monkeypatch.setattr(demo_assets_module, name, counted)
    results, errors = [], []

    def call():
        try:
            results.append(prepare_demo_assets(tmp_path))
        except Exception as error:  # surfaced by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert results[0] == results[1]
    assert sorted(builds) == ["build_tiny_whisper", "synthesize_speech_dataset"], "built twice"
    assert (results[0].model_dir / "model.safetensors").exists()


def test_deepspeed_cpu_op_is_built_where_the_launcher_looks():
    """`make install` compiles DeepSpeed's CPU op (trainer.build_cpu_ops) into the directory
    that the launcher hands to the training processes (the same `torch_extensions_dir`
    rule), so no run compiles it again. Already built, this only loads it."""

    done = subprocess.run(
        [sys.executable, "-m", "trainer.build_cpu_ops"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"ready in {PERSISTENT_EXTENSIONS_DIR}" in done.stdout
    assert list(PERSISTENT_EXTENSIONS_DIR.glob("deepspeed_shm_comm/*.so")), "no compiled op"
