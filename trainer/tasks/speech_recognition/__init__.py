"""Speech recognition: Whisper fine-tuned on transcribed audio, scored by word error rate.

The roles every task folder has (docs/tasks.md, "Adding a task"): `spec.py` (its flags, the
models and data folders it claims, its `TaskSpec`; no torch), `training.py` (its `Task`),
`trainer.py` (its Trainer subclass), `serving.py` (its `Predictor`), `demo.py` (its built-in
demo). Its own helpers: `batches.py` (clips and transcripts into Whisper's inputs and labels,
log-mel features), `whisper_checkpoint.py` (what a checkpoint can do, from its JSON files),
`english_spelling.py` (the WER normaliser's spelling table), `whisper_sizes.py` (the released
sizes), `wer.py` (the metric)."""
