"""Flags users bring from elsewhere, and this trainer's answer to each: the one table.

Command lines are copied from the Hugging Face example scripts (run_speech_recognition_
seq2seq.py, run_image_classification.py, run_glue.py, run_classification.py), from blog
posts written for transformers 4 (whose `TrainingArguments` lost flags in 5), from the
torchrun, accelerate and DeepSpeed launchers, and from the recipes this project grew out of
(a Whisper `TrainConfig`, a BERT package). Every such flag that is not already ours is
here, with what happens to it:
- renamed: read as one of our flags, the value unchanged (`--warmup_ratio 0.1` is
  `--warmup_steps 0.1`: transformers 5 takes a fraction there);
- switch: a true boolean becomes some of our flags (`--group_by_length` is
  `--train_sampling_strategy group_by_length`); false asks for what happens anyway;
- mapped: each accepted value becomes some of our flags (`--mixed_precision bf16`,
  `--task_name mrpc`); another value is one `error:` line listing the accepted ones;
- ignored: it asks for what this trainer does anyway, or for nothing it could do
  differently; one notice line says so;
- refused: honouring it silently would train something other than what the user asked;
  one `error:` line names what to use instead (a false boolean is dropped: it asks for
  nothing).
trainer/command_line/example_flags.py applies the table; `python -m
trainer.command_line.foreign_flags --write` regenerates the table in docs/launching.md from
it (a test compares the two).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainer.tasks.speech_recognition.whisper_sizes import WHISPER_SIZES
from trainer.tasks.text_classification.training import GLUE_TEXT_COLUMNS

SEQ2SEQ = "run_speech_recognition_seq2seq.py"
IMAGE = "run_image_classification.py"
GLUE = "run_glue.py"
CLASSIFICATION = "run_classification.py"
TEXT_SCRIPTS = f"{GLUE}, {CLASSIFICATION}"
ALL_SCRIPTS = "the example scripts"
EVENT = "Whisper fine-tuning event"
TF4 = "transformers 4 TrainingArguments"
TORCHRUN = "torchrun"
ACCELERATE = "accelerate launch"
DEEPSPEED = "deepspeed launcher"
WHISPER_SEED = "Whisper TrainConfig (seed recipe)"
BERT_SEED = "BERT package (seed recipe)"
NO_TRAINER = "the no_trainer example scripts"
CTC = "run_speech_recognition_ctc.py"
COMMUNITY_WHISPER = "vasistalodagala/whisper-finetune"
COMMUNITY = "community fine-tuning scripts"
TRL = "trl sft, SFTConfig"
TRL_SCRIPT = "trl sft, ScriptArguments"
TRL_MODEL = "trl sft, ModelConfig"
TRL_CLI = "trl sft's launch flags"
TRL_OLD = "older TRL scripts and the alignment-handbook"
LLAMA_FACTORY = "LLaMA-Factory"
ZERO3 = "parameters are sharded by DeepSpeed ZeRO: --deepspeed zero3"

CLUSTER = (
    "nodes and ranks come from CLUSTER_SPEC (on Vertex AI: the replica count of "
    "workerpool1); give --nproc_per_node for processes per node"
)
ONE_FOLDER = (
    "the model folder's own config and processor are used: put them in one folder and "
    "give it as --model_name_or_path"
)
ONE_DATASET = (
    "give one dataset as --dataset_name, with --dataset_config_name, --train_split_name, "
    "--eval_split_name and --text_column_name; several as streams: --streaming true "
    "--dataset_name A,B --interleave_probabilities P,Q"
)
MODEL_CONFIG = (
    "model settings come from the model folder's config.json, not from flags (SpecAugment: "
    "apply_spec_augment true, mask_time_prob): set them there and give the folder as "
    "--model_name_or_path"
)


@dataclass(frozen=True)
class ForeignFlag:
    kind: str
    """renamed, switch, mapped, ignored or refused (see the module docstring)."""
    source: str
    """Where users bring it from."""
    takes_value: bool
    """False: a boolean, whose optional value is a true/false word."""
    answer: str = ""
    """renamed: our flag; ignored: why nothing changes; refused: what to use instead."""
    tokens: tuple[str, ...] = ()
    """switch: our flags for a true value."""
    values: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """mapped: accepted value -> our flags."""
    check: Callable[[str], str | None] | None = None
    """renamed, mapped: returns what to use instead when the value means something else here."""
    note: str = ""
    """renamed, switch: what the user may have meant instead, said in the notice too."""
    passes_others: bool = False
    """mapped: a value not in `values` is left to the task's own flag of the same name (TRL's
    `--loss_type`: SFT's `nll` sets nothing; DPO's are preference tuning's `--loss_type`)."""

    def flags_set(self) -> set[str]:
        """Our flags it may set: a renamed one's, a switch's, any value's of a mapped one."""
        if self.kind == "renamed":
            return {self.answer}
        tokens = [*self.tokens, *(token for tokens in self.values.values() for token in tokens)]
        return {token for token in tokens if token.startswith("--")}

    def describe(self) -> str:
        """What happens to the flag, for the table in docs/launching.md."""
        if self.kind in ("renamed", "switch"):
            note = f" ({_code(self.note)})" if self.note else ""
            if self.kind == "renamed":
                return f"accepted as `{self.answer}`{note}"
            return f"accepted: true is `{' '.join(self.tokens)}`{note}"
        note = _code(self.answer)
        if self.kind == "mapped":
            shown = "; ".join(
                f"`{value}` is `{' '.join(tokens)}`" if tokens else f"`{value}` sets nothing"
                for value, tokens in self.values.items()
            )
            others = "; other values are the task's own flag" if self.passes_others else ""
            return f"accepted: {shown}{others}" + (f" ({note})" if note else "")
        return f"{self.kind}: {note}"


