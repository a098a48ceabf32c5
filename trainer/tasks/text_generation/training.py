"""Text generation: supervised fine-tuning of a causal language model through TRL's `SFTTrainer`
(trainer.py), with this project's keep-work machinery around it as for every
task (the training program mixes it into the Trainer class the task names).

The data is tokenised here, before the Trainer sees it, as `input_ids` and `labels`
(loss_mask.py: the loss on the assistant's turns or the completion, found
for any chat template): TRL takes such a dataset as it is, and packs it with `--packing` (its
best-fit-decreasing packing, padding-free: position ids restart at each example, and the
attention kept within each). Rows that are not chats, pairs or texts are skipped and counted
under `--max_bad_examples`; longer ones are cut to `--max_seq_length` and counted, both in
one line each.

Data: conversational (`messages`), prompt/completion (two texts, or two lists of turns), or
plain text (`--dataset_text_field`), from a hub dataset, a local folder of JSONL, Parquet or
CSV files (one per split), or a shard set; with `--streaming true`, the training split is
tokenised as it is read and its bad and long rows counted as they are read
(stream.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.common.errors import UserError
from trainer.common.step_time import encoder_forward_flops
from trainer.data.bad_examples import NAMES_SHOWN, check_limit, skip_counted
from trainer.data.example_ids import with_example_ids
from trainer.data.mixing import mixed_splits
from trainer.data.sources import (
    FILES,
    LocalLayout,
    first_examples,
    load_split,
    looks_like_path,
    split_off_evaluation,
)
from trainer.data.streams import is_stream
from trainer.settings.mixtures import Mixture, mixture_of
from trainer.tasks.base import Task, named_files_layout
from trainer.tasks.causal_lm import CausalLanguageModel, decoder_layer_values
from trainer.tasks.text_generation.loss_mask import (
    BadRow,
    TemplateNotSplittable,
    encode_row,
    marked_template,
    training_template,
)
from trainer.tasks.text_generation.spec import (
    FORMATS_LINE,
    SPEC,
    ChatArguments,
    data_format,
)
from trainer.tasks.text_generation.stream import StreamEncoder, tokenised_stream

if TYPE_CHECKING:
    from datasets import Dataset, IterableDataset
    from transformers import PreTrainedModel

TOKENISED = ("input_ids", "labels")
PROBED_ROWS = 100
"""A training stream's first rows, on which the loss mask's way is chosen."""
REFERENCE, PROMPT_JSON = "reference", "prompt_json"
"""A test split's columns: the reference answer, and the prompt (a text or a list of turns, as
JSON: a column holds one type)."""


class ChatTask(CausalLanguageModel, Task):
    spec = SPEC
    default_metric = "perplexity"  # exp(eval loss): the same order, in words a person reads
    metric_names = ("perplexity",)
    lower_is_better = frozenset({"perplexity"})  # and loss, which the Trainer knows itself
    options: ChatArguments

    _format: str | None = None
    _samples: list[tuple[Any, str]] = []

    # -- before launch ------------------------------------------------------------------------

    def column_flags(self) -> dict[str, str | tuple[str, ...]]:
        """Nothing of ours names a column but a mixture's `columns`, which must be there."""
        return {"dataset_mixture columns": self.mixed_columns} if self.mixed_columns else {}

    def column_warning(self, columns: list[str]) -> str | None:
        """Not a warning: a training split in none of the formats is refused here, before
        launch where the columns are known (a local folder, a shard set)."""
        self._format = data_format(set(columns), self.options.dataset_text_field)
        if columns and self._format is None:
            raise UserError(
                f"The training split has columns {', '.join(columns)}: text-generation needs "
                f"{FORMATS_LINE}."
            )
        return None

    def file_layout(self) -> LocalLayout | None:
        """run_clm.py's --train_file and --validation_file, read as the splits train and
        validation."""
        return named_files_layout(self.options.data_files(), self.data_args.dataset_name)

    def check_model(self) -> None:
        """A model without a chat template, for chats, is one line naming --chat_template;
        read from the model folder's files where it is local."""
        path = self.model_args.model_name_or_path
        if path and looks_like_path(path) and self.options.eos_token:
            from transformers import AutoTokenizer

            set_special_tokens(AutoTokenizer.from_pretrained(path), self.options)
        if self.options.chat_template or self._format == "text" or not path:
            return
        if looks_like_path(path) and Path(path).is_dir() and not has_chat_template(Path(path)):
            raise UserError(no_template_line(path))

    @classmethod
    def check_training_values(cls, training: Mapping[str, Any]) -> None:
        """--use_liger_kernel without Liger installed would fail every training process."""
        import importlib.util

        if training.get("use_liger_kernel") and importlib.util.find_spec("liger_kernel") is None:
            raise UserError("--use_liger_kernel: Liger's kernels (pip install liger-kernel, CUDA "
                            "only) are not installed here; leave it out.")  # fmt: skip

    @classmethod
    def required_training_arguments(cls, training: Mapping[str, Any]) -> dict[str, Any]:
        # the loss is all an evaluation keeps (a language model's logits are vocabulary-wide)
        return {"prediction_loss_only": True}

    # -- the model -----------------------------------------------------------------------------

    def build_model_and_processor(self) -> tuple[PreTrainedModel, Any]:
        return self.load_model(quantized=True), self.load_tokenizer()

    def load_tokenizer(self):
        tokenizer = self.templated_tokenizer()
        set_special_tokens(tokenizer, self.options)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self._tokenizer = tokenizer
        return tokenizer

    def activation_values_per_sample(self, model: PreTrainedModel) -> tuple[int, int]:
        """A decoder layer keeps about 34 s h values for s positions of width h with fused
        attention (Korthikanti et al. 2022, sec. 4.1: 34 s b h bytes at 16 bits, here
        counted in values: 17), plus three tensors of s x vocabulary (fp32 for the loss):
        the logits, the log-softmax the loss keeps, and a gradient of that width during the
        loss's backward, when every layer's activations are still held (measured on CPU:
        bench/chat_memory.py, docs/benchmarks.md); with checkpointing, each layer's input
        plus one layer being recomputed."""
        config = model.config.get_text_config()
        s, h = self.options.max_seq_length, config.hidden_size
        layer = decoder_layer_values(config, s)
        logits = 3 * s * config.vocab_size
        full = config.num_hidden_layers * layer + logits
        return full, config.num_hidden_layers * s * h + layer + logits

    def forward_flops_per_sample(self, model: PreTrainedModel):
        return encoder_forward_flops(model, self.options.max_seq_length)

    # -- the data ------------------------------------------------------------------------------

    def load_source(self, spec: str, streaming: bool = False):
        """A split; a stream decoded (the sources leave a stream's media undecoded, and a
        stream of chats undecoded holds each turn as a JSON text)."""
        dataset, _ = load_split(self.data_args, self.model_args.cache_dir, spec,
                                self.detect_local_layout, streaming,
                                self.file_layout())  # fmt: skip
        return dataset.decode(True) if is_stream(dataset) and dataset.features else dataset

    def source_format(self, dataset: Dataset | IterableDataset, where: str) -> str:
        first = _first_row(dataset)
        columns = dataset.column_names or list(first or {})
        found = data_format(set(columns), self.options.dataset_text_field)
        if found is None:
            raise UserError(f"{where} has columns {', '.join(columns)}: "
                            f"text-generation needs {FORMATS_LINE}.")  # fmt: skip
        column = "messages" if found == "conversational" else "prompt"
        if (
            found != "text"
            and not self._tokenizer.chat_template
            and isinstance((first or {}).get(column), list)
        ):
            raise UserError(no_template_line(self.model_args.model_name_or_path))
        return found

    def load_datasets(self, processor) -> tuple[Dataset, Dataset | None]:
        self._tokenizer = processor
        data = self.data_args
        spec, mixture = data.train_split_name, mixture_of(data, self.options)
        evaluation, eval_spec = None, data.eval_split_name
        if mixture is not None:
            spec, eval_spec = "train", "test"  # of the mixture
            train, evaluation = self.mixed(mixture)
        else:
            train = self.interleaved(lambda source: source.load_source(spec, data.streaming))
        if data.train_val_split is not None:
            where = f"split {spec} of {self.data_name}"
            train, evaluation = split_off_evaluation(train, data.train_val_split, self.seed, where)
            eval_spec = f"{spec} (--train_val_split part)"
        elif eval_spec and mixture is None:
            evaluation = self.sources()[0].load_source(eval_spec)
        train = first_examples(train, data.max_train_samples)
        train = (self.streamed if is_stream(train) else self.tokenised)(train, spec, True)
        if evaluation is not None:
            evaluation = first_examples(evaluation, data.max_eval_samples)
            self._samples = self.prompts(evaluation, self.options.generation_samples)
            evaluation = self.tokenised(evaluation, eval_spec, False)
        return train, evaluation

    @property
    def data_name(self) -> str:
        """How messages name the data: the dataset, the data files, or the mixture."""
        if self.data_args.dataset_name:
            return self.data_args.dataset_name
        return "the mixture" if self.options.dataset_mixture else FILES

    def mixed(self, mixture: Mixture) -> tuple[Dataset, Dataset | None]:
        """A mixture's training and evaluation splits, each dataset read as `--dataset_name`
        reads one; the handbook's mixer keeps the columns of the formats read."""
        sources = dict(zip(mixture.datasets, self.sources(), strict=True))
        text = self.options.dataset_text_field
        keep = ["messages", "prompt", "completion", *([text] if text else [])]
        return mixed_splits(mixture, lambda entry, split: sources[entry].load_source(split),
                            keep, self.seed)  # fmt: skip

    def tokenised(self, dataset: Dataset, spec: str, training: bool) -> Dataset:
        """The split as token ids and labels; bad rows skipped and counted, long ones cut and
        counted (one line each), rows left with nothing to learn dropped."""
        where = f"split {spec} of {self.data_name}"
        found = self.source_format(dataset, where)
        encoded = self.encoded(dataset, found, spec, where)
        keep = self.without_bad_rows(encoded["bad"], where, training)
        learnt = encoded["learnt"]
        self.report_long(encoded["truncated"], learnt, keep, where)
        kept = [i for i in keep if learnt[i]]
        return encoded.select(kept).select_columns(list(TOKENISED))

    def streamed(self, stream: IterableDataset, spec: str, training: bool) -> IterableDataset:
        """A training stream tokenised as it is read (stream.py): the same
        examples, bad and long rows counted by the training process. How the loss is masked
        is chosen on the stream's first rows (a split read whole tries all its rows)."""
        where = f"split {spec} of {self.data_name}"
        found = self.source_format(stream, where)
        tokenizer, rows = self._tokenizer, list(stream.take(PROBED_ROWS))

        def probed(marked: str | None) -> str | None:
            for row in rows:
                _encoded(tokenizer, found, self.options, marked, row)
            return marked

        marked = self.masked_by(where, probed)
        encoder = StreamEncoder(tokenizer, found, self.options, marked, self.options.packing)
        return tokenised_stream(stream, encoder)

    def without_bad_rows(self, verdicts: list[str], where: str, training: bool) -> list[int]:
        """The rows to keep: all but the bad ones, counted in one line (UserError past
        --max_bad_examples)."""
        bad = [(index, why) for index, why in enumerate(verdicts) if why]
        if not bad:
            return list(range(len(verdicts)))
        names = ", ".join(f"row {index} ({why})" for index, why in bad[:NAMES_SHOWN])
        names += ", ..." if len(bad) > NAMES_SHOWN else ""
        allowed = self.data_args.max_bad_examples
        limit = check_limit(len(bad), len(verdicts), f"rows of {where}", allowed, names,
                            "are no chat, pair or text", "is one")  # fmt: skip
        skipped = f"rows of {where} (first: {names})"
        return skip_counted(len(verdicts), [i for i, _ in bad], skipped, allowed, limit,
                            where if training else None)  # fmt: skip

    def encoded(self, dataset: Dataset, found: str, spec: str, where: str) -> Dataset:
        """Each row's ids, labels and verdicts (chat_examples.py), masked as `masked_by`
        finds the turns."""

        def mapped(marked: str | None) -> Dataset:
            encode = partial(_encoded, self._tokenizer, found, self.options, marked)
            return dataset.map(encode, remove_columns=dataset.column_names,
                               num_proc=self.data_args.preprocessing_num_workers,
                               desc=f"Tokenising {spec}")  # fmt: skip

        return self.masked_by(where, mapped)

    def masked_by(self, where: str, encode: Callable[[str | None], Any]) -> Any:
        """`encode(marked)` with the loss mask found by the template's own generation markers
        if it has them, else by rendering (`marked` None), else by TRL's marked copy of the
        template; refused in one line when none of them can find the turns."""
        try:
            return encode(marked_template(self._tokenizer.chat_template))
        except TemplateNotSplittable as error:
            trls = training_template(self._tokenizer)
            if trls is None:
                raise UserError(unsplittable_line(where, error)) from None
        try:
            return encode(trls)
        except TemplateNotSplittable as error:
            raise UserError(unsplittable_line(where, error)) from None

    def report_long(self, truncated: list, learnt: list, keep: list[int], where: str) -> None:
        long = [i for i in keep if truncated[i]]
        if not long:
            return
        limit = self.options.max_seq_length
        if self.options.refuse_long_examples:
            raise UserError(f"{len(long)} of {len(keep)} rows of {where} are longer than "
                            f"--max_seq_length {limit} tokens (first: row {long[0]}); "
                            "--refuse_long_examples false cuts them.")  # fmt: skip
        empty = sum(1 for i in long if not learnt[i])
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"warning: cut {len(long)} of {len(keep)} rows of {where} to --max_seq_length "
                  f"{limit} tokens" + (f" ({empty} left nothing to learn: dropped)"
                                       if empty else ""), flush=True)  # fmt: skip

    def prompts(self, dataset: Dataset, count: int) -> list[tuple[Any, str]]:
        """The first `count` (prompt, reference) pairs of an evaluation split."""
        found = data_format(set(dataset.column_names), self.options.dataset_text_field)
        pairs = []
        for row in dataset.select(range(min(count * 4, len(dataset)))):
            pair = prompt_and_reference(row, found)
            if pair is not None:
                pairs.append(pair)
        return pairs[:count]

    def load_test_split(self, processor) -> Dataset:
        """The test split's prompts (a chat up to its last assistant turn, a pair's prompt)
        and references, each with its id."""
        spec = self.data_args.test_split_name
        source = self.sources()[0].load_source(spec)
        found = data_format(set(source.column_names), self.options.dataset_text_field)
        pairs = [prompt_and_reference(row, found) for row in source]
        rows = {PROMPT_JSON: [json.dumps(p[0] if p else "") for p in pairs],
                REFERENCE: [p[1] if p else None for p in pairs]}  # fmt: skip
        from datasets import Dataset

        return with_example_ids(Dataset.from_dict(rows), source)

    def references(self, dataset: Dataset) -> list:
        return list(dataset[REFERENCE])

    def predicted_values(self, predictions: Any, processor: Any) -> list[dict]:
        """The trainer's answers as they are: made by the server's own `continuation`
        (serving.py, chat_trainer.py `generate_all`)."""
        return list(predictions)

    def data_collator(self, processor: Any):
        return None  # TRL's own (padding-free when packing)

    def compute_metrics(self, processor: Any) -> Callable | None:
        return None  # the loss and its perplexity (chat_trainer.py)

    @property
    def trainer_class(self):
        from trainer.tasks.text_generation.trainer import ChatTrainer

        where = f"split {self.data_args.train_split_name} of {self.data_name}"
        return partial(ChatTrainer, chat=self.options, samples=self._samples, where=where)


