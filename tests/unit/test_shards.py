"""`python -m trainer.shards`: local layouts become Parquet or webdataset shards with
embedded media and an index, locally and in Cloud Storage (the emulator), users' own tars
are indexed in place; bad input is one error line.

These cases call `trainer.shards.main` in this process (a subprocess costs seconds of
imports); the real command line, a success into Cloud Storage and a bad input, is run in
tests/processes/test_shards_runs.py."""

from __future__ import annotations

import csv
import io
import tarfile
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests.support.gcs_emulator import BUCKET
from tests.support.helpers import few_clips, image_task, make_shards_in_process, speech_task
from tests.support.tiny_assets import COLOURS, write_sentiment_csv
from trainer.data.shard_index import INDEX, KEY_COLUMN, read_index
from trainer.data.shard_reader import shard_split
from trainer.storage.store import open_store


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def made(code: int, capsys) -> None:
    """`make_shards_in_process` succeeded (else: what it printed on stderr)."""
    assert code == 0, capsys.readouterr().err[-3000:]


@pytest.fixture
def trainer_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINER_CACHE_DIR", str(tmp_path / "cache"))


def test_audiofolder_becomes_parquet_shards_with_the_audio_inside(
    demo_assets, tmp_path, trainer_cache, capsys
):
    target = tmp_path / "shards"
    code = make_shards_in_process(demo_assets.dataset_dir, target, "--task",
                                  "speech-recognition", "--text_column_name", "transcription",
                                  "--shard_size_mb", "1")  # fmt: skip
    made(code, capsys)

    index = read_index(open_store(str(target)))
    for split in ("train", "test"):
        with (demo_assets.dataset_dir / split / "metadata.csv").open() as handle:
            rows = list(csv.DictReader(handle))
        assert index.rows(split) == len(rows)
        assert len(index.splits[split]) > 1, "1 MB shards: both splits need several"
        keys, transcripts = [], []
        for shard in index.splits[split]:
            table = pq.read_table(target / shard.file)
            assert table.num_rows == shard.rows
            audio = table.column("audio").to_pylist()
            assert all(a["bytes"] and a["bytes"][:4] == b"RIFF" for a in audio), "not embedded"
            keys += table.column(KEY_COLUMN).to_pylist()
            transcripts += table.column("transcription").to_pylist()
        assert keys == [f"{split}/{i}" for i in range(len(rows))]
        assert transcripts == [row["transcription"] for row in rows]
    assert {"audio", "transcription", KEY_COLUMN} <= set(index.columns)
    assert index.task == "speech-recognition" and index.labels is None


def test_text_labels_are_recorded_for_streams(tmp_path, capsys):
    source = tmp_path / "sentiment"
    write_sentiment_csv(source)
    columns = ["--text_column_name", "sentence", "--label_column_name", "sentiment"]
    code = make_shards_in_process(
        source, tmp_path / "shards", "--task", "text-classification", *columns
    )
    made(code, capsys)
    index = read_index(open_store(str(tmp_path / "shards")))
    assert index.labels == {"sentiment": ["negative", "neutral", "positive"]}
    assert set(index.splits) == {"train", "test"}


def test_common_voice_directory(common_voice_dir, tmp_path, capsys):
    flags = ["--task", "speech-recognition", "--text_column_name", "sentence"]
    made(make_shards_in_process(common_voice_dir, tmp_path / "cv", *flags), capsys)
    index = read_index(open_store(str(tmp_path / "cv")))
    assert set(index.splits) == {"train", "validation", "test"}
    assert "path" not in index.columns and "audio" in index.columns


