"""A task is a folder and one registration, asked everywhere (trainer/tasks/registry.py): a fifth
task, built as a folder in tests/support/token_classification/ by docs/tasks.md's "Adding a
task", is found by the command line, task inference, the
server, offline predictions, the model registry and LoRA, with no product file naming it; every
task recognises the real configurations of its model families (causal language models are
text generation's), and no task claims an encoder-decoder text-to-text model."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.support.helpers import serving
from tests.support.served_app import LOCAL, serve
from tests.support.token_classification.spec import NAME
from tests.support.token_classification.spec import SPEC as TAGGING
from trainer.common.errors import UserError
from trainer.config.task_inference import infer_task
from trainer.tasks import registry
from trainer.tasks.served_model import load_predictor

TAGS = ["O", "WORD"]


@pytest.fixture
def extra_task(monkeypatch):
    """The throwaway task registered for one test, as a plug-in registers itself."""
    monkeypatch.setattr(registry, "REGISTERED", dict(registry.REGISTERED))
    registry.register(TAGGING)
    return TAGGING


@pytest.fixture(scope="module")
def tagger(tmp_path_factory, text_assets) -> Path:
    """The tiny BERT with a token-classification head: a delivered model of the extra task."""
    from transformers import AutoTokenizer, BertForTokenClassification

    from tests.support.labelled_models import with_labelled_head

    folder = tmp_path_factory.mktemp("tagger")
    return with_labelled_head(text_assets[0], folder, BertForTokenClassification, AutoTokenizer,
                              TAGS)  # fmt: skip


def help_text(capsys, *argv: str) -> str:
    from trainer.launcher.main import main

    main(list(argv))
    return capsys.readouterr().out


def test_the_command_line_offers_the_extra_task_and_its_flags(extra_task, capsys):
    from trainer.command_line.parser import parse_flags

    flags = parse_flags(["--task", NAME, "--tags_column_name", "labels"])
    assert flags.task_options == TAGGING.flags(tags_column_name="labels")
    text = " ".join(help_text(capsys, "--task", NAME, "--help").split())
    assert f"{NAME} flags" in text and "--tags_column_name STR Column with each word's tag" in text
    assert "(default: exact_tags, set by this project" in text  # its metric
    choices = " ".join(help_text(capsys, "--help").split()).replace("- ", "-")  # wrapped at -
    assert NAME in choices  # --task's choices
    with pytest.raises(UserError, match=f"choose one of .*{NAME}"):
        registry.task_spec("token-tagging")


def test_task_inference_asks_the_extra_task_about_models_and_data(extra_task, tagger, tmp_path):
    assert infer_task(str(tagger), None, None, {})[0] == NAME
    (tmp_path / "train.conll").write_text("a WORD\n")
    assert infer_task(None, str(tmp_path), None, {})[0] == NAME


def test_the_server_and_offline_predictions_serve_and_score_the_extra_task(
    extra_task, tagger, tmp_path, capsys
):
    from trainer.predict.__main__ import main as predict

    predictor = load_predictor(tagger)
    predictor.warm_up()
    assert (predictor.task, type(predictor)) == (NAME, TAGGING.predictor)
    with serve(predictor) as url:
        route = url + LOCAL.predict_route
        answer = httpx.post(route, json={"instances": [{"text": "one two"}]}).json()
    served_tags = answer["predictions"][0]["tags"]
    assert len(served_tags) >= 2 and set(served_tags) <= set(TAGS)  # a tag per word piece

    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("one two")
    (folder / "metadata.csv").write_text(f"file_name,tags\na.txt,{' '.join(served_tags)}\n")
    predict([str(tagger), str(folder), str(tmp_path / "out")])
    lines = [json.loads(line) for line in (tmp_path / "out/predictions.jsonl").open()]
    assert lines == [{"id": "a.txt", "reference": " ".join(served_tags),
                      "prediction": {"tags": served_tags}}]  # fmt: skip
    results = json.loads((tmp_path / "out/test_results.json").read_text())
    assert results == {"test_exact_tags": 1.0, "test_samples": 1}


def test_the_registry_labels_and_lora_defaults_come_from_the_extra_tasks_spec(extra_task, tagger):
    from trainer.registry.delivered_facts import read_delivered_model
    from trainer.registry.registration_request import registry_labels
    from trainer.settings.data_flags import DataArguments
    from trainer.settings.model_flags import ModelArguments
    from trainer.storage.checkpoints import MANIFEST
    from trainer.storage.store import open_store

    (tagger / MANIFEST).write_text("{}")  # delivered: its manifest comes last
    delivered = read_delivered_model(open_store(str(tagger)))
    assert registry_labels(delivered.task, None, None, "img:v1")["task"] == NAME

    task = registry.load_task(NAME)(
        ModelArguments(model_name_or_path=str(tagger), peft="lora"), DataArguments(),
        TAGGING.flags(),
    )  # fmt: skip
    adapted = {name for name, _ in task.weightless_model(local_only=True).named_modules()
               if name.endswith("lora_A")}  # fmt: skip
    assert adapted and all(".key." in name for name in adapted)  # its default: key only


def released_config(config_class: str, architecture: str | None, **shrunk) -> dict:
    """A family's config.json as its released checkpoints carry it: the real configuration
    class's values (sizes may shrink), with the architecture its checkpoints name."""
    import transformers

    config = getattr(transformers, config_class)(**shrunk).to_dict()
    config["architectures"] = [architecture] if architecture else None
    return config