def _code(text: str) -> str:
    """Flags in `text` as Markdown code."""
    return re.sub(r"(--[a-z_0-9]+)", r"`\1`", text)


def renamed(target, source, takes_value=True, check=None, note="") -> ForeignFlag:
    return ForeignFlag("renamed", source, takes_value, target, check=check, note=note)


def switch(tokens, source, note="") -> ForeignFlag:
    return ForeignFlag("switch", source, False, tokens=tuple(tokens), note=note)


def mapped(values, source, note="", passes_others=False, check=None) -> ForeignFlag:
    return ForeignFlag("mapped", source, True, note, values=values, check=check,
                       passes_others=passes_others)  # fmt: skip


def ignored(reason, source, takes_value=False) -> ForeignFlag:
    return ForeignFlag("ignored", source, takes_value, reason)


def refused(hint, source, takes_value=True) -> ForeignFlag:
    return ForeignFlag("refused", source, takes_value, hint)


def _sft_loss(value: str) -> str | None:
    """TRL SFT's other loss, dft, which the text generation task does not train."""
    if value != "dft":
        return None
    return "dft (TRL's dynamic fine-tuning loss) is not trained here: leave it out (nll)"


def _a_template_file(value: str) -> str | None:
    """TRL's --chat_template_path also takes a tokenizer folder; --chat_template, a file."""
    if not Path(value).is_dir():
        return None
    return ("give the template file itself as --chat_template (a folder's is its "
            "chat_template.jinja)")  # fmt: skip


DTYPES = {"bfloat16": ("--bf16", "true"), "float16": ("--fp16", "true"), "float32": (),
          "auto": ()}  # fmt: skip
DTYPE_NOTE = "weights load in fp32 to train; --bf16 or --fp16 is the precision steps compute in"


def _a_fraction(value: str) -> str | None:
    """transformers 5's --warmup_steps reads a value below 1 as a fraction of the steps."""
    try:
        fraction = float(value)
    except ValueError:
        return None  # the parser of --warmup_steps says what is wrong with it
    if 0 <= fraction < 1:
        return None
    return "give the warm-up as --warmup_steps N (steps) or a fraction below 1"


def _steps(value: str) -> str | None:
    """The *_no_trainer scripts' --checkpointing_steps is a step count or `epoch`."""
    if value.isdigit():
        return None
    return "give --save_strategy epoch (a checkpoint per epoch) or --save_steps N"