@pytest.mark.parametrize(
    ("layout", "args", "message"),
    [
        ("empty-dir", ["--task", "image-classification"], "is not an imagefolder"),
        ("sentiment", ["--task", "text-classification"], 'Column "text" (--text_column_name)'),
        ("header-only", ["--task", "text-classification"], "corresponds to no data"),
        ("sentiment", ["--task", "text-classification", "--shard_size_mb", "0"], "positive"),
    ],
)
def test_bad_input_is_one_error_line(tmp_path, layout, args, message, capsys):
    source = tmp_path / layout
    source.mkdir()
    if layout == "sentiment":
        write_sentiment_csv(source)
    if layout == "header-only":
        (source / "train.csv").write_text("text,label\n")
    code = make_shards_in_process(source, tmp_path / "out", *args)
    err = capsys.readouterr().err
    assert code == 2
    assert len(error_lines(err)) == 1 and message in error_lines(err)[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / INDEX).exists()


def test_a_metadata_file_that_is_not_utf8_is_named_before_any_split_is_read(
    demo_assets, tmp_path, capsys
):
    """The launcher's check of every metadata table (issue 33), made by trainer.shards too:
    otherwise `datasets` fails on the byte in whichever split it prepares first, naming no
    file."""
    source = few_clips(demo_assets, tmp_path / "speech", per_split=2)
    metadata = source / "train" / "metadata.csv"  # the header read is test's
    text = metadata.read_bytes()
    start = text.index(b"\n") + 1
    metadata.write_bytes(text[:start] + "caf\xe9".encode("latin-1") + text[start:])
    code = make_shards_in_process(source, tmp_path / "out", "--task", "speech-recognition",
                                  "--text_column_name", "transcription")  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and error_lines(err) == [
        f"error: {metadata} is not UTF-8: byte 0xe9 at offset {start + 3} (invalid "
        "continuation byte); save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)."
    ], err
    assert not (tmp_path / "out" / INDEX).exists()


def streamed(location: Path, split: str) -> list[dict]:
    index = read_index(open_store(str(location)))
    return list(shard_split(str(location), index, split, streaming=True))


def test_webdataset_shards_hold_the_clips_as_files_and_stream_as_parquet_does(
    demo_assets, tmp_path, trainer_cache, capsys
):
    """Demo speech as tars: `KEY.wav` (the source file) + `KEY.json` per sample, KEY the
    example's `__key__`; the same examples, audio and texts as the Parquet shards of the
    same source; a second run writes the same bytes."""
    source = few_clips(demo_assets, tmp_path / "speech", per_split=30)
    flags = ["--task", "speech-recognition", "--text_column_name", "transcription",
             "--shard_size_mb", "0.5"]  # fmt: skip
    for name, shard_format in (
        ("parquet", "parquet"),
        ("tar", "webdataset"),
        ("again", "webdataset"),
    ):
        made(make_shards_in_process(source, tmp_path / name, *flags, "--format", shard_format),
             capsys)  # fmt: skip
    parquet, tars = (read_index(open_store(str(tmp_path / name))) for name in ("parquet", "tar"))
    assert tars.features == parquet.features and tars.labels is None

    for split, shards in tars.splits.items():
        assert [s.rows for s in shards] == [s.rows for s in parquet.splits[split]]
        assert len(shards) > 1
        members = []
        for shard in shards:
            path = tmp_path / "tar" / shard.file
            assert shard.file.endswith(".tar") and path.stat().st_size == shard.bytes
            assert path.read_bytes() == (tmp_path / "again" / shard.file).read_bytes()
            with tarfile.open(path) as tar:
                members += tar.getmembers()
        with tarfile.open(tmp_path / "tar" / shards[0].file) as tar:
            first_clip = tar.extractfile(f"{split}/0.wav").read()
        assert first_clip == (source / split / "0000.wav").read_bytes()
        assert [m.name for m in members] == [
            f"{split}/{row}{extension}" for row in range(tars.rows(split))
            for extension in (".wav", ".json")
        ]  # fmt: skip
        assert {(m.mtime, m.uid, m.gid, m.uname, m.mode) for m in members} == {(0, 0, 0, "", 0o644)}

        expected, examples = (
            streamed(tmp_path / "parquet", split),
            streamed(tmp_path / "tar", split),
        )
        assert [(e["__key__"], e["transcription"]) for e in examples] == [
            (e["__key__"], e["transcription"]) for e in expected
        ]
        for mine, theirs in zip(examples, expected, strict=True):
            mine, theirs = mine["audio"].get_all_samples(), theirs["audio"].get_all_samples()
            assert mine.sample_rate == theirs.sample_rate and (mine.data == theirs.data).all()


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    """A tar as a user's own tools would make it (plain `tarfile`, members in order)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def flac_samples(demo_assets, split: str, rows: range) -> list[tuple[str, bytes]]:
    """`clipN.flac` + `clipN.txt` members from the demo's clips (encoded by torchcodec)."""
    from torchcodec.decoders import AudioDecoder
    from torchcodec.encoders import AudioEncoder

    with (demo_assets.dataset_dir / split / "metadata.csv").open() as handle:
        metadata = list(csv.DictReader(handle))
    members = []
    for row in rows:
        wav = demo_assets.dataset_dir / split / metadata[row]["file_name"]
        clip = AudioDecoder(str(wav)).get_all_samples()
        flac = AudioEncoder(clip.data, sample_rate=clip.sample_rate).to_tensor("flac")
        flac = flac.numpy().tobytes()
        text = metadata[row]["transcription"].encode()
        members += [(f"{split}/clip{row}.flac", flac), (f"{split}/clip{row}.txt", text)]
    return members


