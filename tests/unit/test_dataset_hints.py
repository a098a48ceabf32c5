"""What a dataset's splits and columns tell a user who named them wrong (issue 33): the
evaluation split a dataset has, the files given without `--train_file`, how to name a
sentence pair, GLUE's unlabelled test split and one half of a pair, run_classification.py's
`--text_column_names` (columns joined into one text), and a metadata file that is not UTF-8
in any split of an audio folder. Dry runs through the launcher in this process, and the
task objects the training processes build."""

from __future__ import annotations

import csv
import dataclasses
import shutil

import pytest

from tests.support.helpers import checked_task, few_clips, resolved, task_of
from tests.support.helpers import offline_dry_run as dry_run
from tests.support.tiny_assets import (
    build_tiny_bert,
    sentiment_sentences,
    write_paraphrase_csv,
    write_sentiment_csv,
)
from trainer.common.errors import UserError
from trainer.settings.run_config import RunConfig
from trainer.tasks import build_task

TEXT = ["--task", "text-classification"]


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """A tiny BERT, the sentiment CSVs (train, test) and MRPC-shaped pairs (train,
    validation: no test split, as a dataset with a validation split often is)."""
    root = tmp_path_factory.mktemp("dataset-hints")
    texts = [text for rows in sentiment_sentences().values() for text, _ in rows]
    build_tiny_bert(root / "bert", texts)
    write_sentiment_csv(root / "sentiment")
    write_paraphrase_csv(root / "mrpc")
    return root


def on(root, dataset="mrpc") -> list:
    """The text task's flags for the tiny BERT and `dataset` (a folder of `root`, or a path)."""
    return [*TEXT, "--model_name_or_path", root / "bert", "--dataset_name", root / dataset]


@pytest.mark.parametrize(
    ("splits", "hint"),
    [
        (("train", "dev"), "(--eval_split_name dev evaluates on its dev split; "),
        (("train",), "(no evaluation split? --train_val_split 0.15 takes one from the"),
    ],
)
def test_a_missing_evaluation_split_points_to_the_one_the_dataset_has(
    tables, tmp_path, capsys, splits, hint
):
    for split in splits:
        shutil.copy(tables / "mrpc" / ("validation.csv" if split != "train" else "train.csv"),
                    tmp_path / f"{split}.csv")  # fmt: skip
    code, _, err = dry_run(on(tables, tmp_path), capsys)
    expected = (
        f'error: Split "test" not found in {tmp_path}: it has {", ".join(sorted(splits))}. {hint}'
    )
    assert code == 2 and err.startswith(expected) and err.count("\n") == 1, err
    assert err.rstrip().endswith("--eval_strategy no trains without)"), err


def test_a_hub_dataset_without_the_evaluation_split_names_the_one_it_has(tables, monkeypatch):
    """A hub dataset's splits are known only when the training processes load it: its
    missing evaluation split is the launcher's line for a local one, not `datasets`' own
    (`Unknown split "test". Should be one of [...]`); a missing training split gets no
    evaluation hint. The hub is played by `datasets`' csv builder over the MRPC files."""
    import datasets

    from trainer.data.sources import load_split

    load = datasets.load_dataset
    files = {split: str(tables / "mrpc" / f"{split}.csv") for split in ("train", "validation")}
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config, cache_dir, **kwargs: load(
        "csv", data_files=files, **kwargs))  # fmt: skip
    task = task_of([*TEXT, "--model_name_or_path", tables / "bert", "--dataset_name", "org/pairs",
                    "--text_column_name", "sentence1,sentence2"])  # fmt: skip
    for spec, streaming, hint in (
        ("test", False, " (--eval_split_name validation evaluates on its validation split; "),
        ("test", True, " (--eval_split_name validation evaluates on its validation split; "),
        ("train+dev", False, ""),
    ):
        data = dataclasses.replace(
            task.data_args, train_split_name="train+dev", streaming=streaming
        )
        with pytest.raises(UserError) as refused:
            load_split(data, None, spec, task.detect_local_layout)
        missing = "dev" if spec == "train+dev" else "test"
        assert str(refused.value).startswith(
            f'Split "{missing}" not found in org/pairs: it has train, validation.{hint}'
        ), refused.value
        assert bool(hint) == str(refused.value).endswith("--eval_strategy no trains without)")