GLUE_COLUMNS = {
    task: ",".join(GLUE_TEXT_COLUMNS[task])
    for task in ("cola", "sst2", "mrpc", "qqp", "qnli", "rte", "wnli", "mnli")
}
"""run_glue.py's --task_name -> its text column(s) (two: a sentence pair). stsb is a regression
task, which this trainer does not train; the test splits have no labels, so evaluation uses
validation (validation_matched for mnli)."""


def _glue(task: str) -> tuple[str, ...]:
    split = "validation_matched" if task == "mnli" else "validation"
    return ("--task", "text-classification", "--dataset_name", "nyu-mll/glue",
            "--dataset_config_name", task, "--text_column_name", GLUE_COLUMNS[task],
            "--eval_split_name", split)  # fmt: skip


FOREIGN_FLAGS: dict[str, ForeignFlag] = {
    # The example scripts' own flags that are not ours --------------------------------------
    "--task_name": mapped({task: _glue(task) for task in GLUE_COLUMNS}, GLUE,
                          "stsb is regression, which this trainer does not train"),
    "--train_dir": renamed("--dataset_name", IMAGE),
    "--validation_dir": refused("put train/ and validation/ folders in one folder, give it as "
                                "--dataset_name and add --eval_split_name validation", IMAGE),
    "--max_length": renamed("--max_seq_length", f"run_glue_no_trainer.py, {TRL}"),
    "--max_prompt_length": refused("this TRL's DPOConfig has no prompt limit of its own: give "
                                   "--max_seq_length (TRL's --max_length), the length of a "
                                   "prompt with its answer", "trl dpo (before 1.0), the "
                                   "alignment-handbook's DPO recipes"),
    # trl sft and its SFTConfig / ModelConfig (--task text-generation) --------------------
    "--use_peft": switch(["--peft", "lora"], TRL),
    "--dtype": mapped(DTYPES, TRL, DTYPE_NOTE),
    "--torch_dtype": mapped(DTYPES, TRL, DTYPE_NOTE),
    "--chat_template_path": renamed("--chat_template", TRL, check=_a_template_file),
    "--dataset_config": renamed("--dataset_config_name", TRL_SCRIPT),
    "--dataset_configs": renamed("--dataset_config_name", "open-r1's recipes"),
    "--dataset_mixer": renamed("--dataset_mixture", TRL_OLD),
    "--dataset_train_split": renamed("--train_split_name", TRL_SCRIPT),
    "--dataset_test_split": renamed("--eval_split_name", TRL_SCRIPT,
                                    note="TRL evaluates on its test split, as this does"),
    "--dataset_streaming": renamed("--streaming", TRL_SCRIPT, takes_value=False),
    "--ignore_bias_buffers": ignored("a DDP workaround of TRL's scripts for boolean buffers; "
                                     "training here runs under DeepSpeed unless --deepspeed "
                                     "none", TRL_SCRIPT),
    "--pad_token": ignored("padded positions carry no loss: the tokenizer's padding token "
                           "(else its end-of-sequence token) pads", TRL, takes_value=True),
    "--dataset_num_proc": renamed("--preprocessing_num_workers", TRL),
    "--dataset_kwargs": refused("the data is tokenised here before TRL sees it (TRL's "
                                "skip_prepare_dataset, always); the columns are a messages "
                                "column, prompt and completion, or --dataset_text_field", TRL),
    "--model_init_kwargs": refused("give the loading settings as flags: --bf16 (TRL's dtype), "
                                   "--attn_implementation, --load_in_4bit; others go in the "
                                   "model folder's config.json", TRL),
    "--router_aux_loss_coef": refused("set output_router_logits and router_aux_loss_coef in the "
                                      "model folder's config.json and give the folder as "
                                      "--model_name_or_path", TRL),
    "--truncation_mode": mapped({"keep_start": ()}, TRL, "longer examples are cut at the end; "
                                "--refuse_long_examples true refuses them instead"),
    "--shuffle_dataset": ignored("the Trainer shuffles the training set every epoch anyway", TRL),
    "--packing_strategy": mapped({"bfd": ()}, TRL, "--packing true packs best-fit-decreasing"),
    "--padding_free": refused("--packing true packs examples padding-free (no token attends "
                              "across examples); unpacked batches pad to their longest", TRL,
                              takes_value=False),
    "--pad_to_multiple_of": ignored("each batch pads to its longest example", TRL,
                                    takes_value=True),
    "--eval_packing": ignored("evaluation examples are evaluated unpacked, each alone", TRL),
    "--loss_type": mapped({"nll": ()}, TRL, "SFT's loss is the tokens' negative "
                          "log-likelihood, dft is not trained here; DPO's loss types are the "
                          "preference-tuning task's own", passes_others=True,
                          check=_sft_loss),
    "--activation_offloading": refused("--gradient_checkpointing true saves activation memory; "
                                       "--deepspeed zero3-offload offloads the optimizer and "
                                       "parameters", TRL, takes_value=False),
    "--lora_target_parameters": refused("adapters go on modules: --lora_target_modules",
                                        TRL_MODEL),
    "--lora_modules_to_save": refused("with --peft lora only the adapters train; --peft none "
                                      "trains every weight", TRL_MODEL),
    "--lora_task_type": mapped({"CAUSAL_LM": ()}, TRL_MODEL, "the task sets it"),
    "--use_rslora": refused("rank-stabilised LoRA is not trained here: adapters scale by "
                            "--lora_alpha / --lora_r", TRL_MODEL, takes_value=False),
    "--use_dora": refused("DoRA is not trained here: --peft lora trains LoRA adapters",
                          TRL_MODEL, takes_value=False),
    "--bnb_4bit_quant_type": mapped({"nf4": ()}, TRL_MODEL, "--load_in_4bit loads NF4"),
    "--use_bnb_nested_quant": ignored("--load_in_4bit always quantises the quantisation "
                                      "constants too (QLoRA's double quantisation)", TRL_MODEL),
    "--bnb_4bit_quant_storage": mapped({"uint8": ()}, TRL_MODEL, "4-bit weights are stored as "
                                       "uint8; another storage type is for FSDP, and " + ZERO3),
    "--use_flash_attention_2": switch(["--attn_implementation", "flash_attention_2"], TRL_OLD),
    "--log_with": renamed("--report_to", TRL_OLD),
    "--dataset_splits": refused("name the splits with --train_split_name and --eval_split_name",
                                TRL_OLD),
    "--accelerate_config": mapped({"zero2": ("--deepspeed", "zero2"),
                                   "zero3": ("--deepspeed", "zero3"),
                                   "multi_gpu": ("--deepspeed", "none"),
                                   "single_gpu": ("--nproc_per_node", "1", "--deepspeed",
                                                  "none")}, TRL_CLI,
                                  "zero1: --deepspeed zero2; fsdp1, fsdp2: " + ZERO3),
    "--lora_rank": renamed("--lora_r", LLAMA_FACTORY),
    "--ignore_mismatched_sizes": ignored("a new classification head sized for the dataset's "
                                         "labels is always made", f"{IMAGE}, {TEXT_SCRIPTS}"),
    "--model_type": refused(f"{ONE_FOLDER} (its config.json names the type)", IMAGE),
    "--config_name": refused(ONE_FOLDER, ALL_SCRIPTS),
    "--tokenizer_name": refused(ONE_FOLDER, f"{SEQ2SEQ}, {TEXT_SCRIPTS}"),
    "--feature_extractor_name": refused(ONE_FOLDER, SEQ2SEQ),
    "--image_processor_name": refused(ONE_FOLDER, IMAGE),
    "--model_revision": mapped({"main": ()}, ALL_SCRIPTS,
                               "the model as given is read; another revision: download it "
                               "(hf download ID --revision REV --local-dir DIR) and give DIR "
                               "as --model_name_or_path"),
    "--use_fast_tokenizer": ignored("the fast tokenizer is always used", ALL_SCRIPTS),
    "--token": refused("a token on the command line is written into the job spec and its "
                       "logs: set HF_TOKEN in the environment, or --secret HF_TOKEN=projects/"
                       "P/secrets/S/versions/V on Vertex AI", ALL_SCRIPTS),
    "--use_auth_token": ignored("the Hub client uses the token of `hf auth login` or "
                                "HF_TOKEN by itself", EVENT),
    "--trust_remote_code": refused("no code from the Hub is run: the tasks use transformers' "
                                   "own model classes", ALL_SCRIPTS, takes_value=False),
    "--freeze_feature_encoder": refused("Whisper has no separate feature encoder; "
                                        "--freeze_encoder true freezes its whole audio encoder",
                                        SEQ2SEQ, takes_value=False),
    "--forced_decoder_ids": ignored("the prompt is built from --language and --whisper_task "
                                    "(a checkpoint's forced_decoder_ids are cleared)",
                                    SEQ2SEQ, takes_value=True),
    "--suppress_tokens": ignored("the checkpoint's generation config keeps its own "
                                 "suppress_tokens", SEQ2SEQ, takes_value=True),
    "--apply_spec_augment": refused(MODEL_CONFIG, SEQ2SEQ, takes_value=False),
    "--mask_time_prob": refused(MODEL_CONFIG, CTC),
    "--text_column": ignored("the script reads --text_column_name, as this trainer does",
                             SEQ2SEQ, takes_value=True),
    "--overwrite_cache": ignored("datasets' caches are keyed by the data and the processing",
                                 ALL_SCRIPTS),
    "--preprocessing_only": refused("there is no separate preprocessing pass: inputs are "
                                    "processed batch by batch in the collator", SEQ2SEQ,
                                    takes_value=False),
    "--model_index_name": ignored("it only names the model card of a push to the Hub", EVENT,
                                  takes_value=True),
    "--shuffle_train_dataset": ignored("the Trainer shuffles the training set every epoch "
                                       "anyway", CLASSIFICATION),
    "--shuffle_seed": ignored("the training order follows --seed", CLASSIFICATION,
                              takes_value=True),
    "--remove_splits": ignored("only the splits named by --train_split_name, "
                               "--eval_split_name and (with --do_predict) --test_split_name "
                               "are read", CLASSIFICATION, takes_value=True),
    "--remove_columns": ignored("only the input and label columns are read", CLASSIFICATION,
                                takes_value=True),
    "--pad_to_max_length": ignored("each batch is padded to its longest text (dynamic "
                                   "padding); --max_seq_length still truncates", TEXT_SCRIPTS),
    "--max_predict_samples": ignored("--do_predict predicts the whole --test_split_name",
                                     TEXT_SCRIPTS, takes_value=True),
    "--validation_split_name": renamed("--eval_split_name", CLASSIFICATION),
    "--text_column_names": renamed("--joined_text_columns", CLASSIFICATION),
    "--do_regression": refused("regression is not trained here: text-classification "
                               "predicts classes", CLASSIFICATION, takes_value=False),
    "--metric_name": refused("every evaluation reports all of the task's metrics; choose the "
                             "one that selects the best checkpoint with "
                             "--metric_for_best_model", CLASSIFICATION),
    # transformers 4's TrainingArguments flags that 5 removed -------------------------------
    "--evaluation_strategy": renamed("--eval_strategy", TF4),
    "--warmup_ratio": renamed("--warmup_steps", TF4, check=_a_fraction),
    "--logging_dir": renamed("--tensorboard_dir", TF4),
    "--group_by_length": switch(["--train_sampling_strategy", "group_by_length"], TF4),
    "--overwrite_output_dir": switch(["--resume", "never"], TF4,
                                     "training starts from step 1, on every Vertex AI "
                                     "restart of the job too (left out, a restart resumes); "
                                     "the checkpoints already there are not resumed, nor "
                                     "deleted at the start, but a save of the same step "
                                     "replaces one and --save_total_limit counts them"),
    "--no_cuda": switch(["--use_cpu", "true"], TF4),
    "--use_mps_device": ignored("transformers uses an Apple GPU by itself where there is one "
                                "(there is none on Vertex AI)", TF4),
    "--fp16_backend": ignored("mixed precision is torch's autocast (amp); apex is not used",
                              TF4, takes_value=True),
    "--half_precision_backend": ignored("mixed precision is torch's autocast (amp)", TF4,
                                        takes_value=True),
    "--fp16_opt_level": ignored("it set apex's level; apex is not used", TF4, takes_value=True),
    "--push_to_hub_token": renamed("--hub_token", TF4),
    "--push_to_hub_model_id": renamed("--hub_model_id", TF4),
    "--push_to_hub_organization": refused("give the repository as --hub_model_id ORG/NAME", TF4),
    "--per_gpu_train_batch_size": renamed("--per_device_train_batch_size", TF4),
    "--per_gpu_eval_batch_size": renamed("--per_device_eval_batch_size", TF4),
    "--adafactor": switch(["--optim", "adafactor"], TF4),
    "--include_inputs_for_metrics": switch(["--include_for_metrics", "inputs"], TF4),
    "--include_tokens_per_second": ignored("transformers 5 removed it; the progress lines "
                                           "give the time per step", TF4),
    "--save_safetensors": ignored("checkpoints are always safetensors in transformers 5", TF4),
    "--use_legacy_prediction_loop": ignored("transformers 5 has one prediction loop", TF4),
    "--past_index": ignored("only models with memories (Transformer-XL, XLNet) used it; none "
                            "of this trainer's tasks do", TF4, takes_value=True),
    "--jit_mode_eval": refused("TorchScript is not used; --torch_compile true compiles the "
                               "model", TF4, takes_value=False),
    "--torchdynamo": refused("give --torch_compile true --torch_compile_backend BACKEND", TF4),
    "--use_ipex": refused("Intel's extension is not in this image; leave it out", TF4,
                          takes_value=False),
    "--tpu_num_cores": refused("this image trains on GPUs (or CPUs), not TPUs", TF4),
    "--tpu_metrics_debug": refused("this image trains on GPUs (or CPUs), not TPUs", TF4,
                                   takes_value=False),
    "--mp_parameters": ignored("it was for SageMaker model parallelism", TF4, takes_value=True),
    "--ray_scope": refused("Ray Tune is not used; Vertex AI hyperparameter tuning reads "
                           "--metric_for_best_model (python -m trainer.jobspec)", TF4),
    "--fsdp_min_num_params": refused("parameters are sharded by DeepSpeed ZeRO: "
                                     "--deepspeed zero3", TF4),
    "--fsdp_transformer_layer_cls_to_wrap": refused("parameters are sharded by DeepSpeed "
                                                    "ZeRO: --deepspeed zero3", TF4),
    # the launchers' flags ------------------------------------------------------------------
    "--nnodes": refused(CLUSTER, TORCHRUN),
    "--node_rank": refused(CLUSTER, TORCHRUN),
    "--master_addr": refused("the chief's address comes from CLUSTER_SPEC (a single node "
                             "without it uses 127.0.0.1)", f"{TORCHRUN}, {DEEPSPEED}"),
    "--rdzv_backend": ignored("the nodes meet at the chief from CLUSTER_SPEC (static "
                              "rendezvous); --rdzv_timeout sets the wait", TORCHRUN,
                              takes_value=True),
    "--rdzv_endpoint": refused("the chief's address comes from CLUSTER_SPEC; --master_port "
                               "sets the port", TORCHRUN),
    "--rdzv_id": ignored("one job is one rendezvous", TORCHRUN, takes_value=True),
    "--rdzv_conf": refused("give --rdzv_timeout SECONDS", TORCHRUN),
    "--max_restarts": refused("a failed process ends the job; Vertex AI restarts replicas "
                              "(docs/restarts.md)", f"{TORCHRUN}, {ACCELERATE}"),
    "--standalone": ignored("a node without CLUSTER_SPEC is a single-node run", TORCHRUN),
    "--monitor_interval": ignored("the launcher's agent keeps its own interval", TORCHRUN,
                                  takes_value=True),
    "--num_processes": refused("give --nproc_per_node (processes per node; the nodes come "
                               "from CLUSTER_SPEC)", ACCELERATE),
    "--num_machines": refused(CLUSTER, ACCELERATE),
    "--machine_rank": refused(CLUSTER, ACCELERATE),
    "--main_process_ip": refused("the chief's address comes from CLUSTER_SPEC", ACCELERATE),
    "--main_process_port": renamed("--master_port", ACCELERATE),
    "--mixed_precision": mapped({"bf16": ("--bf16", "true"), "fp16": ("--fp16", "true"),
                                 "no": ("--bf16", "false", "--fp16", "false")}, ACCELERATE,
                                "left out, the hardware decides"),
    "--multi_gpu": ignored("one process per GPU is the default", ACCELERATE),
    "--use_deepspeed": ignored("DeepSpeed is on unless --deepspeed none", ACCELERATE),
    "--deepspeed_config_file": renamed("--deepspeed", ACCELERATE),
    "--zero_stage": mapped({"2": ("--deepspeed", "zero2"), "3": ("--deepspeed", "zero3")},
                           ACCELERATE, "or a DeepSpeed JSON as --deepspeed PATH"),
    "--offload_optimizer_device": refused("give --deepspeed zero3-offload (or a DeepSpeed "
                                          "JSON as --deepspeed PATH)", ACCELERATE),
    "--offload_param_device": refused("give --deepspeed zero3-offload (or a DeepSpeed JSON as "
                                      "--deepspeed PATH)", ACCELERATE),
    "--deepspeed_multinode_launcher": ignored("torchrun's standard launcher is always used "
                                              "(Vertex AI has no ssh)", ACCELERATE,
                                              takes_value=True),
    "--config_file": refused("accelerate's config file is not read: give its settings as "
                             "flags (--nproc_per_node, --deepspeed, --bf16)", ACCELERATE),
    "--gpu_ids": refused("choose GPUs with CUDA_VISIBLE_DEVICES", ACCELERATE),
    "--num_cpu_threads_per_process": refused("set OMP_NUM_THREADS (default: the CPUs divided "
                                             "by the processes per node)", ACCELERATE),
    "--dynamo_backend": refused("give --torch_compile true --torch_compile_backend BACKEND",
                                ACCELERATE),
    "--cpu": switch(["--use_cpu", "true"], ACCELERATE),
    "--same_network": ignored("the nodes reach the chief by its name from CLUSTER_SPEC",
                              ACCELERATE),
    "--num_gpus": renamed("--nproc_per_node", DEEPSPEED),
    "--num_nodes": refused(CLUSTER, DEEPSPEED),
    "--hostfile": refused(CLUSTER, DEEPSPEED),
    "--include": refused("choose GPUs with CUDA_VISIBLE_DEVICES; nodes come from "
                         "CLUSTER_SPEC", DEEPSPEED),
    "--exclude": refused("choose GPUs with CUDA_VISIBLE_DEVICES; nodes come from "
                         "CLUSTER_SPEC", DEEPSPEED),
    "--launcher": ignored("torchrun's standard launcher is always used", DEEPSPEED,
                          takes_value=True),
    "--deepspeed_config": renamed("--deepspeed", DEEPSPEED),
    "--no_local_rank": ignored("the training processes read their rank from the "
                               "environment", DEEPSPEED),
    "--force_multi": ignored("the node count comes from CLUSTER_SPEC", DEEPSPEED),
    # the seed recipes' settings ------------------------------------------------------------
    "--model_size": mapped({size: ("--model_name_or_path", f"openai/whisper-{size}")
                            for size in WHISPER_SIZES}, WHISPER_SEED,
                           "or any checkpoint as --model_name_or_path"),
    "--use_gpu": mapped({"true": (), "false": ("--use_cpu", "true")}, WHISPER_SEED,
                        "GPUs are used when the node has them"),
    "--num_workers": renamed("--dataloader_num_workers", WHISPER_SEED,
                             note="data-loader workers per process; Ray's worker count is "
                             "--num_workers of python -m trainer.ray or trainer.ray_submit, "
                             "training processes per node are --nproc_per_node"),
    "--max_input_length": refused("give --max_duration_in_seconds (speech: seconds of audio) "
                                  "or --max_seq_length (text: tokens)", WHISPER_SEED),
    "--epochs": renamed("--num_train_epochs", BERT_SEED),
    "--batch_size": refused("give --per_device_train_batch_size (per process: the batch is "
                            "that x processes x --gradient_accumulation_steps)", BERT_SEED),
    # the *_no_trainer scripts (accelerate loops) -------------------------------------------
    "--checkpointing_steps": renamed("--save_steps", NO_TRAINER, check=_steps),
    "--with_tracking": ignored("metrics go to the trackers of --report_to (tensorboard "
                               "unless given)", NO_TRAINER),
    # community scripts ---------------------------------------------------------------------
    "--model_name": renamed("--model_name_or_path", COMMUNITY_WHISPER),
    "--num_proc": renamed("--preprocessing_num_workers", COMMUNITY_WHISPER),
    "--train_batchsize": renamed("--per_device_train_batch_size", COMMUNITY_WHISPER),
    "--eval_batchsize": renamed("--per_device_eval_batch_size", COMMUNITY_WHISPER),
    "--sampling_rate": ignored("audio is always resampled to 16 kHz, the rate Whisper's "
                               "feature extractor reads", COMMUNITY_WHISPER, takes_value=True),
    "--warmup": renamed("--warmup_steps", COMMUNITY_WHISPER),
    "--num_epochs": renamed("--num_train_epochs", COMMUNITY_WHISPER),
    "--num_steps": renamed("--max_steps", COMMUNITY_WHISPER),
    "--train_strategy": mapped({strategy: ("--eval_strategy", strategy, "--save_strategy",
                                           strategy) for strategy in ("steps", "epoch")},
                               COMMUNITY_WHISPER),
    "--resume_from_ckpt": renamed("--resume", COMMUNITY_WHISPER),
    **{f"--{split}_dataset{part}": refused(ONE_DATASET, COMMUNITY_WHISPER)
       for split in ("train", "eval") for part in ("s", "_configs", "_splits", "_text_columns")},
    "--wandb_key": refused("wandb is not in this image (metrics go to TensorBoard; --report_to "
                           "wandb needs wandb added to pyproject.toml's dependencies); a key "
                           "is never given on the command line, which the job spec and its "
                           "logs keep: with wandb added, set WANDB_API_KEY in the environment, "
                           "or --secret WANDB_API_KEY=projects/P/secrets/S/versions/V on "
                           "Vertex AI", COMMUNITY),
    "--repo_id": refused("give the repository as --hub_model_id ORG/NAME with --push_to_hub "
                         "true", COMMUNITY),
    "--print_training_arguments": ignored("python -m trainer --dry-run prints the resolved "
                                          "flags, training arguments included", COMMUNITY),
}  # fmt: skip
"""Flag -> this trainer's answer. A flag is listed under its underscore spelling; the
dashed one (`--nproc-per-node`, `--num-processes`) is looked up the same."""

