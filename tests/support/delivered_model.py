"""Use a delivered model the way its users will: a fresh process, plain transformers.

`python -m tests.support.delivered_model TASK MODEL_DIR INPUT [MODEL_DIR INPUT ...]` loads
each saved folder with `from_pretrained` / `pipeline()` only (nothing from this project is
imported) and prints one JSON object per folder, a line each, with what came out, for the
calling test to check. Several folders share one process's imports.

- speech-recognition: `generate()` with no arguments and the text it decodes to; the
  prompt it chose (the same call with `return_dict_in_generate`, which returns the prompt
  too); `pipeline("automatic-speech-recognition")` on the audio file INPUT; and the
  tokenizer's English normaliser (WER's), which needs the folder's spelling table.
- image-classification: `pipeline("image-classification")` on the image file INPUT.
- text-classification: `pipeline("text-classification")` on the sentence INPUT.
- text-generation: `pipeline("text-generation")`, greedy, on each prompt of the JSON file
  INPUT (`{"prompts": [...], "max_new_tokens": N}`; a prompt is a text or a list of turns).
"""

from __future__ import annotations

import json
import sys


def speech(model_dir: str, audio_file: str) -> dict:
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor, pipeline
    from transformers.pipelines.audio_utils import ffmpeg_read

    model = WhisperForConditionalGeneration.from_pretrained(model_dir)
    processor = WhisperProcessor.from_pretrained(model_dir)
    with open(audio_file, "rb") as handle:
        waveform = ffmpeg_read(handle.read(), sampling_rate=16_000)
    features = processor(waveform, sampling_rate=16_000, return_tensors="pt").input_features
    recognizer = pipeline("automatic-speech-recognition", model=model_dir)
    with torch.no_grad():
        generated = model.generate(features)
        prompted = model.generate(features, return_dict_in_generate=True).sequences
    prompt_length = prompted.shape[1] - generated.shape[1]
    return {
        "generated_tokens": generated.shape[1],
        "generated_text": processor.batch_decode(generated, skip_special_tokens=True)[0],
        "largest_id": int(generated.max()),
        "vocab_size": model.config.vocab_size,
        "prompt": processor.tokenizer.convert_ids_to_tokens(prompted[0, :prompt_length]),
        "label_prefix": processor.tokenizer.convert_ids_to_tokens(
            processor.tokenizer("x").input_ids[:-2]
        ),
        "pipeline_text": recognizer(audio_file)["text"],
        # English WER's normaliser: raises when the folder lacks its spelling table
        "normalized": processor.tokenizer.normalize("The colour of the flavour"),
    }


def classify(task: str, model_dir: str, item: str) -> dict:
    from transformers import pipeline

    predictions = pipeline(task, model=model_dir, top_k=None)(item)
    if predictions and isinstance(predictions[0], list):  # text-classification nests them
        predictions = predictions[0]
    return {"labels": [prediction["label"] for prediction in predictions]}


def generate(model_dir: str, prompts_file: str) -> dict:
    from transformers import pipeline

    with open(prompts_file) as handle:
        asked = json.load(handle)
    generator = pipeline("text-generation", model=model_dir)
    texts = []
    for prompt in asked["prompts"]:
        output = generator(prompt, max_new_tokens=asked["max_new_tokens"], do_sample=False,
                           return_full_text=False)[0]["generated_text"]  # fmt: skip
        texts.append(output if isinstance(output, str) else output[-1]["content"])
    return {"texts": texts}


def main() -> None:
    task, pairs = sys.argv[1], sys.argv[2:]
    for model_dir, item in zip(pairs[::2], pairs[1::2], strict=True):
        if task == "speech-recognition":
            use = speech(model_dir, item)
        elif task == "text-generation":
            use = generate(model_dir, item)
        else:
            use = classify(task, model_dir, item)
        print(json.dumps(use), flush=True)


if __name__ == "__main__":
    main()
