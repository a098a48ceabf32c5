"""What the speech runs' outputs are read with (tests/processes/test_demo_run.py and
test_end_to_end.py): the ranks' first-batch reports, the evaluation lines, and the check
that a delivered Whisper reloads with plain transformers and transcribes."""

from __future__ import annotations

import re

import torch

EVAL_LINE = re.compile(r"^eval at step (\d+) \| loss ([\d.]+) \| wer ([\d.]+)", re.MULTILINE)
RANK_LINE = re.compile(
    r"rank (\d+)/(\d+) \(node (\d+), local rank \d+\): first batch of \d+ examples, "
    r"fingerprint (\w+)"
)
ENGLISH_TRANSCRIBE = ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]


def rank_reports(output: str) -> dict[int, tuple[int, int, str]]:
    """rank -> (world size, node, fingerprint of its first batch)."""
    return {
        int(rank): (int(world), int(node), fingerprint)
        for rank, world, node, fingerprint in RANK_LINE.findall(output)
    }


def evaluations(output: str) -> dict[int, tuple[float, float]]:
    """step -> (loss, WER) of each `eval at step N` line."""
    return {int(step): (float(loss), float(wer)) for step, loss, wer in EVAL_LINE.findall(output)}


def assert_trained_model_reloads_and_generates(model_dir, initial_model_dir, dataset_dir):
    """The saved folder loads with from_pretrained, holds trained weights, and transcribes
    English (the run's --language en) with no arguments to generate()."""
    from datasets import Audio, load_dataset
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    model = WhisperForConditionalGeneration.from_pretrained(model_dir)
    processor = WhisperProcessor.from_pretrained(model_dir)
    initial = WhisperForConditionalGeneration.from_pretrained(initial_model_dir).state_dict()
    changed = [
        name for name, value in model.state_dict().items() if not torch.equal(value, initial[name])
    ]
    assert len(changed) > len(initial) // 2, "the saved weights are not the trained ones"

    clip = load_dataset("audiofolder", data_dir=str(dataset_dir), split="test")
    clip = clip.cast_column("audio", Audio(sampling_rate=16_000))[0]["audio"]
    waveform = clip.get_all_samples().data.mean(dim=0).numpy()
    features = processor.feature_extractor(waveform, sampling_rate=16_000, return_tensors="pt")
    with torch.no_grad():
        transcript = model.generate(features.input_features, max_new_tokens=8)
        # the same call, returning the prompt that generate() chose too
        prompted = model.generate(
            features.input_features, max_new_tokens=8, return_dict_in_generate=True
        ).sequences
    tokenizer = processor.tokenizer
    # the sequence with its prompt also keeps the end-of-text token a trained model reaches
    # before max_new_tokens; the plain call's transcript drops both
    sequence = prompted[0].tolist()
    if sequence[-1] == model.generation_config.eos_token_id:
        sequence = sequence[:-1]
    prompt = sequence[: len(sequence) - transcript.shape[1]]
    assert tokenizer.convert_ids_to_tokens(prompt) == ENGLISH_TRANSCRIBE
    assert sequence[len(prompt) :] == transcript[0].tolist()
    assert 0 < transcript.shape[1] <= 8 and int(transcript.max()) < model.config.vocab_size
    # the prompt is special tokens only: the text is the transcript's, nothing more
    assert processor.batch_decode(prompted, skip_special_tokens=True) == processor.batch_decode(
        transcript, skip_special_tokens=True
    )
