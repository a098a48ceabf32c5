"""Fixtures: offline demo assets, a Hub cache, a Cloud Storage emulator, and a guard that
nothing is written into the checkout. Plain helper functions are in tests/support/helpers.py."""

from __future__ import annotations

import csv
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

# Names that test modules not yet moved to tests.support.helpers import from here.
from tests.support.helpers import (  # noqa: F401
    DEMO_SPEECH_FLAGS,
    REPO_ROOT,
    TEXT_COLUMNS,
    free_port,
    prepare_speech_demo,
    run_trainer,
    speech_demo_in,
    trainer_env,
    warm_hub_cache,
)
from trainer.command_line import recipes as config_file
from trainer.data.sources import looks_like_path
from trainer.launcher import main as launch
from trainer.settings.run_config import DemoAssets
from trainer.tasks.speech_recognition.demo import build_tiny_whisper

CHECKOUT_LITTER_IGNORED = {".pytest_cache", "__pycache__", ".venv", ".ci-cache"}
"""Entries of the repository root that a test run may create: everything else a test
creates there fails the session (`pytest_sessionfinish`)."""
_ROOT_AT_START = pytest.StashKey[set]()


def pytest_sessionstart(session):
    """Record the repository root's entries; `pytest_sessionfinish` compares at the end."""
    session.config.stash[_ROOT_AT_START] = {entry.name for entry in REPO_ROOT.iterdir()}