def test_a_test_file_alone_names_what_is_missing(tables, capsys):
    test_file = tables / "sentiment" / "test.csv"
    model = ["--model_name_or_path", tables / "bert", "--text_column_name", "sentence"]
    code, _, err = dry_run([*TEXT, *model, "--test_file", test_file], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: --test_file is given without --train_file: the files name "
                          "the splits of one dataset, the training examples first; add "
                          "--train_file, or give the data as --dataset_name DIR"), err  # fmt: skip
    code, _, err = dry_run([*on(tables, "sentiment"), "--test_file", test_file], capsys)
    assert code == 2 and err == (
        "error: --test_file and --dataset_name name the data twice: give --dataset_name alone "
        "(its own splits), or --train_file with the other files.\n"
    ), err


def test_a_missing_text_column_says_how_to_give_the_pair_the_dataset_has(tables, capsys):
    code, _, err = dry_run([*on(tables), "--eval_split_name", "validation"], capsys)
    assert code == 2 and err == (
        f'error: Column "text" (--text_column_name) not found in {tables / "mrpc"}; its '
        "columns are: label, sentence1, sentence2. Its sentence pair: --text_column_name "
        "sentence1,sentence2.\n"
    ), err
    code, _, err = dry_run([*on(tables), "--eval_split_name", "validation",
                            "--text_column_name", "sentence1,sentence2"], capsys)  # fmt: skip
    assert code == 0, err


def test_the_training_processes_warn_of_one_half_of_a_sentence_pair(tables, capsys):
    task = checked_task("text-classification", tables / "bert", tables / "mrpc",
                        "--text_column_name", "sentence1",
                        "--eval_split_name", "validation")  # fmt: skip
    task.build_model_and_processor()
    warnings = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert warnings == [
        "warning: --text_column_name sentence1 trains on one text of each example, but the "
        "dataset also has sentence2, the other half of the pair: --text_column_name "
        "sentence1,sentence2 trains on both"
    ]
    pair = checked_task("text-classification", tables / "bert", tables / "mrpc",
                        "--text_column_name", "sentence1,sentence2",
                        "--eval_split_name", "validation")  # fmt: skip
    pair.build_model_and_processor()
    assert "warning" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("config", "evaluation", "held_out"),
    [("mrpc", [], "validation"), ("rte", ["--eval_split_name", "test"], "validation"),
     ("mnli", ["--eval_split_name", "test_matched"], "validation_matched")],
)  # fmt: skip
def test_glue_s_unlabelled_test_split_is_refused_before_launch(
    tables, capsys, config, evaluation, held_out
):
    args = [*TEXT, "--model_name_or_path", tables / "bert", "--dataset_name", "nyu-mll/glue",
            "--dataset_config_name", config, "--text_column_name", "sentence1",
            *evaluation]  # fmt: skip
    code, _, err = dry_run(args, capsys)
    split = evaluation[-1] if evaluation else "test"
    assert code == 2 and err == (
        f'error: Split "{split}" of nyu-mll/glue has no labels (GLUE hides them: every one is '
        f"-1): evaluate on --eval_split_name {held_out}.\n"
    ), err