FAMILIES = [
    ("WhisperConfig", "WhisperForConditionalGeneration", "speech-recognition"),
    ("ViTConfig", "ViTModel", "image-classification"),  # google/vit-base-patch16-224-in21k
    ("ViTConfig", "ViTForImageClassification", "image-classification"),
    ("BertConfig", "BertForMaskedLM", "text-classification"),  # google-bert/bert-base-uncased
    ("RobertaConfig", "RobertaForMaskedLM", "text-classification"),
    ("DistilBertConfig", "DistilBertForMaskedLM", "text-classification"),
    ("DebertaV2Config", "DebertaV2ForMaskedLM", "text-classification"),
    ("BertConfig", "BertForSequenceClassification", "text-classification"),
    ("BertConfig", None, "text-classification"),
    ("LlamaConfig", "LlamaForCausalLM", "text-generation"),
    ("LlamaConfig", None, "text-generation"),
    ("Qwen2Config", "Qwen2ForCausalLM", "text-generation"),
    ("Qwen3Config", "Qwen3ForCausalLM", "text-generation"),
    ("GemmaConfig", "GemmaForCausalLM", "text-generation"),
    ("Gemma2Config", "Gemma2ForCausalLM", "text-generation"),
    ("Gemma3TextConfig", "Gemma3ForCausalLM", "text-generation"),
    ("GPT2Config", "GPT2LMHeadModel", "text-generation"),
    ("MistralConfig", "MistralForCausalLM", "text-generation"),
    ("Phi3Config", "Phi3ForCausalLM", "text-generation"),
    ("BertConfig", "BertForTokenClassification", None),  # another task's head
    ("T5Config", "T5ForConditionalGeneration", None),  # text-to-text: no task here
    ("T5Config", None, None),
]


@pytest.mark.parametrize(("config_class", "architecture", "task"), FAMILIES)
def test_each_task_claims_its_families_and_none_claims_a_text_to_text_model(
    config_class, architecture, task
):
    assert registry.task_of_model(released_config(config_class, architecture)) == task


def test_a_model_no_task_claims_is_one_line_naming_the_tasks_not_a_wrong_task(tmp_path):
    t5 = released_config("T5Config", "T5ForConditionalGeneration", num_layers=2)
    (tmp_path / "config.json").write_text(json.dumps(t5))
    with pytest.raises(UserError) as refused:
        infer_task(str(tmp_path), None, None, {})
    line = str(refused.value)
    assert "t5, T5ForConditionalGeneration" in line and "give --task" in line
    assert all(name in line for name in registry.task_names())


def test_the_default_model_of_a_task_and_its_recipes_know_the_task_without_the_hub():
    import yaml

    from trainer.command_line.recipes import RECIPES_DIR, shipped_recipes

    vit = "google/vit-base-patch16-224-in21k"
    assert infer_task(vit, None, None, {}, skip_hub_check=True)[0] == "image-classification"
    owners = {recipe: spec.name for spec in registry.registered() for recipe in spec.recipes}
    assert sorted(owners) == shipped_recipes()
    for recipe, task in owners.items():
        assert yaml.safe_load((RECIPES_DIR / recipe).read_text())["task"] == task


def test_an_unreachable_hub_is_asked_once_then_refused_in_one_line(monkeypatch):
    """hf_hub_download retries an unreachable Hub for minutes (5 tries with back-off): the
    task's inference asks once."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from huggingface_hub import constants

    asked = []

    class Unavailable(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            asked.append(self.path)
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD

        def log_message(self, *args) -> None:
            pass

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)) as hub:
        env = {"HF_ENDPOINT": f"http://127.0.0.1:{hub.server_address[1]}", "HF_HUB_OFFLINE": "0"}
        with pytest.raises(UserError, match="cannot be read from the Hub .* add --task"):
            infer_task("org/some-model", None, None, env)
    assert asked == ["/org/some-model/resolve/main/config.json"]
