"""A micro-batch's time before launch: the FLOPs count of trainer/common/step_time.py against
hand counts of tiny real configs, the plan's entry (trainer/preflight/stop_grace.py), and the
`warning:` that `python -m trainer.jobspec --spot` and a GPU node's dry run print when the
estimate exceeds --stop_grace_seconds. Measured times: bench/step_time.py."""

from __future__ import annotations

import ast
import json

import pytest
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    WhisperConfig,
    WhisperForConditionalGeneration,
)

from tests.support.helpers import REPO_ROOT, assert_planned, warm_hub_cache
from trainer.common import step_time
from trainer.common.step_time import (
    ASSUMED_UTILISATION,
    ForwardFlops,
    encoder_forward_flops,
    micro_batch_seconds,
    peak_flops,
    whisper_forward_flops,
)
from trainer.jobspec import __main__ as jobspec
from trainer.preflight.stop_grace import MICRO_BATCH_TIME
from trainer.preflight.vertex_machines import ACCELERATORS
from trainer.settings.run_config import Hardware
from trainer.tasks.speech_recognition.whisper_sizes import whisper_config

GIB = 2**30


def tiny_bert() -> BertForSequenceClassification:
    """2 layers of width 8 (2 heads, FFN 16), vocabulary 30, 16 positions, 2 labels."""
    config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=16,
                        max_position_embeddings=16, type_vocab_size=2)  # fmt: skip
    with torch.device("meta"):
        return BertForSequenceClassification(config)


# By hand, BERT: a layer's query, key, value and attention output 4 x (8 x 8 + 8) = 288, two
# norms 2 x 16, intermediate 8 x 16 + 16 = 144, output 16 x 8 + 8 = 136: 600, two layers 1200,
# over each of 10 positions; pooler 8 x 8 + 8 = 72 and classifier 8 x 2 + 2 = 18 over one.
BERT_WEIGHTS = 2 * (1200 * 10 + (72 + 18) * 1)  # 24180
BERT_ATTENTION = 4 * 2 * 8 * 10 * 10  # layers x width x queries x keys: 6400


def test_a_bert_forward_pass_is_counted_weight_by_weight():
    counted = encoder_forward_flops(tiny_bert(), positions=10)
    assert counted == ForwardFlops(BERT_WEIGHTS, BERT_WEIGHTS, BERT_ATTENTION)
    forward = BERT_WEIGHTS + BERT_ATTENTION  # 30580
    assert counted.training(checkpointing=False) == 3 * forward == 91740
    assert counted.training(checkpointing=True) == 4 * forward, "the forward once more"


def test_frozen_weights_pass_gradients_on_but_compute_none_of_their_own():
    """LoRA's case: every weight's input gradient (as its forward), only the trainable ones'
    weight gradients (here the classifier's 18 over one position), attention's 2 x forward."""
    model = tiny_bert()
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.startswith("classifier."))
    counted = encoder_forward_flops(model, positions=10)
    assert counted == ForwardFlops(BERT_WEIGHTS, 2 * 18, BERT_ATTENTION)
    forward = BERT_WEIGHTS + BERT_ATTENTION
    backward = BERT_WEIGHTS + 2 * 18 + 2 * BERT_ATTENTION
    assert counted.training(checkpointing=False) == forward + backward == 67596