def test_an_evaluation_split_without_labels_is_refused_in_the_training_processes(tables, tmp_path):
    """A split whose labels are all datasets' "no label" (-1 of a ClassLabel), as a
    benchmark's hidden test split: refused when the training processes load it (a hub
    dataset's labels are known only then; a local one's are refused before launch, below)."""
    from datasets import ClassLabel, Dataset, Features, Value

    features = Features({"sentence": Value("string"), "label": ClassLabel(names=["neg", "pos"])})
    rows = [(text, label == "positive") for text, label in sentiment_sentences()["train"]]
    Dataset.from_dict({"sentence": [t for t, _ in rows], "label": [int(p) for _, p in rows]},
                      features=features).to_parquet(tmp_path / "train.parquet")  # fmt: skip
    Dataset.from_dict({"sentence": ["A quiet quarter."] * 4, "label": [-1] * 4},
                      features=features).to_parquet(tmp_path / "test.parquet")  # fmt: skip
    task = task_of([*on(tables, tmp_path), "--text_column_name", "sentence"])
    _, tokenizer = task.build_model_and_processor()
    hidden = r"^split test of .* has no labels \(a benchmark's test split hides them\): train"
    with pytest.raises(UserError, match=hidden):
        task.load_datasets(tokenizer)
    # integers, as a CSV holds them: -1 is "no label" too (the training split has no -1), and
    # --do_predict predicts such a split without scoring it
    folder = with_test_labels(tables, tmp_path / "csv", "-1", validation=False)
    task = task_of([*on(tables, folder), *PAIR])
    _, tokenizer = task.build_model_and_processor()
    with pytest.raises(UserError, match=hidden):
        task.load_datasets(tokenizer)
    assert "label" not in task.load_test_split(tokenizer).column_names


def with_test_labels(source, target, labels: str | None, validation: bool = True):
    """`source`'s MRPC-shaped train (and validation) CSVs in `target`, and a test.csv of the
    validation rows whose labels are all `labels` (None: no label column), as a benchmark's
    test split saved to a file."""
    target.mkdir()
    for split in ("train", "validation") if validation else ("train",):
        shutil.copy(source / "mrpc" / f"{split}.csv", target / f"{split}.csv")
    with (source / "mrpc" / "validation.csv").open(newline="") as handle:
        rows = [row[:2] for row in csv.reader(handle)][1:]
    with (target / "test.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sentence1", "sentence2"] + (["label"] if labels is not None else []))
        writer.writerows(row + ([labels] if labels is not None else []) for row in rows)
    return target


PAIR = ["--text_column_name", "sentence1,sentence2"]


@pytest.mark.parametrize(
    ("labels", "validation", "why", "instead"),
    [
        ("-1", True, "every one is -1", "evaluate on --eval_split_name validation."),
        ("", True, "every one is empty", "evaluate on --eval_split_name validation."),
        (None, True, 'no "label" column', "evaluate on --eval_split_name validation."),
        ("-1", False, "every one is -1", "--train_val_split 0.15 evaluates on a part of the "
         "training split; --eval_strategy no trains without."),
    ],
)  # fmt: skip
def test_a_local_evaluation_split_without_labels_is_refused_before_launch(
    tables, tmp_path, capsys, labels, validation, why, instead
):
    """GLUE's test split saved as a file (-1, empty cells, or no label column) is the
    evaluation split by default: one line before launch naming a split with labels, not a
    line from every training process after the nodes started (or a -1 class scored)."""
    folder = with_test_labels(tables, tmp_path / "glue", labels, validation)
    code, _, err = dry_run([*on(tables, folder), *PAIR], capsys)
    assert code == 2 and err == (
        f'error: Split "test" of {folder} has no labels ({why}): {instead}\n'
    ), err
    if validation:
        code, _, err = dry_run([*on(tables, folder), *PAIR, "--eval_split_name", "validation"],
                               capsys)  # fmt: skip
        assert code == 0, err  # the unlabelled test file is not read


