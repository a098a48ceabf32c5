"""Asking the registry which task a model is for is cheap (trainer/tasks/model_config.py): every
task is asked by the resolution, the server and the model registry, so importing the registry
and asking it about the real configurations of BERT, ViT, Whisper and Llama loads no torch, no
transformers, no task's training code, in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys

CONFIGS = {
    "text-classification": {"model_type": "bert", "architectures": ["BertForMaskedLM"]},
    "image-classification": {"model_type": "vit", "architectures": ["ViTModel"]},
    "speech-recognition": {
        "model_type": "whisper",
        "architectures": ["WhisperForConditionalGeneration"],
    },
    "text-generation": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
}
"""The config.json fields the released checkpoints carry (bert-base-uncased,
google/vit-base-patch16-224-in21k, openai/whisper-small, meta-llama/Llama-3.1-8B)."""


def test_asking_the_registry_about_models_loads_no_ml_library(tmp_path):
    code = (
        "import json, sys; from trainer.tasks import task_of_model; "
        f"tasks = [task_of_model(config) for config in {list(CONFIGS.values())!r}]; "
        # a config without `architectures` is asked of the model type's tables alone
        "tasks.append(task_of_model({'model_type': 'llama'})); "
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'datasets', 'deepspeed', 'trl', 'peft') "
        "or m.endswith(('.training', '.trainer', '.demo'))); "
        "print(json.dumps([tasks, loaded]))"
    )
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=tmp_path)  # fmt: skip
    tasks, loaded = json.loads(answer.stdout)
    assert tasks == [*CONFIGS, "text-generation"]
    assert loaded == []