def test_whisper_weights_are_counted_over_the_audio_or_the_labels():
    """d_model 4, one layer each side, FFN 8, 2 mel bins, vocabulary 12, 6 audio positions;
    5 label tokens. Encoder: convolutions 2 x 4 x 3 + 4 = 28 and 4 x 4 x 3 + 4 = 52, a layer
    (q, v, out with bias, k without: 4 x 16 + 12 = 76; two norms 16; fc1 40, fc2 36) 168, the
    final norm 8: 256 over the 6 positions. Decoder: its layer 168 + cross-attention 76 + a
    norm 8 = 252, final norm 8: 260, of which cross-attention's k and v (16 + 20 = 36) see
    the audio; the rest, with the output projection tied to the embedding (12 x 4 = 48), the
    5 labels. Attention: 4 x d x (6 x 6 encoder + 5 x (5 + 6) decoder)."""
    config = WhisperConfig(vocab_size=12, num_mel_bins=2, d_model=4, encoder_layers=1,
                           decoder_layers=1, encoder_attention_heads=1,
                           decoder_attention_heads=1, encoder_ffn_dim=8, decoder_ffn_dim=8,
                           max_source_positions=6, max_target_positions=8, pad_token_id=0,
                           bos_token_id=1, eos_token_id=1, decoder_start_token_id=2)  # fmt: skip
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    weights = 2 * (256 * 6 + 36 * 6 + (260 - 36 + 48) * 5)  # 6224
    attention = 4 * 4 * (6 * 6 + 5 * (5 + 6))  # 1456
    assert whisper_forward_flops(model, label_tokens=5) == ForwardFlops(weights, weights, attention)


def test_whisper_large_v3_costs_what_its_size_says():
    """The real dimensions: about 6 x 1.5 billion weights x their positions per example."""
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(whisper_config("large-v3"))
    flops = whisper_forward_flops(model, label_tokens=225).training(checkpointing=False)
    encoder = sum(p.numel() for n, p in model.model.encoder.named_parameters() if "embed_" not in n)
    assert 6 * encoder * 1500 < flops < 6 * model.num_parameters() * 1500


def test_every_vertex_gpu_has_its_data_sheet_peak():
    assert {name: peak_flops(name, "16-bit") for name, _, _ in ACCELERATORS.values()} == {
        "Tesla T4": 65e12,
        "NVIDIA L4": 121e12,
        "NVIDIA A100-SXM4-40GB": 312e12,
        "NVIDIA A100-SXM4-80GB": 312e12,
        "NVIDIA H100 80GB HBM3": 989e12,
        "NVIDIA H200": 989e12,
    }
    assert peak_flops("NVIDIA H100 PCIe", "16-bit") == 756e12, "not the SXM part's"
    assert peak_flops("NVIDIA L40S", "16-bit") is None, "not an L4"
    assert peak_flops("Tesla T4", "tf32") == peak_flops("Tesla T4", "fp32") == 8.1e12
    assert peak_flops("NVIDIA A100-SXM4-40GB", "tf32") == 156e12


def test_a_micro_batch_takes_its_flops_over_the_assumed_share_of_the_peak():
    seconds = micro_batch_seconds(91740, batch_size=4, peak=65e12)
    assert seconds == pytest.approx(4 * 91740 / (65e12 * ASSUMED_UTILISATION))


def imported_modules(path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}  # fmt: skip
    return names | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}


def test_the_estimate_and_its_bench_load_on_a_machine_with_torch_and_transformers_alone():
    """bench/step_time.py calibrates the estimate on a bare GPU machine: the estimate's module
    imports only the standard library, the bench nothing of the project besides it."""
    assert imported_modules(REPO_ROOT / step_time.__file__) <= {"__future__", "re", "dataclasses"}
    bench = imported_modules(REPO_ROOT / "bench" / "step_time.py")
    assert {name for name in bench if name.startswith("trainer")} == {"trainer.common.step_time"}
    assert {name.split(".")[0] for name in bench} <= {
        "__future__", "argparse", "importlib", "json", "platform", "statistics", "sys", "time",
        "collections", "dataclasses", "pathlib", "torch", "transformers", "trainer",
    }  # fmt: skip


# Before launch: the plan and its warning --------------------------------------------------


@pytest.fixture
def large_v3_cache(tmp_path):
    """A model cache whose openai/whisper-large-v3 has the released dimensions."""
    cache = tmp_path / "models"
    warm_hub_cache(cache, "model", "openai/whisper-large-v3")
    snapshot = next((cache / "models--openai--whisper-large-v3" / "snapshots").iterdir())
    (snapshot / "config.json").write_text(whisper_config("large-v3").to_json_string())
    return cache


def spec_lines(capsys, *argv: str, dest) -> tuple[int, list[str]]:
    """`python -m trainer.jobspec ARGV --dest DEST` in-process: exit code, stderr's lines."""
    try:
        jobspec.main([*argv, "--dest", str(dest)])
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    return code, capsys.readouterr().err.splitlines()


