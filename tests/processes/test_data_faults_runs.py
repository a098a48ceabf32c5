"""Damaged training data (issue 20's data faults) through the real command line: a shard
of the wrong size and a CSV that is not UTF-8 refused at launch, a damaged Parquet shard met
while streaming, undecodable streamed clips skipped up to the limit and stopped past it,
and the stream decoder imported in a fresh process. Each is either skipped and counted, or
stopped with one `error:` line naming the file, never trained on silently."""

from __future__ import annotations

import os
import re

import pytest

from tests.support.faulty_data import (
    BAD_SAMPLES,
    STREAMED_CLIPS,
    damaged,
    speech_shards_with_bad_clips,
)
from tests.support.helpers import (
    DEMO_SPEECH_FLAGS,
    run_trainer,
    start_trainer,
    trainer_env,
)
from tests.support.shard_sets import COLUMNS, make_sentiment_shards
from tests.support.tiny_assets import write_sentiment_csv


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


def test_the_launcher_refuses_a_shard_of_the_wrong_size_and_a_csv_that_is_not_utf8(
    tmp_path, text_assets
):
    """The real command line: one error line each, exit 2, nothing launched."""
    model_dir, _ = text_assets
    location = tmp_path / "shards"
    index = make_sentiment_shards(tmp_path, str(location), 0.00097)
    shard = location / index.splits["test"][0].file
    shard.write_bytes(shard.read_bytes()[:-100])
    latin = tmp_path / "latin"
    write_sentiment_csv(latin)
    text = (latin / "train.csv").read_bytes()
    offset = text.index(b"\n", 100) + 1
    (latin / "train.csv").write_bytes(
        text[:offset] + "Caf\xe9 sales".encode("latin-1") + text[offset:]
    )
    env = trainer_env(tmp_path / "cache")
    base = ["--task", "text-classification", "--model_name_or_path", str(model_dir), *COLUMNS,
            "--max_steps", "1", "--output_dir", "out"]  # fmt: skip
    for dataset, expected in [
        (location, f"error: Shard {shard} holds {index.splits['test'][0].bytes - 100} bytes"),
        (latin, f"error: {latin / 'train.csv'} is not UTF-8: byte 0xe9 at offset {offset + 3}"),
    ]:
        extra = ["--streaming", "true"] if dataset == location else []
        code, output = run_trainer([*base, "--dataset_name", str(dataset), *extra], tmp_path, env)
        assert code == 2, output[-3000:]
        assert len(error_lines(output)) == 1 and error_lines(output)[0].startswith(expected), (
            output[-3000:]
        )


@pytest.mark.slow
def test_a_run_streaming_a_damaged_parquet_shard_stops_naming_it(tmp_path, text_assets):
    """Random bytes inside a Parquet shard (same size: the launch check passes): the run
    stops when the shard has been read, with one error line naming it."""
    model_dir, _ = text_assets
    location = tmp_path / "shards"
    make_sentiment_shards(tmp_path, str(location), 0.00097)
    name = damaged(location, "parquet", "random bytes")
    code, output = run_trainer(
        ["--task", "text-classification", "--model_name_or_path", str(model_dir),
         "--dataset_name", str(location), *COLUMNS, "--streaming", "true", "--max_steps", "40",
         "--per_device_train_batch_size", "4", "--eval_strategy", "no", "--save_strategy", "no",
         "--max_seq_length", "16", "--output_dir", "out"],
        tmp_path, trainer_env(tmp_path / "cache"),
    )  # fmt: skip
    assert code == 1, output[-3000:]
    lines = error_lines(output)
    assert len(lines) == 1 and f"DataFault: shard {location}/{name} has CRC32C" in lines[0], output[
        -3000:
    ]
    assert "final model and processor saved" not in output


DECODER_IMPORTED = """
import pickle, sys
from datasets import Audio, Features, IterableDataset
from trainer.data.bad_examples import DecodedOrNamed, mark_undecodable
from trainer.tasks.speech_recognition.training import _decoder_seconds

assert "torchcodec" not in sys.modules, "imported before: the check below would prove nothing"
if sys.argv[1] == "made":
    rows = [{"audio": {"path": "a.wav", "bytes": b""}}]
    features = Features({"audio": Audio(decode=False)})
    stream = IterableDataset.from_generator(lambda: iter(rows), features=features)
    mark_undecodable(stream, "audio", _decoder_seconds)
else:
    pickle.loads(bytes.fromhex(sys.argv[2]))
print(sorted(name for name in ("torchcodec.decoders", "PIL.Image") if name in sys.modules))
"""