DOC = Path(__file__).resolve().parents[2] / "docs" / "launching.md"
DOC_START = (
    "<!-- foreign-flags table: generated by python -m trainer.command_line.foreign_flags "
    "--write -->"
)
DOC_END = "<!-- end of foreign-flags table -->"


def canonical(name: str) -> str:
    """`--num-processes` -> `--num_processes`: one spelling per flag."""
    return "--" + name[2:].replace("-", "_") if name.startswith("--") else name


def markdown_table() -> str:
    """The table of docs/launching.md, from FOREIGN_FLAGS."""
    lines = ["| Flag | From | Here |", "|---|---|---|"]
    for name, flag in sorted(FOREIGN_FLAGS.items()):
        answer = flag.describe().replace("|", "\\|")
        lines.append(f"| `{name}` | {flag.source} | {answer} |")
    return "\n".join(lines)


def documented_table(text: str) -> str | None:
    """The generated table as it stands in `text` (docs/launching.md), if it is there."""
    match = re.search(re.escape(DOC_START) + "(.*?)" + re.escape(DOC_END), text, re.S)
    return match and match.group(1).strip("\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Print (or --write into docs/launching.md) "
                                     "the table of foreign flags.")  # fmt: skip
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    table = markdown_table()
    if not args.write:
        print(table)
        return
    text = DOC.read_text()
    if documented_table(text) is None:
        sys.exit(f"{DOC} has no {DOC_START} ... {DOC_END} section to write into.")
    start, end = text.index(DOC_START) + len(DOC_START), text.index(DOC_END)
    DOC.write_text(f"{text[:start]}\n{table}\n{text[end:]}")


if __name__ == "__main__":
    main()
