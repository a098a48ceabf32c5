"""TRL's `SFTTrainer` as the text generation task trains with it, apart from the task module
(importing TRL takes seconds, and the launcher imports task modules for their flags only).

The training program builds every task's Trainer the same way (trainer/training/assemble.py:
its `TrainingArguments`, the keep-work mixin and callbacks); here those arguments become TRL's
`SFTConfig` (as `SFTTrainer` itself converts plain `TrainingArguments`) with the task's flags:
`--max_seq_length` as TRL's `max_length`, `--packing` as best-fit-decreasing packing, which
TRL makes padding-free (position ids restart at each example, and the model's attention keeps
each example to itself). The datasets arrive tokenised with their labels (training.py),
so TRL's own masking options stay off: it trains on the labels as given.

Each evaluation adds the perplexity (exp of the evaluation loss), and with
`--generation_samples N` generates greedily from N evaluation prompts, printing prompt,
reference and output (one line each, cut) and writing them to TensorBoard as text. `predict`
(`--do_predict`) generates for every test prompt.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch
from transformers.trainer_utils import PredictionOutput
from trl import SFTConfig, SFTTrainer

from trainer.common.errors import UserError
from trainer.tasks.causal_lm import retyped_arguments
from trainer.tasks.text_generation.serving import continuation, end_of_turn_ids
from trainer.tasks.text_generation.spec import ChatArguments
from trainer.tasks.text_generation.stream import CUTS, CountedCuts

SHOWN_CHARACTERS = 160
"""How much of a prompt, reference or output a sample line shows."""


def sft_config(args, chat: ChatArguments) -> SFTConfig:
    """`args` as TRL's config (`retyped_arguments`: not rebuilt, as SFTTrainer would rebuild
    plain arguments), SFTConfig's own fields set from the task's flags."""
    config = retyped_arguments(args, SFTConfig)
    config.max_length = chat.max_seq_length
    config.packing = chat.packing
    config.packing_strategy = "bfd"  # TRL makes it padding-free
    config.padding_free = False
    config.eval_packing = False
    config.pad_to_multiple_of = None  # SFTConfig's "auto" outside Neuron
    config.assistant_only_loss = False  # the labels carry the mask (chat_examples.py)
    config.completion_only_loss = False
    config.dataset_kwargs = None
    config.eos_token = chat.eos_token  # the tokenizer has it; TRL gives it to the model's configs
    return config


class ChatTrainer(SFTTrainer):
    def __init__(self, *positional, chat: ChatArguments, samples: list, where: str = "",
                 args=None, train_dataset=None, **kwargs):  # fmt: skip
        """A training stream (trainer/data/streams.py `ResumableStream`, made by the streaming
        Trainer from the task's tokenised stream) reaches TRL as the `datasets` stream inside
        it, which TRL takes as it is (`_prepare_dataset`); the Trainer then reads the
        resumable one, and counts the cut rows it carries (stream.py)."""
        self.chat = chat
        self.samples = samples
        self.where = where
        self.cuts = [0, 0, 0]  # rows cut, read, left with nothing to learn (a stream's)
        stream = getattr(train_dataset, "stream", None)
        self._prepared = stream
        given = train_dataset if stream is None else stream
        super().__init__(*positional, args=sft_config(args, chat), train_dataset=given, **kwargs)
        if stream is not None:
            self.train_dataset = train_dataset
            self.data_collator = CountedCuts(self.data_collator)

    def _prepare_dataset(self, dataset, *args, **kwargs):
        if dataset is not None and dataset is self._prepared:
            return dataset  # tokenised, and packed with --packing, as read (chat_stream.py)
        return super()._prepare_dataset(dataset, *args, **kwargs)

    def training_step(self, model, inputs, *args, **kwargs):
        counts = inputs.pop(CUTS, None)
        if counts is not None:
            self.cuts = [total + new for total, new in zip(self.cuts, counts, strict=True)]
            if self.cuts[0] and self.chat.refuse_long_examples:
                raise UserError(
                    f"a row of the training stream ({self.where}) is longer than "
                    f"--max_seq_length {self.chat.max_seq_length} tokens (after {self.cuts[1]} "
                    "rows read); --refuse_long_examples false cuts them."
                )
        return super().training_step(model, inputs, *args, **kwargs)

    def train(self, *args, **kwargs):
        result = super().train(*args, **kwargs)
        if self._prepared is not None:
            self.report_cuts()
        return result

    def report_cuts(self) -> None:
        """One line for the rows of the training stream cut to --max_seq_length, summed over
        all processes (those this run read: a resumed run counts from its restart)."""
        cut, read, empty = self.cuts
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            totals = torch.tensor(self.cuts, dtype=torch.long, device=self.args.device)
            torch.distributed.all_reduce(totals)
            cut, read, empty = totals.tolist()
        if cut and self.is_world_process_zero():
            dropped = f" ({empty} left nothing to learn: dropped)" if empty else ""
            print(f"warning: cut {cut} of {read} rows read from the training stream "
                  f"({self.where}) to --max_seq_length {self.chat.max_seq_length} tokens"
                  f"{dropped}", flush=True)  # fmt: skip

    def evaluation_loop(self, *args, **kwargs):
        output = super().evaluation_loop(*args, **kwargs)
        prefix = kwargs.get("metric_key_prefix", "eval")
        loss = output.metrics.get(f"{prefix}_loss")
        if loss is not None:
            output.metrics[f"{prefix}_perplexity"] = math.exp(min(loss, 50.0))
        return output

    def evaluate(self, *args, **kwargs):
        metrics = super().evaluate(*args, **kwargs)
        if self.samples:
            self.show_samples()
        return metrics

    def show_samples(self) -> None:
        outputs = self.generate_all([prompt for prompt, _ in self.samples])
        if not self.is_world_process_zero():
            return
        step = self.state.global_step
        writer = next((getattr(c, "tb_writer", None) for c in self.callback_handler.callbacks
                       if getattr(c, "tb_writer", None) is not None), None)  # fmt: skip
        for number, ((prompt, reference), output) in enumerate(
            zip(self.samples, outputs, strict=True)
        ):
            shown = (
                json.dumps(prompt, ensure_ascii=False) if not isinstance(prompt, str) else prompt
            )
            lines = [f"sample {number} at step {step}: prompt: {_cut(shown)}",
                     f"sample {number} at step {step}: reference: {_cut(reference)}",
                     f"sample {number} at step {step}: output: {_cut(output['text'])}"]  # fmt: skip
            print("\n".join(lines), flush=True)
            if writer is not None:
                writer.add_text(f"samples/{number}", "\n\n".join(lines), step)

    @torch.no_grad()
    def generate_all(self, prompts: list) -> list[dict]:
        """Greedy continuations of `prompts` (texts, or lists of turns), one at a time, on every
        rank alike (under ZeRO-3 each forward pass gathers weights from all ranks), each in the
        task's answer format, as the server answers (`continuation`)."""
        from transformers.integrations import is_deepspeed_zero3_enabled

        model = self.accelerator.unwrap_model(self.model)
        tokenizer = self.processing_class
        was_training = model.training
        model.eval()
        answers = []
        ends = end_of_turn_ids(model, tokenizer)
        for prompt in prompts:
            if isinstance(prompt, str):
                ids = tokenizer(prompt, return_tensors="pt").input_ids
            else:
                ids = tokenizer.apply_chat_template(
                    prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True
                )["input_ids"]
            ids = ids.to(self.args.device)
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=self.chat.max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                synced_gpus=is_deepspeed_zero3_enabled(),
            )
            new_ids = out[0, ids.shape[1] :].tolist()
            answers.append(continuation(new_ids, ids.shape[1], ends, tokenizer))
        if was_training:
            model.train()
        return answers

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test"):
        """Generations for the test split's prompts (training.py `load_test_split`),
        each rank generating all of them (the global main process writes)."""
        prompts = [json.loads(text) for text in test_dataset["prompt_json"]]
        outputs = self.generate_all(prompts)
        references = test_dataset["reference"]
        scored = [(r, o) for r, o in zip(references, outputs, strict=True) if r is not None]
        metrics: dict[str, Any] = {}
        if scored:
            same = sum(str(r).strip() == o["text"].strip() for r, o in scored)
            metrics[f"{metric_key_prefix}_exact_match"] = same / len(scored)
        return PredictionOutput(predictions=outputs, label_ids=None, metrics=metrics)


def _cut(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= SHOWN_CHARACTERS else text[: SHOWN_CHARACTERS - 3] + "..."
