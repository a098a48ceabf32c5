"""What a child Python reads from a loopback Hub (tests/support/loopback_hub.py) with the
real `datasets` and `huggingface_hub` clients, for tests/processes/test_hub_streaming.py.

The clients read `HF_ENDPOINT` and the offline switches when they are imported, and the
test session runs offline (tests/conftest.py), so the reading happens in a child started
with the online environment: `python -m tests.support.hub_stream_readers READER MODEL OUT`
runs `read_from_hub` (READER `text`) or `read_speech_from_hub` (`speech`) and writes what
it read to OUT as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

DATASET = "org/sentiment"
FLAGS = ["--task", "text-classification", "--dataset_name", DATASET,
         "--text_column_name", "sentence", "--label_column_name", "sentiment",
         "--streaming", "true", "--max_steps", "2"]  # fmt: skip
BUFFER = 8
SPEECH = "org/speech"
SPEECH_FLAGS = ["--task", "speech-recognition", "--dataset_name", SPEECH,
                "--text_column_name", "transcription", "--language", "en", "--streaming",
                "--max_steps", "1", "--eval_split_name", "test"]  # fmt: skip


def read_from_hub(model_dir: str) -> dict:
    """Build the text task from flags, load its training stream and evaluation split from
    the Hub, and read the stream as each of 4 ranks (seeds 3, 3, 4), in a later epoch, as
    rank 1 of 2 with 2 loader workers, and across a mid-epoch resume."""
    from torch.utils.data import DataLoader

    from trainer.command_line.parser import parse_flags
    from trainer.data.streams import POSITION, StreamPositions, StreamStart, prepare_stream

    task = parse_flags([*FLAGS, "--model_name_or_path", model_dir]).build_task()
    task.check_inputs()
    _, tokenizer = task.build_model_and_processor()
    train, evaluation = task.load_datasets(tokenizer)

    def stream(rank: int, world: int, seed: int = 3, start: StreamStart | None = None):
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
        return prepare_stream(train, seed=seed, buffer_size=BUFFER, start=start)

    def keys(examples) -> list[str]:
        return [example["__key__"] for example in examples]

    reads = {"labels": list(task.labels.names), "parts": {},
             "evaluation": sorted(evaluation["__key__"])}  # fmt: skip
    for name, seed in (("3", 3), ("3 again", 3), ("4", 4)):
        reads["parts"][name] = [keys(stream(rank, 4, seed)) for rank in range(4)]
    later = stream(0, 4)
    later.set_epoch(1)
    reads["epoch 1 of rank 0"] = keys(later)
    reads["rank 1 of 2"] = keys(stream(1, 2))
    loader = DataLoader(stream(1, 2), batch_size=None, num_workers=2)
    reads["two loader workers, rank 1 of 2"] = [(ex["__key__"], ex[POSITION][0]) for ex in loader]

    whole = stream(1, 2)
    whole.set_epoch(2)
    whole = list(whole)
    positions = StreamPositions()
    positions.trained([example[POSITION] for example in whole[:11]])
    resumed = stream(1, 2, start=StreamStart(positions.epoch, positions.consumed))
    resumed.set_epoch(0)  # the Trainer counts epochs afresh after a resume
    first = keys(resumed)
    resumed.set_epoch(1)
    next_epoch = stream(1, 2)
    next_epoch.set_epoch(3)
    reads["resume"] = {
        "trained": {"epoch": positions.epoch, "consumed": positions.consumed},
        "whole": keys(whole), "resumed": first,
        "next epoch after the resume": keys(resumed), "next epoch": keys(next_epoch),
    }  # fmt: skip
    return reads


def read_speech_from_hub(model_dir: str) -> dict:
    """Build the speech task from flags, load its training stream and evaluation split from
    the Hub, read the stream as each of 2 ranks and collate 3 of the first one's clips."""
    from trainer.command_line.parser import parse_flags
    from trainer.data.streams import POSITION, prepare_stream

    task = parse_flags([*SPEECH_FLAGS, "--model_name_or_path", model_dir]).build_task()
    task.check_inputs()
    _, processor = task.build_model_and_processor()
    train, evaluation = task.load_datasets(processor)
    parts = []
    for rank in range(2):
        os.environ.update(RANK=str(rank), WORLD_SIZE="2")
        parts.append(list(prepare_stream(train, seed=3, buffer_size=BUFFER, start=None)))
    batch = task.data_collator(processor)([{k: v for k, v in ex.items() if k != POSITION}
                                           for ex in parts[0][:3]])  # fmt: skip
    return {
        "parts": [[example["__key__"] for example in part] for part in parts],
        "input_features": list(batch["input_features"].shape),
        "labels": list(batch["labels"].shape),
        "evaluation": {"examples": len(evaluation),
                       "sampling rate": evaluation[0]["audio"]["sampling_rate"]},
    }  # fmt: skip


READERS = {"text": read_from_hub, "speech": read_speech_from_hub}


if __name__ == "__main__":
    import datasets

    # A shuffled Parquet stream sleeps 5 s after each whole pass (datasets' workaround for
    # apache/arrow#45214, which it applies only up to pyarrow 24 elsewhere); the readers
    # read up to ~20 passes, and the pause changes nothing that is read.
    datasets.config.SLEEP_TIME_ON_THREADS_SHUTDOWN = 0
    reader, model_dir, out = sys.argv[1:]
    Path(out).write_text(json.dumps(READERS[reader](model_dir)))
