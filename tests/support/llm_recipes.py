"""LLM users' recipes and command lines as published (TRL, the alignment-handbook, open-r1,
Axolotl, LLaMA-Factory), with @MARKS@ where the tests put local tiny copies: the users'
lines of tests/unit/test_user_flags.py and the runs of tests/processes/test_user_flags_runs.py."""

from __future__ import annotations

import json

TRL_SFT_DOCSTRING = (
    "--model_name_or_path @QWEN@ --dataset_name @CHATS@ --learning_rate 2.0e-5 "
    "--num_train_epochs 1 --packing --per_device_train_batch_size 2 "
    "--gradient_accumulation_steps 8 --eos_token '<|im_end|>' --eval_strategy steps "
    "--eval_steps 100 --output_dir Qwen2-0.5B-SFT"
)
HANDBOOK_CHAT_TEMPLATE = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
    "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ "
    "'<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == "
    "'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
    "{% endfor %}"
)
ZEPHYR_SFT_FULL = """# Model arguments
model_name_or_path: @LLAMA@
model_revision: main
torch_dtype: bfloat16
use_flash_attention_2: true

# Data training arguments
dataset_mixer:
  @SFT@: 1.0
dataset_splits:
- train_sft
- test_sft
preprocessing_num_workers: 12

# SFT trainer config
bf16: true
do_eval: true
evaluation_strategy: epoch
gradient_accumulation_steps: 2
gradient_checkpointing: true
hub_model_id: zephyr-7b-sft-full
hub_strategy: every_save
learning_rate: 2.0e-05
log_level: info
logging_steps: 5
logging_strategy: steps
lr_scheduler_type: cosine
max_seq_length: 2048
max_steps: -1
num_train_epochs: 1
output_dir: data/zephyr-7b-sft-full
overwrite_output_dir: true
per_device_eval_batch_size: 16
per_device_train_batch_size: 32
push_to_hub: true
remove_unused_columns: true
report_to:
- tensorboard
save_strategy: "no"
save_total_limit: null
seed: 42
tf32: true
"""
ZEPHYR_SFT_QLORA = """# Model arguments
model_name_or_path: @LLAMA@
model_revision: main
torch_dtype: bfloat16
attn_implementation: sdpa

# LoRA arguments
load_in_4bit: true
use_peft: true
lora_r: 16
lora_alpha: 16
lora_dropout: 0.05
lora_target_modules:
- q_proj
- k_proj
- v_proj
- o_proj
- gate_proj
- up_proj
- down_proj

# Data training arguments
chat_template: @TEMPLATE@
dataset_mixer:
  @SFT@: 1.0
dataset_splits:
- train_sft
- test_sft
preprocessing_num_workers: 12

# SFT trainer config
bf16: true
do_eval: true
eval_strategy: epoch
gradient_accumulation_steps: 2
gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: false
hub_model_id: zephyr-7b-sft-qlora
hub_strategy: every_save
learning_rate: 2.0e-04
log_level: info
logging_steps: 5
logging_strategy: steps
lr_scheduler_type: cosine
max_seq_length: 2048
max_steps: -1
num_train_epochs: 1
output_dir: data/zephyr-7b-sft-qlora
overwrite_output_dir: true
per_device_eval_batch_size: 8
per_device_train_batch_size: 4
push_to_hub: true
report_to:
- tensorboard
save_strategy: "steps"
save_steps: 100
save_total_limit: 1
seed: 42
warmup_ratio: 0.1
"""
ZEPHYR_SFT_LORA = """# Model arguments
model_name_or_path: @LLAMA@
torch_dtype: auto
use_flash_attention_2: true

# LoRA arguments
use_peft: true
lora_r: 64
lora_alpha: 16
lora_dropout: 0.1
lora_target_modules:
- q_proj
- k_proj
- v_proj
- o_proj

# Data training arguments
dataset_mixer:
  @SFT@: 1.0
dataset_splits:
- train_sft
- test_sft
preprocessing_num_workers: 12

# SFT trainer config
bf16: true
do_eval: true
evaluation_strategy: epoch
gradient_accumulation_steps: 128
gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: false
hub_model_id: zephyr-7b-sft-lora
hub_strategy: every_save
learning_rate: 2.0e-05
log_level: info
logging_steps: 5
logging_strategy: steps
lr_scheduler_type: cosine
max_seq_length: 2048
max_steps: -1
num_train_epochs: 1
output_dir: data/zephyr-7b-sft-lora
overwrite_output_dir: true
per_device_eval_batch_size: 8
per_device_train_batch_size: 4
push_to_hub: true
report_to:
- tensorboard
save_strategy: "no"
save_total_limit: null
seed: 42
"""
OPEN_R1_QWEN_DEMO = """# Model arguments
model_name_or_path: @QWEN@
model_revision: main
torch_dtype: bfloat16
attn_implementation: flash_attention_2

# Data training arguments
dataset_name: @CHATS@
dataset_configs:
- all
dataset_num_proc: 8

# SFT trainer config
bf16: true
do_eval: true
eval_strategy: steps
eval_steps: 100
gradient_accumulation_steps: 8
gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: false
hub_model_id: Qwen2.5-1.5B-Open-R1-Distill
hub_strategy: every_save
learning_rate: 2.0e-05
log_level: info
logging_steps: 5
logging_strategy: steps
lr_scheduler_type: cosine
packing: true
max_seq_length: 4096
max_steps: -1
num_train_epochs: 1
output_dir: data/Qwen2.5-1.5B-Open-R1-Distill
overwrite_output_dir: true
per_device_eval_batch_size: 4
per_device_train_batch_size: 2
push_to_hub: true
report_to:
- wandb
save_strategy: "no"
seed: 42
warmup_ratio: 0.1
"""
OPEN_R1_SMOLLM2 = """# Model arguments
# You can download the model and manually change the rope (... comment cut)
model_name_or_path: @LLAMA@
model_revision: main
torch_dtype: bfloat16
attn_implementation: sdpa

# Data training arguments
dataset_name: @CHATS@
dataset_num_proc: 48

#SFT hyperparam
max_seq_length: 8192 # You can set this to 32768 if you change the rope (... cut)
weight_decay: 0.0001
optim: adamw_torch
lr_scheduler_type: linear
warmup_ratio: 0.1
learning_rate: 5.0e-05
gradient_accumulation_steps: 2
per_device_eval_batch_size: 4
per_device_train_batch_size: 4 # Change this depending on the context length (... cut)

# SFT trainer config
max_steps: -1
num_train_epochs: 3
bf16: true
do_eval: false
eval_strategy: 'no'
gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: false
hub_model_id: OpenR1-Qwen-7B-SFT
hub_strategy: every_save
log_level: info
logging_steps: 5
logging_strategy: steps
packing: true
output_dir: data/OpenR1-Qwen-7B-SFT
overwrite_output_dir: true
report_to:
- tensorboard
save_strategy: "steps"
save_steps: 500
save_total_limit: 1
seed: 42
"""
AXOLOTL_LORA_1B = """base_model: @LLAMA@
# Automatically upload checkpoint and final model to HF
# hub_model_id: username/custom_model_name
strict: false

datasets:
  - path: @KEPT@
    type: @TYPE@
dataset_prepared_path: last_run_prepared
val_set_size: 0.1
output_dir: ./outputs/lora-out

adapter: @ADAPTER@
lora_model_dir:

sequence_len: 2048
sample_packing: true
eval_sample_packing: true
pad_to_sequence_len: true

lora_r: 16
lora_alpha: 32
lora_dropout: 0.05
lora_target_modules:
  - gate_proj
  - down_proj
  - up_proj
  - q_proj
  - v_proj
  - k_proj
  - o_proj

wandb_project:
wandb_entity:
wandb_watch:
wandb_name:
wandb_log_model:

gradient_accumulation_steps: 2
micro_batch_size: 2
num_epochs: 1
optimizer: @OPTIMIZER@
lr_scheduler: cosine
learning_rate: 0.0002

bf16: auto
tf32: false

gradient_checkpointing: true
resume_from_checkpoint:
logging_steps: 1
@FLASH@

loss_watchdog_threshold: 5.0
loss_watchdog_patience: 3

warmup_steps: 10
@EVALS@
weight_decay: 0.0
special_tokens:
  pad_token: "<|end_of_text|>"
"""
STARCHAT2_SFT = """# Model arguments
model_name_or_path: @LLAMA@
model_revision: main
torch_dtype: bfloat16
attn_implementation: flash_attention_2

# Data training arguments
chat_template: @CHATML@
dataset_mixture:
  datasets:
    - id: @SFT@
      config: default
      split: train_sft
      columns:
        - messages
      weight: 1.0
    - id: @SFT2@
      config: default
      split: train_sft
      columns:
        - messages
      weight: 1.0
    - id: @SFT@
      config: default
      split: test_sft
      columns:
        - messages
      weight: 1.0
    - id: @SFT2@
      config: default
      split: test_sft
      columns:
        - messages
      weight: 1.0
  test_split_size: 1000
  seed: 0
dataset_num_proc: 24

# SFT trainer config
bf16: true
do_eval: true
eval_strategy: epoch
gradient_accumulation_steps: 2
gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: false
hub_model_id: starchat2-15b-v0.1
hub_strategy: every_save
learning_rate: 2.0e-05
log_level: info
logging_steps: 5
logging_strategy: steps
lr_scheduler_type: cosine
max_length: 2048
max_steps: -1
num_train_epochs: 3
output_dir: data/starchat2-15b-v0.1
overwrite_output_dir: true
per_device_eval_batch_size: 8
per_device_train_batch_size: 8
push_to_hub: true
remove_unused_columns: true
report_to:
- tensorboard
- wandb
save_strategy: "no"
seed: 42
warmup_ratio: 0.1
"""
"""The alignment-handbook's recipes/starchat2-15b/sft/config_v0.1.yaml (its newer form, open-r1's
`dataset_mixture`), its five datasets cut to two (@SFT@, @SFT2@), each with its train_sft and
test_sft splits, as published; `config: default` is what a local folder of JSON Lines has."""
STARCHAT2_CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
    "{% endif %}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""Its inline template (ChatML), as the file writes it (JSON's escapes are YAML's)."""
