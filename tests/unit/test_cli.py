"""The command line as a user meets it, parsed in-process: YAML recipes and the flags
given after them (--help and --dry-run of the real command line:
tests/processes/test_cli_runs.py)."""

from __future__ import annotations

from trainer.command_line.parser import parse_flags
from trainer.command_line.recipes import expand_config_file


def test_yaml_flags_come_first_so_the_command_line_wins(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "learning_rate: 1.0e-4\nlanguage: serbian\nreport_to: [tensorboard]\n"
        "do_lower_case: true\ntrain_split_name: train+validation\n"
    )
    argv = expand_config_file([str(recipe), "--learning_rate", "3e-5"])
    flags = parse_flags(argv)
    assert flags.training["learning_rate"] == 3e-5
    assert flags.task_options.language == "serbian"
    assert flags.task_options.do_lower_case is True
    assert flags.data.train_split_name == "train+validation"


def test_shipped_seed_recipe_parses():
    flags = parse_flags(expand_config_file(["whisper-small.yaml"]))
    assert flags.model.model_name_or_path == "openai/whisper-small"
    assert flags.data.dataset_name.startswith("gs://"), "the Hub no longer serves Common Voice"
    assert flags.data.dataset_config_name is None
    assert flags.training["metric_for_best_model"] == "wer"
    assert flags.training["load_best_model_at_end"] is True