def _first_row(dataset: Dataset | IterableDataset) -> dict | None:
    """The first row of a split or stream (None: it has none)."""
    return next(iter(dataset.take(1) if is_stream(dataset) else dataset.select(range(1))), None)


def unsplittable_line(where: str, error: TemplateNotSplittable) -> str:
    return (f"{where}: {error}, and TRL has no marked copy of it: --assistant_only_loss false "
            "trains on the whole chat, or give a --chat_template whose assistant output is "
            "inside {% generation %} ... {% endgeneration %}.")  # fmt: skip


def _encoded(tokenizer, found: str, options: ChatArguments, marked: str | None, row: dict) -> dict:
    try:
        encoded = encode_row(tokenizer, row, found, options, marked)
    except BadRow as error:
        return {"input_ids": [], "labels": [], "bad": str(error), "truncated": False,
                "learnt": False}  # fmt: skip
    learnt = any(label != -100 for label in encoded.labels)
    return {"input_ids": encoded.input_ids, "labels": encoded.labels, "bad": "",
            "truncated": encoded.truncated, "learnt": learnt}  # fmt: skip


def prompt_and_reference(row: dict, found: str | None) -> tuple[Any, str] | None:
    """A row's prompt (text, or turns up to the last assistant turn) and the answer it has."""
    if found == "conversational":
        return _chat_prompt(row.get("messages"))
    if found == "prompt-completion":
        completion = row.get("completion")
        if isinstance(completion, list):
            last = completion[-1] if completion else None
            completion = last.get("content") if isinstance(last, dict) else ""
        return row.get("prompt"), str(completion)
    return None


