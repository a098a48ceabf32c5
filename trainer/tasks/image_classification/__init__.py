"""Image classification: ViT or any image classifier fine-tuned on an imagefolder or a Hub
dataset, scored by accuracy and macro F1.

The roles every task folder has (docs/tasks.md, "Adding a task"): `spec.py` (its flags, the
models and data folders it claims, its `TaskSpec`; no torch), `training.py` (its `Task`),
`serving.py` (its `Predictor`). What it shares with text classification (the label set, class
weights, the label metrics, their Trainer) is in trainer/tasks/classification*.py."""