def test_a_spot_job_whose_micro_batch_outlasts_the_grace_is_warned_not_refused(
    large_v3_cache, tmp_path, capsys
):
    """The large-v3 LoRA recipe at 32 examples a micro-batch on a T4 (65 TFLOP/s fp16):
    about 10 TFLOP an example with checkpointing, far past the 8 s grace; on an A100 at the
    recipe's 16 it fits. Only --spot warns; --check, the preview, warns as writing does."""
    recipe = ["--recipe", "whisper-large-v3-lora.yaml", "--nodes", "1",
              "--cache_dir", str(large_v3_cache)]  # fmt: skip
    t4 = [*recipe, "--machine_type", "n1-standard-8", "--per_device_train_batch_size", "32"]
    code, lines = spec_lines(capsys, *t4, "--spot", dest=tmp_path / "t4")
    assert code == 0 and (tmp_path / "t4" / "config.yaml").is_file()
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1, lines
    assert warnings[0].startswith("warning: a micro-batch of 32 examples is estimated at about ")
    assert "on one Tesla T4" in warnings[0] and "longer than --stop_grace_seconds 8:" in warnings[0]
    assert "a preemption would lose the work since the newest complete checkpoint" in warnings[0]
    assert "(at most about 10 minutes: --save_interval_minutes)" in warnings[0]
    assert "Save more often (--save_steps, --save_interval_minutes)" in warnings[0]
    code, lines = spec_lines(capsys, *t4, "--spot", "--check", dest=tmp_path / "t4")
    assert code == 0 and lines == warnings, "the preview says it too"
    assert spec_lines(capsys, *t4, dest=tmp_path / "on-demand") == (0, [])
    a100 = [*recipe, "--machine_type", "a2-highgpu-1g", "--spot"]
    assert spec_lines(capsys, *a100, dest=tmp_path / "a100") == (0, [])


def test_the_dry_run_shows_a_micro_batch_time_on_gpus_only(dry_run, monkeypatch):
    cpu = assert_planned(dry_run())["model"][MICRO_BATCH_TIME]
    assert "CPU-only" in cpu["not_estimated"]
    l4 = Hardware(1, "NVIDIA L4", (8, 9), 8, gpu_memory_bytes=24 * GIB)
    monkeypatch.setattr("trainer.node.machine.detect_hardware", lambda: l4)
    planned = assert_planned(dry_run("--per_device_train_batch_size", "4"))
    estimate = planned["model"][MICRO_BATCH_TIME]
    assert estimate["gpu"] == "NVIDIA L4" and estimate["precision"] == "16-bit"
    assert estimate["batch_size"] == 4 and estimate["peak_tflops"] == 121
    assert estimate["assumed_utilisation"] == ASSUMED_UTILISATION
    per_example = estimate["training_tflop_per_example"] * 1e12
    seconds = micro_batch_seconds(per_example, 4, 121e12)
    assert estimate["seconds_estimate"] == pytest.approx(seconds, rel=1e-3)
    assert "memory_per_gpu" in planned["model"], "beside the memory estimate"


def test_a_gpu_nodes_dry_run_warns_of_a_micro_batch_longer_than_the_grace(dry_run, monkeypatch):
    """The tiny BERT's micro-batch takes microseconds; a grace of 0 s is shorter still. The
    launcher cannot tell a Spot VM, so its dry run warns whatever the scheduling."""
    l4 = Hardware(1, "NVIDIA L4", (8, 9), 8, gpu_memory_bytes=24 * GIB)
    monkeypatch.setattr("trainer.node.machine.detect_hardware", lambda: l4)
    code, out, err = dry_run("--stop_grace_seconds", "0")
    warnings = [line for line in err.splitlines() if line.startswith("warning: a micro-batch")]
    assert code == 0 and len(warnings) == 1, err
    assert "longer than --stop_grace_seconds 0:" in warnings[0]
    assert warnings[0] in json.loads(out)["notices"]
    _, _, err = dry_run()
    assert "warning: a micro-batch" not in err