def index_in_bucket(local, task: str, columns: list[str], capsys):
    """Upload the tars under `local` to a fresh bucket path (the `gcs` emulator) and index
    them there with `python -m trainer.shards URI --index_only`; the URI and the index."""
    uri = f"gs://{BUCKET}/{uuid.uuid4().hex}/wds"
    open_store(uri).upload(local)
    code = make_shards_in_process(uri, "--index_only", "--task", task, *columns)
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    assert f"wrote {uri}/{INDEX}" in out
    return uri, read_index(open_store(uri))


def test_users_speech_tars_in_cloud_storage_are_indexed_in_place_and_streamed(
    demo_assets, tmp_path, gcs, trainer_cache, capsys
):
    """KEY.flac + KEY.txt tars, as the webdataset library writes them, in the bucket:
    `--index_only` reads each once and writes index.json beside them; the speech task
    streams train from them and loads test whole, with the extensions as column names."""
    from trainer.data.streams import POSITION, prepare_stream

    local = tmp_path / "wds"
    write_tar(local / "train-00000.tar", flac_samples(demo_assets, "train", range(0, 5)))
    write_tar(local / "train-00001.tar", flac_samples(demo_assets, "train", range(5, 9)))
    write_tar(local / "test" / "00000.tar", flac_samples(demo_assets, "test", range(3)))
    columns = ["--audio_column_name", "flac", "--text_column_name", "txt"]
    uri, index = index_in_bucket(local, "speech-recognition", columns, capsys)
    assert {
        split: [(s.file, s.rows) for s in shards] for split, shards in index.splits.items()
    } == {
        "train": [("train-00000.tar", 5), ("train-00001.tar", 4)],
        "test": [("test/00000.tar", 3)],
    }
    assert index.features == {
        "flac": {"_type": "Audio"},
        "txt": {"dtype": "string", "_type": "Value"},
        KEY_COLUMN: {"dtype": "string", "_type": "Value"},
    }
    task, _, processor = speech_task(demo_assets.model_dir, uri, *columns, "--streaming",
                                     "--max_steps", "1", "--eval_split_name", "test")  # fmt: skip
    train, evaluation = task.load_datasets(processor)
    examples = list(prepare_stream(train, seed=1, buffer_size=4, start=None))
    assert sorted(e[KEY_COLUMN] for e in examples) == sorted(f"train/clip{i}" for i in range(9))
    assert len(evaluation) == 3 and evaluation[0]["audio"]["sampling_rate"] == 16_000
    batch = task.data_collator(processor)([{k: v for k, v in ex.items() if k != POSITION}
                                           for ex in examples[:3]])  # fmt: skip
    assert batch["input_features"].shape[0] == 3 and batch["labels"].shape[0] == 3


