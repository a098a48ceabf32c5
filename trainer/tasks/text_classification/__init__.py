"""Text classification: BERT-style encoders fine-tuned on texts or sentence pairs, scored by
accuracy and macro F1.

The roles every task folder has (docs/tasks.md, "Adding a task"): `spec.py` (its flags, the
models and data folders it claims, its `TaskSpec`; no torch), `training.py` (its `Task`),
`serving.py` (its `Predictor`). What it shares with image classification (the label set, class
weights, the label metrics, their Trainer) is in trainer/tasks/classification*.py."""