def test_a_streams_decoder_is_imported_before_its_threads_read_it(tmp_path):
    """`datasets` reads a stream's sources in threads that race on importing the decoder
    (bad_examples.DecodedOrNamed says how it fails); the module is imported where the
    stream's decoding is made, and where its pickle is loaded (a spawned loader worker),
    each in a fresh process that had not imported it."""
    import pickle
    import subprocess
    import sys

    from datasets import Audio

    from trainer.data.bad_examples import DecodedOrNamed
    from trainer.tasks.speech_recognition.training import _decoder_seconds

    pickled = pickle.dumps(DecodedOrNamed("audio", Audio(), _decoder_seconds)).hex()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_CACHE": str(tmp_path)}
    for how in (["made"], ["unpickled", pickled]):
        done = subprocess.run([sys.executable, "-c", DECODER_IMPORTED, *how], env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert "torchcodec.decoders" in done.stdout.splitlines()[-1], (how[0], done.stdout)


@pytest.mark.slow
def test_a_streamed_speech_run_skips_a_garbage_clip_up_to_the_limit(demo_assets, tmp_path):
    """The real command line, two loader workers per process: with room for the two bad
    training clips, two processes finish, the chief's lines counting both processes'
    skips from when they were read; with --max_bad_examples 0 the run stops with one line
    naming them, exit code 78. The two runs are independent: started together, each on its
    own port (start_trainer picks one) and cache."""
    shards = speech_shards_with_bad_clips(demo_assets, tmp_path)
    run = ["--model_name_or_path", str(demo_assets.model_dir), "--dataset_name", str(shards),
           *DEMO_SPEECH_FLAGS, "--streaming", "true", "--dataloader_num_workers", "2",
           "--max_steps", "4", "--per_device_train_batch_size", "4", "--logging_steps", "1",
           "--save_strategy", "no", "--generation_max_length", "4"]  # fmt: skip
    kept = start_trainer(
        [*run, "--nproc_per_node", "2", "--max_bad_examples", "2", "--eval_strategy", "no",
         "--do_eval", "true", "--stream_audit_dir", "audit", "--output_dir", "kept"],
        tmp_path, trainer_env(tmp_path / "cache-kept"), log_name="kept.log",
    )  # fmt: skip
    stopped = start_trainer(
        [*run, "--max_bad_examples", "0", "--eval_strategy", "no", "--output_dir", "stopped"],
        tmp_path, trainer_env(tmp_path / "cache-stopped"), log_name="stopped.log",
    )  # fmt: skip
    try:
        code, output = kept.finish()
    finally:
        stopped_code, stopped_output = stopped.finish()
    assert code == 0, output[-3000:]
    assert f"warning: skipped 1 of {STREAMED_CLIPS + 1} clips in split test of" in output
    lines = output.splitlines()
    steps = [line for line in lines if line.startswith(("step ", "training done"))]
    found = [re.search(r"\| skipped (\d) undecodable of (\d+) streamed$", line) for line in steps]
    counts = [int(match[1]) if match else 0 for match in found]
    assert len(steps) == 5 and counts == sorted(counts) and counts[-1] == 2, steps
    trained = sum(len(path.read_text().splitlines()) for path in (tmp_path / "audit").iterdir())
    # both processes' reads: what they trained on, and each skipped clip at least once
    assert int(found[-1][2]) >= trained + 2, (steps[-1], trained)
    assert any(re.match(rf"warning: skipped undecodable examples in the training stream "
                        rf"\(split train of {shards}\): ({BAD_SAMPLES})", line)
               for line in lines), output[-3000:]  # fmt: skip

    code, output = stopped_code, stopped_output
    assert code == 78, output[-3000:]
    (line,) = error_lines(output)
    assert re.match(
        rf"error: [12] of the \d+ examples read from the training stream .* "
        rf"--max_bad_examples 0 allows \(0\); first: ({BAD_SAMPLES}).*; (the newest complete "
        rf"checkpoint is stopped/checkpoint-\d+, where a restart resumes|there is no "
        rf"complete checkpoint in stopped)",
        line,
    ), line
    assert "final model and processor saved" not in output
