"""The `--peft lora` flags of the LoRA tests (tests/unit/test_lora.py, in this process, and
tests/processes/test_lora_runs.py, real runs): a small rank, no dropout."""

LORA = ["--peft", "lora", "--lora_r", "4", "--lora_alpha", "8", "--lora_dropout", "0"]
