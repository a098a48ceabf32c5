"""Preference tuning: DPO and its variants (TRL's `DPOTrainer`) on pairs of a chosen and a
rejected answer, for the causal language models the text-generation task fine-tunes.

The roles every task folder has (docs/tasks.md, "Adding a task"): `spec.py` (its flags, the
data folders it claims, its `TaskSpec`; no torch), `training.py` (its `Task`: rows checked,
bad ones counted, the reference model planned), `trainer.py` (its Trainer subclass, TRL's
`DPOTrainer`, with the run's arguments as its `DPOConfig`). It has no `serving.py`: the model
it delivers is a text-generation model, served by that task's predictor (`SPEC.serves_as`,
resolved through the registry). Its own helper: `pairs.py` (a row checked: both sides there,
different, an implicit prompt shared by both)."""