def pytest_sessionfinish(session, exitstatus):
    """Fail the session if a test created a file or directory in the repository root
    (outputs, logs, caches: tests write under their tmp_path). Under pytest-xdist the
    controlling process judges, after every worker has ended: a worker's verdict would not
    reach the exit status."""
    before = session.config.stash.get(_ROOT_AT_START, None)
    if before is None or hasattr(session.config, "workerinput"):
        return
    created = sorted(
        {entry.name for entry in REPO_ROOT.iterdir()} - before - CHECKOUT_LITTER_IGNORED
    )
    if created:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"tests wrote into the repository root {REPO_ROOT}: {', '.join(created)}"
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_sep("!", message, red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def offline_hub_cache(tmp_path_factory) -> Path:
    """Tests never reach the Hugging Face Hub: HF_HUB_OFFLINE=1 for this process and every
    process it starts, and a hub cache holding a snapshot of each Hub id the shipped recipes
    name, as on a machine that downloaded them, so the launcher's hub check passes offline.
    """
    cache = tmp_path_factory.mktemp("hf-hub-cache")
    for recipe in config_file.RECIPES_DIR.glob("*.yaml"):
        content = yaml.safe_load(recipe.read_text()) or {}
        for kind, flag in (("model", "model_name_or_path"), ("dataset", "dataset_name")):
            if content.get(flag) and not looks_like_path(content[flag]):
                warm_hub_cache(cache, kind, content[flag])
    from huggingface_hub import constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        # this process imported huggingface_hub before: its offline switch is read then
        patch.setattr(constants, "HF_HUB_OFFLINE", True)
        patch.setenv("HF_HUB_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory) -> Path:
    """A TRAINER_CACHE_DIR of this test session (the launcher builds demo assets in it)."""
    return tmp_path_factory.mktemp("trainer-cache")


@pytest.fixture(scope="session")
def demo_assets(demo_cache) -> DemoAssets:
    """The demo's tiny Whisper (where the launcher's demo looks for it in `demo_cache`) and
    a small speech set in the demo set's layout whose words are tones, not espeak-ng's
    voices (tests/support/tiny_assets.py): built in about a second, for every test that needs a
    model and an audiofolder but not a model that learns English speech."""
    from tests.support.tiny_assets import write_tone_speech

    model_dir = speech_demo_in(demo_cache / "demo").model_dir
    if not model_dir.exists():
        scratch = model_dir.with_name(f".{model_dir.name}.partial")
        build_tiny_whisper(scratch)
        scratch.rename(model_dir)
    dataset_dir = demo_cache / "tone-speech"
    if not dataset_dir.exists():
        write_tone_speech(dataset_dir)
    return DemoAssets(model_dir=model_dir, dataset_dir=dataset_dir)


@pytest.fixture(scope="session")
def text_assets(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny BERT with a WordPiece tokenizer trained on the sentiment set, and that set."""
    from tests.support.tiny_assets import build_tiny_bert, sentiment_sentences, write_sentiment_csv

    root = tmp_path_factory.mktemp("text-assets")
    texts = [text for rows in sentiment_sentences().values() for text, _ in rows]
    build_tiny_bert(root / "bert", texts)
    write_sentiment_csv(root / "sentiment")
    return root / "bert", root / "sentiment"


@pytest.fixture(scope="session")
def image_assets(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny ViT and the colour set, plus two training files no decoder can read."""
    from tests.support.tiny_assets import build_tiny_vit, write_colour_images

    root = tmp_path_factory.mktemp("image-assets")
    build_tiny_vit(root / "vit")
    write_colour_images(root / "colours")
    red = root / "colours" / "train" / "red"
    (red / "not-an-image.png").write_bytes(b"this is text, not a PNG")
    whole = (red / "0000.png").read_bytes()
    (red / "truncated.png").write_bytes(whole[: len(whole) // 2])
    return root / "vit", root / "colours"


@pytest.fixture(scope="session")
def spoken_assets(demo_cache, demo_assets) -> DemoAssets:
    """The demo's own assets, as `python -m trainer` builds them: the same tiny Whisper and
    about a thousand clips synthesized with espeak-ng (15-25 s to build). For tests in
    which the model must learn real speech, or that check the synthesized set itself."""
    return prepare_speech_demo(demo_cache / "demo")


@pytest.fixture(scope="session")
def family_checkpoints(tmp_path_factory):
    """Whisper family name -> its tiny checkpoint (tests/support/whisper_families.py),
    built once."""
    from tests.support.whisper_families import FAMILIES, build_family_checkpoint

    built = {}

    def checkpoint(name: str) -> Path:
        if name not in built:
            folder = tmp_path_factory.mktemp("whisper") / name
            built[name] = build_family_checkpoint(FAMILIES[name], folder)
        return built[name]

    return checkpoint


COMMON_VOICE_COLUMNS = ["client_id", "path", "sentence", "up_votes", "down_votes", "age",
                        "gender", "accents", "locale", "segment"]  # fmt: skip


@pytest.fixture(scope="session")
def common_voice_dir(demo_assets, tmp_path_factory):
    """A Common Voice-style copy of the demo speech: 48 kHz MP3 clips and TSV splits.

    Sentences get quotes and an apostrophe, which Common Voice has and csv quoting breaks.
    """
    root = tmp_path_factory.mktemp("common-voice")
    (root / "clips").mkdir()
    splits = {"train": "train", "dev": "test", "test": "test"}
    jobs = []
    for tsv, source in splits.items():
        with (demo_assets.dataset_dir / source / "metadata.csv").open() as handle:
            rows = list(csv.DictReader(handle))
        with (root / f"{tsv}.tsv").open("w") as out:
            out.write("\t".join(COMMON_VOICE_COLUMNS) + "\n")
            for i, row in enumerate(rows[:6]):
                clip = f"common_voice_en_{tsv}_{i}.mp3"
                sentence = f'"{row["transcription"]}," she said, it\'s fine'
                values = ["c1", clip, sentence, "2", "0", "", "", "", "en", ""]
                out.write("\t".join(values) + "\n")
                jobs.append(
                    (demo_assets.dataset_dir / source / row["file_name"], root / "clips" / clip)
                )

    def to_mp3(job):
        wav, mp3 = job
        subprocess.run(
            ["ffmpeg", "-loglevel", "error", "-i", str(wav), "-ar", "48000", str(mp3)], check=True
        )

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(to_mp3, jobs))
    return root


@pytest.fixture(scope="session")
def checkout_sdist(tmp_path_factory) -> Path:
    """The sdist of this checkout, as `python -m trainer.jobspec --python_package` builds it."""
    from trainer.packaging import build_sdist, source_checkout

    return build_sdist(source_checkout(), tmp_path_factory.mktemp("sdist"))


@pytest.fixture(scope="session")
def gcs_emulator():
    """A running Cloud Storage emulator (with bucket `test-bucket`) for this test session."""
    from tests.support.gcs_emulator import running_emulator

    with running_emulator() as url:
        yield url


@pytest.fixture
def gcs(gcs_emulator, monkeypatch):
    """Point this process's storage client at the emulator; yield the emulator URL."""
    from trainer.storage import store as storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    storage._process_client.cache_clear()
    yield gcs_emulator
    storage._process_client.cache_clear()


@pytest.fixture
def dry_run(monkeypatch, capsys, tmp_path, text_assets):
    """`python -m trainer --task text-classification ... ARGS --dry-run` in-process, in an
    empty working directory; returns (exit code, stdout, stderr) and checks that nothing
    was written there (no output directory, no log)."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    for name in ("CLUSTER_SPEC", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    model_dir, dataset_dir = text_assets

    def run(*args: str, model: Path = model_dir) -> tuple[int, str, str]:
        argv = ["--task", "text-classification", "--model_name_or_path", str(model),
                "--dataset_name", str(dataset_dir), *TEXT_COLUMNS, "--learning_rate", "3e-3",
                *args, "--dry-run"]  # fmt: skip
        try:
            launch.main(argv)
            code = 0
        except SystemExit as exit_info:
            code = exit_info.code
        out, err = capsys.readouterr()
        assert list(workdir.iterdir()) == [], "a dry run writes nothing"
        return code, out, err

    return run


@pytest.fixture(scope="session")
def text_classifier(tmp_path_factory, text_assets) -> Path:
    """The tiny BERT with a negative/positive head: a delivered text-classification model."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    from tests.support.labelled_models import with_labelled_head

    return with_labelled_head(text_assets[0], tmp_path_factory.mktemp("text-model"),
                              BertForSequenceClassification, AutoTokenizer,
                              ["negative", "positive"])  # fmt: skip


@pytest.fixture(scope="module")
def text_predictor(text_classifier):
    """The delivered text classifier's predictor, as the server loads it (one per module: a
    server sets its gs:// prefixes on it)."""
    from trainer.tasks.served_model import load_predictor

    return load_predictor(text_classifier)


@pytest.fixture(scope="module")
def image_predictor(image_classifier):
    """The delivered image classifier's predictor, as the server loads it."""
    from trainer.tasks.served_model import load_predictor

    return load_predictor(image_classifier)


@pytest.fixture(scope="session")
def image_classifier(tmp_path_factory, image_assets) -> Path:
    """The tiny ViT with a head naming COLOURS: a delivered image-classification model."""
    from transformers import AutoImageProcessor, ViTForImageClassification

    from tests.support.labelled_models import COLOURS, with_labelled_head

    folder = tmp_path_factory.mktemp("image-model")
    return with_labelled_head(
        image_assets[0], folder, ViTForImageClassification, AutoImageProcessor, list(COLOURS)
    )