STARCHAT2_SFT = STARCHAT2_SFT.replace("@CHATML@", json.dumps(STARCHAT2_CHAT_TEMPLATE))
LLAMA_FACTORY_LORA_SFT = """### model
model_name_or_path: @LLAMA@

### method
stage: sft
do_train: true
finetuning_type: lora
lora_target: all

### dataset
dataset: @DATASET@
template: llama3
cutoff_len: 1024
max_samples: 1000
overwrite_cache: true
preprocessing_num_workers: 16

### output
output_dir: saves/llama3-8b/lora/sft
logging_steps: 10
save_steps: 500
plot_loss: true
overwrite_output_dir: true

### train
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
ddp_timeout: 180000000

### eval
val_size: 0.1
per_device_eval_batch_size: 1
eval_strategy: steps
eval_steps: 500
"""
AXOLOTL = "axolotl examples/llama-3/lora-1b.yml"
AXOLOTL_QLORA = "axolotl examples/llama-3/qlora-1b.yml"


def axolotl(type_="chat_template", adapter="lora", optimizer="adamw_torch", flash="",
            evals="") -> str:  # fmt: skip
    """Axolotl's lora-1b.yml (qlora-1b.yml: adapter qlora, optimizer adamw_bnb_8bit), with
    its dataset type, optimizer, `flash_attention: true` and `evals_per_epoch: 4
    saves_per_epoch: 1` as published or left as this machine runs them."""
    return (AXOLOTL_LORA_1B.replace("@TYPE@", type_).replace("@ADAPTER@", adapter)
            .replace("@OPTIMIZER@", optimizer).replace("@FLASH@", flash)
            .replace("@EVALS@", evals))  # fmt: skip