def test_files_and_parquet_without_labels_are_refused_and_a_minus_one_class_is_not(
    tables, tmp_path, capsys
):
    """--validation_file with -1 labels; a Parquet test split of a ClassLabel's -1; and
    -1 as a class of the training split (a -1/0/1 scale), which is a label."""
    from datasets import ClassLabel, Dataset, Features, Value

    folder = with_test_labels(tables, tmp_path / "files", "-1")
    files = ["--train_file", folder / "train.csv", "--validation_file", folder / "test.csv",
             "--test_file", folder / "validation.csv"]  # fmt: skip
    model = [*TEXT, "--model_name_or_path", tables / "bert"]
    code, _, err = dry_run([*model, *files, *PAIR], capsys)
    assert code == 2 and err == (
        'error: Split "validation" of the data files (--train_file ...) has no labels (every '
        "one is -1): evaluate on --eval_split_name test.\n"
    ), err
    features = Features({"sentence1": Value("string"), "sentence2": Value("string"),
                         "label": ClassLabel(names=["no", "yes"])})  # fmt: skip
    parquet = tmp_path / "parquet"
    parquet.mkdir()
    for split, labels in (("train", [0, 1] * 4), ("test", [-1] * 8)):
        Dataset.from_dict({"sentence1": ["a b"] * 8, "sentence2": ["c d"] * 8, "label": labels},
                          features=features).to_parquet(parquet / f"{split}.parquet")  # fmt: skip
    code, _, err = dry_run([*on(tables, parquet), *PAIR], capsys)
    assert code == 2 and err.startswith(
        f'error: Split "test" of {parquet} has no labels (every one is -1): --train_val_split'
    ), err
    scale = tmp_path / "scale"
    scale.mkdir()
    (scale / "train.csv").write_text("sentence,label\nbad,-1\nfine,0\ngood,1\n")
    (scale / "test.csv").write_text("sentence,label\nawful,-1\n")
    code, _, err = dry_run([*on(tables, scale), "--text_column_name", "sentence"], capsys)
    assert code == 0, err


def test_one_half_of_a_sentence_pair_is_said_before_launch(tables, capsys):
    """The issue's GLUE line with one text column, and the same shape in local files: a
    notice of the launcher (the training processes say it again once they load the
    split); the pair itself, none."""
    warning = (
        "warning: --text_column_name sentence1 trains on one text of each example, but the "
        "dataset also has sentence2, the other half of the pair: --text_column_name "
        "sentence1,sentence2 trains on both"
    )
    glue = [*TEXT, "--model_name_or_path", tables / "bert", "--dataset_name", "nyu-mll/glue",
            "--dataset_config_name", "mrpc", "--eval_split_name", "validation"]  # fmt: skip
    for data in (glue, [*on(tables), "--eval_split_name", "validation"]):
        code, _, err = dry_run([*data, "--text_column_name", "sentence1"], capsys)
        assert code == 0 and warning in err.splitlines(), err
        code, _, err = dry_run([*data, *PAIR], capsys)
        assert code == 0 and "warning" not in err, err


def test_a_glue_config_s_columns_are_checked_before_launch(tables, capsys):
    """GLUE's columns are known (run_glue.py's task_to_keys): a text column a config lacks is
    one line before launch that says how to give its pair, not a failure in every training
    process."""
    glue = [*TEXT, "--model_name_or_path", tables / "bert", "--dataset_name", "nyu-mll/glue",
            "--eval_split_name", "validation", "--dataset_config_name"]  # fmt: skip
    code, _, err = dry_run([*glue, "qnli"], capsys)
    assert code == 2 and err == (
        'error: Column "text" (--text_column_name) not found in nyu-mll/glue qnli; its columns '
        "are: idx, label, question, sentence. Its sentence pair: --text_column_name "
        "question,sentence.\n"
    ), err
    code, _, err = dry_run([*glue, "sst2", "--text_column_name", "sentence"], capsys)
    assert code == 0, err


