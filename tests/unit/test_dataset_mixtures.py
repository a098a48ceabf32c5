"""Mixtures of several datasets (issue 52), as users bring them: TRL 1.16's `datasets:` with
`fraction` (compared with TRL's own `get_dataset`), open-r1's `dataset_mixture` with `weight`,
the alignment-handbook's `dataset_mixer` with `dataset_splits`; read by the text-generation
task as a training process reads them, checked dataset by dataset before launch, refused in
one line where they cannot run."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.support.helpers import offline_dry_run as dry_run
from tests.support.helpers import task_of, warm_hub_cache
from trainer.launcher import main as launch
from trainer.settings.mixtures import mixture_of

SIZES = {"alpha": 10, "beta": 6, "gamma": 9}
"""Rows per dataset: unequal, so that every way of weighing them shows."""


def chat(name: str, index: int, split: str) -> dict:
    return {"messages": [{"role": "user", "content": f"{name} {split} {index}"},
                         {"role": "assistant", "content": "ok"}]}  # fmt: skip


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A tiny Llama and three folders of chats, each with its own extra column (so that they
    concatenate only with `columns`), in the handbook's splits train_sft and test_sft and in
    train."""
    from tests.support.chat_models import FAMILIES, save_family_model

    root = tmp_path_factory.mktemp("mixtures")
    save_family_model(FAMILIES["llama"], root / "llama")
    for name, size in SIZES.items():
        (root / name).mkdir()
        for split, rows in (("train", size), ("train_sft", size), ("test_sft", 2)):
            lines = [json.dumps({**chat(name, i, split), f"{name}_id": i}) for i in range(rows)]
            (root / name / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def recipe(root, tmp_path, content: dict) -> list[str]:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": str(root / "llama"), **content}))
    return ["--config", str(path)]


def first_turns(dataset) -> list[str]:
    return [row["messages"][0]["content"] for row in dataset]


def mixture_rows(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """The training and evaluation rows of the mixture, as a training process reads them."""
    task = task_of(argv)
    train, evaluation = task.mixed(mixture_of(task.data_args, task.options))
    return first_turns(train), None if evaluation is None else first_turns(evaluation)


def test_trls_fractions_give_the_rows_of_trls_own_get_dataset(mixed, tmp_path):
    """TRL 1.16's `datasets:` (its DatasetMixtureConfig at the top of the file): fractions
    normalised, the largest mixture no dataset oversamples, each one's first rows, in order."""
    from trl.scripts.utils import DatasetConfig, DatasetMixtureConfig, get_dataset

    fractions = {"alpha": 0.5, "beta": 0.3, "gamma": 0.2}
    trls = get_dataset(DatasetMixtureConfig(datasets=[
        DatasetConfig(path="json", data_files=str(mixed / name / "train.jsonl"),
                      columns=["messages"], fraction=fraction)
        for name, fraction in fractions.items()]))["train"]  # fmt: skip
    datasets = [{"path": str(mixed / name), "columns": ["messages"], "fraction": fraction}
                for name, fraction in fractions.items()]  # fmt: skip
    argv = recipe(mixed, tmp_path, {"datasets": datasets, "eval_strategy": "no"})
    train, evaluation = mixture_rows(argv)
    assert train == first_turns(trls) and evaluation is None
    # beta's 6 rows at 0.3 bound the mixture at 20 rows: 10, 6 and 4 of them
    assert [sum(row.startswith(name) for row in train) for name in SIZES] == [10, 6, 4]


def test_open_r1s_weights_draw_each_datasets_share_with_the_seed(mixed, tmp_path):
    """open-r1's (and the handbook's newer) `dataset_mixture`: a weight keeps that share of the
    dataset's rows, drawn with `seed`; the concatenation is shuffled with it and
    `test_split_size` held out with it (open_r1/utils/data.py `get_dataset`)."""
    from datasets import concatenate_datasets, load_dataset

    weights = {"alpha": 0.5, "beta": 1.0, "gamma": 0.34}
    mixture = {"datasets": [{"id": str(mixed / name), "columns": ["messages"], "weight": weight}
                            for name, weight in weights.items()],
               "seed": 7, "test_split_size": 0.25}  # fmt: skip
    argv = recipe(mixed, tmp_path, {"dataset_mixture": mixture})
    train, evaluation = mixture_rows(argv)
    # open-r1's steps, written out with `datasets` on the same files
    parts = []
    for name, weight in weights.items():
        part = load_dataset("json", data_files=str(mixed / name / "train.jsonl"), split="train")
        part = part.select_columns(["messages"]).shuffle(seed=7)
        parts.append(part.select(range(int(len(part) * weight))))
    split = concatenate_datasets(parts).shuffle(seed=7).train_test_split(test_size=0.25, seed=7)
    assert (train, evaluation) == (first_turns(split["train"]), first_turns(split["test"]))
    assert len(train) + len(evaluation) == 5 + 6 + 3
    assert mixture_rows(argv) == (train, evaluation)  # every rank draws the same rows


def test_the_handbooks_mixer_takes_first_rows_and_whole_test_splits(mixed, tmp_path):
    """The handbook's `dataset_mixer: {ID: fraction}` with `dataset_splits`: the first rows of
    each training split, the test splits whole, each concatenation shuffled with seed 42, the
    columns kept those the task reads (alignment/data.py `mix_datasets`)."""
    from datasets import concatenate_datasets, load_dataset

    fractions = {"alpha": 0.5, "gamma": 1.0}
    argv = recipe(mixed, tmp_path, {
        "dataset_mixer": {str(mixed / name): share for name, share in fractions.items()},
        "dataset_splits": ["train_sft", "test_sft"], "do_eval": True})  # fmt: skip

    def split(name, spec):
        files = str(mixed / name / f"{spec}.jsonl")
        return load_dataset("json", data_files=files, split="train").select_columns(["messages"])

    train = [split(name, "train_sft") for name in fractions]
    train = [part.select(range(int(share * len(part))))
             for part, share in zip(train, fractions.values(), strict=True)]  # fmt: skip
    test = [split(name, "test_sft") for name in fractions]
    expected = (first_turns(concatenate_datasets(train).shuffle(seed=42)),
                first_turns(concatenate_datasets(test).shuffle(seed=42)))  # fmt: skip
    assert mixture_rows(argv) == expected and len(expected[0]) == 5 + 9


def test_axolotls_several_datasets_are_concatenated_and_shuffled_with_its_seed(mixed, tmp_path):
    """Axolotl's `datasets:` of several chat sets is their concatenation, each read whole (its
    `messages`), shuffled with the file's seed (42 without one), or left in order with
    `shuffle_merged_datasets: false` (its merge_datasets)."""
    from datasets import concatenate_datasets, load_dataset

    def loaded(name: str):
        found = load_dataset("json", data_files=str(mixed / name / "train.jsonl"), split="train")
        return found.select_columns(["messages"])

    whole = concatenate_datasets([loaded("alpha"), loaded("beta")])
    content = {"base_model": str(mixed / "llama"), "sequence_len": 64,
               "datasets": [{"path": str(mixed / "alpha"), "type": "chat_template"},
                            {"path": str(mixed / "beta"), "type": "chat_template",
                             "split": "train"}]}  # fmt: skip
    for more, expected in (({"seed": 7}, whole.shuffle(seed=7)), ({}, whole.shuffle(seed=42)),
                           ({"shuffle_merged_datasets": False}, whole)):  # fmt: skip
        train, evaluation = mixture_rows(recipe(mixed, tmp_path, {**content, **more}))
        assert (train, evaluation) == (first_turns(expected), None), more


def test_a_mixture_is_planned_with_every_dataset_checked_before_launch(mixed, tmp_path, capsys):
    """The dry run plans the mixture, says where its evaluation split comes from, and checks
    each dataset before launch: a column it keeps that it lacks, or a missing dataset, is one
    error line."""
    mixture = {"datasets": [{"id": str(mixed / "alpha"), "columns": ["messages"]},
                            {"id": str(mixed / "beta"), "columns": ["messages"]}],
               "test_split_size": 0.2}  # fmt: skip
    code, config, err = dry_run(recipe(mixed, tmp_path, {"dataset_mixture": mixture}), capsys)
    assert code == 0, err
    assert json.loads(config["flags"]["task_options"]["dataset_mixture"]) == mixture
    assert "evaluation split: 0.2 of the mixture, drawn with seed 0 (test_split_size)" in err
    mixture["datasets"][0]["columns"] = ["messages", "beta_id"]
    code, _, err = dry_run(recipe(mixed, tmp_path, {"dataset_mixture": mixture}), capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and errors == [
        f'error: Column "beta_id" (--dataset_mixture columns) not found in {mixed / "alpha"}; '
        "its columns are: alpha_id, messages."
    ]
    mixture["datasets"][0]["columns"] = ["messages"]
    mixture["datasets"][1]["id"] = str(mixed / "missing")
    code, _, err = dry_run(recipe(mixed, tmp_path, {"dataset_mixture": mixture}), capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and errors == [f"error: Dataset directory {mixed / 'missing'} not found."]


ALPHA = {"id": "@alpha", "columns": ["messages"]}


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ({"dataset_mixture": {"datasets": [{**ALPHA, "weight": 1.5}]}},
         "datasets[0] weight 1.5: give a share of the dataset's rows, from 0 to 1"),
        ({"dataset_mixture": {"datasets": [{**ALPHA, "probability": 0.5}]}},
         "datasets[0]: probability is not read here (it reads columns, config, fraction, id, "
         "name, path, split, weight)"),
        ({"dataset_mixture": {"datasets": [ALPHA], "shuffle": True}},
         "--dataset_mixture: shuffle is not read here"),
        ({"dataset_mixture": {"datasets": [{**ALPHA, "weight": 0.5}, {**ALPHA, "fraction": 1}]}},
         "give weight (a share of each dataset's rows, open-r1's) or fraction"),
        ({"datasets": [{**ALPHA, "fraction": 0.5}, ALPHA]},
         "fraction must be set for every dataset or none (TRL's rule)"),
        ({"datasets": [ALPHA, ALPHA], "streaming": True},
         "--dataset_mixture streaming: a mixture is read whole (a weight needs each dataset's "
         "length); mix streams with --streaming true --dataset_name A,B"),
        ({"dataset_mixture": {"datasets": [ALPHA, ALPHA]}, "streaming": True, "max_steps": 3},
         "--dataset_mixture with --streaming or --interleave_probabilities: a mixture is "
         "read whole"),
        ({"dataset_mixture": {"datasets": [{"path": "json", "data_files": "a.jsonl"}, ALPHA]}},
         "data_dir and data_files are not read here; put the files in one folder"),
        ({"dataset_mixture": {"datasets": [ALPHA, ALPHA]}, "dataset_name": "@alpha"},
         "--dataset_name and --dataset_mixture both name the data"),
        ({"dataset_mixture": {"datasets": [ALPHA, ALPHA]}, "eval_strategy": "steps"},
         "The --dataset_mixture has no evaluation split: add test_split_size"),
        ({"dataset_mixer": {"@alpha": 0.5, "@beta": 1.0}, "dataset_configs": ["a", "b", "c"]},
         "--dataset_config_name gives 3 configs for 2 datasets of the mixture"),
    ],
)  # fmt: skip
def test_a_mixture_that_cannot_run_is_one_line(mixed, tmp_path, capsys, content, said):
    text = yaml.safe_dump(content).replace("'@", f"'{mixed}/").replace(" @", f" {mixed}/")
    code, _, err = dry_run(recipe(mixed, tmp_path, yaml.safe_load(text)), capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and said in errors[0], err


def test_another_task_refuses_a_mixture_in_one_line(mixed, tmp_path, capsys):
    mixture = {"datasets": [{"id": str(mixed / "alpha")}, {"id": str(mixed / "beta")}]}
    code, _, err = dry_run(["--task", "text-classification", "--model_name_or_path",
                            mixed / "llama", "--dataset_mixture", json.dumps(mixture)],
                           capsys)  # fmt: skip
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, err
    assert "--dataset_mixture: flag(s) of --task text-generation, not of" in errors[0]


def test_the_hub_check_asks_about_every_dataset_of_a_mixture(mixed, tmp_path, capsys, monkeypatch):
    """Each Hub id of a mixture is checked before launch, as `--dataset_name`'s is: the cached
    one passes offline, the one after it is named in one line."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # offline, as every test is
    warm_hub_cache(tmp_path / "hub", "dataset", "org/cached-chats")
    mixer = {"org/cached-chats": 1.0, "org/uncached-chats": 0.5}
    line = recipe(mixed, tmp_path, {"dataset_mixer": mixer, "eval_strategy": "no"})
    with pytest.raises(SystemExit) as exit_info:
        launch.main(["--dry-run", *line])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert exit_info.value.code == 2 and len(errors) == 1
    assert errors[0].startswith("error: Hub dataset org/uncached-chats is not in the local")
