"""Text generation: supervised fine-tuning of causal language models on chats, prompt/completion
pairs or plain text, through TRL's `SFTTrainer`.

The roles every task folder has (docs/tasks.md, "Adding a task"): `spec.py` (its flags, the
models and data folders it claims, its `TaskSpec`; no torch), `training.py` (its `Task`: splits
tokenised, perplexity, generation samples), `trainer.py` (its Trainer subclass, TRL's
`SFTTrainer`), `serving.py` (its `Predictor`, and `continuation`, the one answer format),
`demo.py` (its built-in demo). Its own helpers: `loss_mask.py` (a row checked, rendered with the
chat template, tokenised, and the labels that put the loss on the assistant's turns or the
completion), `stream.py` (the training split tokenised as it streams)."""