def _chat_prompt(messages: Any) -> tuple[list, str] | None:
    """A chat's turns before its last (an assistant turn) and that turn's text."""
    if not isinstance(messages, list) or len(messages) < 2:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return None
    return list(messages[:-1]), str(last.get("content"))


def set_special_tokens(tokenizer, options: ChatArguments) -> None:
    """--eos_token (TRL's), one of the vocabulary's tokens, as TRL's SFTTrainer sets it: the
    tokenizer's end-of-sequence token (TRL then gives the model's config and generation config
    the new end, trainer.py)."""
    token = options.eos_token
    if token is None:
        return
    if token not in tokenizer.get_vocab():
        raise UserError(f"--eos_token {token} is not a token of the tokenizer's vocabulary: "
                        "give one of its tokens (tokenizer.json).")  # fmt: skip
    tokenizer.eos_token = token


def has_chat_template(model_dir: Path) -> bool:
    """A chat template in the model folder: chat_template.jinja (transformers 5), or
    tokenizer_config.json's `chat_template`."""
    if (model_dir / "chat_template.jinja").is_file() or (
        model_dir / "chat_template.json"
    ).is_file():
        return True
    config = model_dir / "tokenizer_config.json"
    try:
        return bool(json.loads(config.read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False


def no_template_line(model: str | None) -> str:
    return (f"{model} has no chat template (a base model): give one with --chat_template "
            "FILE.jinja, or train on plain text (--dataset_text_field).")  # fmt: skip