def png_samples(prefix: str, count: int) -> list[tuple[str, bytes]]:
    """`KEY.png` + `KEY.cls` members: image i is a plain colour of class i % 3."""
    members = []
    for i in range(count):
        colour = list(COLOURS.values())[i % 3]
        image = io.BytesIO()
        Image.new("RGB", (40, 40), colour).save(image, format="PNG")
        members += [
            (f"{prefix}{i:04d}.png", image.getvalue()),
            (f"{prefix}{i:04d}.cls", b"%d" % (i % 3)),
        ]
    return members


def test_users_image_tars_are_indexed_with_their_label_values(tmp_path, gcs, capsys):
    """KEY.png + KEY.cls tars: splits from folder and file names, the class ids recorded as
    the label values, and the image task builds its head from them and streams."""
    from tests.support.tiny_assets import build_tiny_vit
    from trainer.data.streams import prepare_stream

    local = tmp_path / "wds"
    write_tar(local / "train" / "part-0.tar", png_samples("a", 9))
    write_tar(local / "train" / "part-1.tar", png_samples("b", 6))
    write_tar(local / "colours-valid-0.tar", png_samples("v", 3))
    columns = ["--image_column_name", "png", "--label_column_name", "cls"]
    uri, index = index_in_bucket(local, "image-classification", columns, capsys)
    assert (index.rows("train"), index.rows("validation")) == (15, 3)
    assert index.labels == {"cls": [0, 1, 2]} and index.features["png"] == {"_type": "Image"}

    build_tiny_vit(tmp_path / "vit")
    task = image_task(tmp_path / "vit", uri, *columns, "--streaming", "--max_steps", "1",
                      "--eval_split_name", "validation")  # fmt: skip
    _, processor = task.build_model_and_processor()
    assert task.labels.names == ("0", "1", "2")
    train, evaluation = task.load_datasets(processor)
    examples = list(prepare_stream(train, seed=1, buffer_size=4, start=None))
    assert sorted(e[KEY_COLUMN] for e in examples) == sorted(
        f"{p}{i:04d}" for p, n in (("a", 9), ("b", 6)) for i in range(n)
    )
    assert all(
        ex["image"].getpixel((0, 0)) == list(COLOURS.values())[ex["label"]] for ex in examples
    )
    assert len(evaluation) == 3


ONE_TAR = {"train-0.tar": [("a.flac", b"fLaC"), ("a.txt", b"hi")]}


@pytest.mark.parametrize(
    ("tars", "args", "message"),
    [
        ({}, [], "No .tar files under"),
        (ONE_TAR, ["--text_column_name", "sentence"],
         'Column "sentence" (--text_column_name) not found'),
        ({**ONE_TAR, "train-1.tar": [("b.flac", b"fLaC"), ("b.json", b'{"text": "hi"}')]},
         ["--text_column_name", "txt"], "every tar of a set must hold the same fields"),
        (ONE_TAR, ["elsewhere", "--text_column_name", "txt"], "SOURCE alone with --index_only"),
    ],
)  # fmt: skip
def test_bad_webdataset_sets_are_one_error_line(tmp_path, tars, args, message, capsys):
    source = tmp_path / "wds"
    source.mkdir()
    (source / "README.md").write_text("not a tar")
    for name, members in tars.items():
        write_tar(source / name, members)
    code = make_shards_in_process(source, *args, "--index_only", "--task",
                                  "speech-recognition", "--audio_column_name", "flac")  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert len(error_lines(err)) == 1 and message in error_lines(err)[0], err
    assert "Traceback" not in err
    assert not (source / INDEX).exists()