def test_text_column_names_joins_the_columns_into_one_text_as_run_classification_does(
    tables, capsys
):
    args = [*on(tables), "--eval_split_name", "validation"]
    code, config, err = dry_run([*args, "--text_column_names", "sentence1,sentence2"], capsys)
    assert code == 0, err
    assert "--text_column_names read as --joined_text_columns" in err.splitlines()
    options = config["flags"]["task_options"]
    assert (options["text_column_name"], options["text_column_delimiter"]) == (
        "sentence1,sentence2",
        " ",
    )
    # the configuration as the training processes receive it (JSON), and the task they build
    config = resolved([*args, "--text_column_names", "sentence1,sentence2"])
    task = build_task(RunConfig.from_json(config.to_json()))
    task.check_inputs()
    _, tokenizer = task.build_model_and_processor()
    train, _ = task.load_datasets(tokenizer)
    batch = task.data_collator(tokenizer)([train[0]])
    joined = f"{train[0]['text']} {train[0]['text_pair']}"
    assert batch["input_ids"][0].tolist() == tokenizer(joined)["input_ids"]
    assert 1 not in batch["token_type_ids"][0].tolist()  # one text, not a pair
    delimited = task_of([*args, "--text_column_names", "sentence1,sentence2",
                         "--text_column_delimiter", " | "])  # fmt: skip
    assert delimited.options.text_column_delimiter == " | "
    code, _, err = dry_run([*args, "--text_column_names", "sentence1,sentence2",
                            "--text_column_name", "sentence1"], capsys)  # fmt: skip
    assert code == 2 and "both name the text column(s): give one." in err, err


def test_a_metadata_file_that_is_not_utf8_in_any_split_is_refused_at_launch(
    demo_assets, tmp_path, capsys
):
    """An audio folder whose (empty) test split's metadata.csv reads well, and whose train
    split's has a Latin-1 "é": one line at launch naming the file and the byte's offset,
    as for a text CSV (trainer/data/sources.py check_utf8)."""
    folder = few_clips(demo_assets, tmp_path / "speech", per_split=2)
    for clip in (folder / "test").glob("*.wav"):
        clip.unlink()
    (folder / "test" / "metadata.csv").write_text("file_name,transcription\n")
    metadata = folder / "train" / "metadata.csv"
    offset = latin1_byte_in(metadata)
    args = ["--task", "speech-recognition", "--model_name_or_path", demo_assets.model_dir,
            "--dataset_name", folder, "--text_column_name", "transcription",
            "--language", "en"]  # fmt: skip
    code, _, err = dry_run(args, capsys)
    assert code == 2 and err == (
        f"error: {metadata} is not UTF-8: byte 0xe9 at offset {offset} (invalid "
        "continuation byte); save it as UTF-8 (e.g. iconv -f latin1 -t utf-8).\n"
    ), err


def latin1_byte_in(path, after: bytes = b"\n") -> int:
    """Put a Latin-1 "é" into `path` after its first `after`; the byte's offset."""
    text = path.read_bytes()
    start = text.index(after) + len(after)
    path.write_bytes(text[:start] + "caf\xe9".encode("latin-1") + text[start:])
    return start + 3


def test_every_metadata_file_of_an_image_folder_and_every_common_voice_table_is_utf8(
    image_assets, demo_assets, tmp_path, capsys
):
    """An imagefolder's metadata.jsonl in its test split; a Common Voice directory's second
    table (the first one's header was the only one read)."""
    from tests.support.tiny_assets import write_colour_images

    vit, _ = image_assets
    images = tmp_path / "colours"
    write_colour_images(images)
    metadata = images / "test" / "red" / "metadata.jsonl"
    metadata.write_text('{"file_name": "0000.png", "caption": "a red square"}\n')
    offset = latin1_byte_in(metadata, b'"caption": "')
    code, _, err = dry_run(["--task", "image-classification", "--model_name_or_path", vit,
                            "--dataset_name", images], capsys)  # fmt: skip
    assert code == 2 and err.startswith(
        f"error: {metadata} is not UTF-8: byte 0xe9 at offset {offset} "
    ), err
    voice = tmp_path / "voice"
    (voice / "clips").mkdir(parents=True)
    for split in ("test", "train"):
        (voice / f"{split}.tsv").write_text("client_id\tpath\tsentence\nc1\ta.mp3\tred cats\n")
    offset = latin1_byte_in(voice / "train.tsv")
    speech = ["--task", "speech-recognition", "--model_name_or_path", demo_assets.model_dir,
              "--text_column_name", "sentence", "--language", "en"]  # fmt: skip
    code, _, err = dry_run([*speech, "--dataset_name", voice], capsys)
    assert code == 2 and err.startswith(
        f"error: {voice / 'train.tsv'} is not UTF-8: byte 0xe9 at offset {offset} "
    ), err
