"""`python -m trainer.jobspec`: the job files for Vertex AI, written from a few flags and
checked before anything is submitted (docs/deploy.md). Three programs share its command line:

- `__main__.py`: the command line; writes the files, or with `--check` compares them;
- `custom_job.py`: config.yaml's CustomJobSpec, its flags and their checks;
- `tuning_job.py`: hptuning.yaml's HyperparameterTuningJob, the custom job in every trial;
- `job_checks.py`: what both training jobs' nodes will run, checked first;
- `batch.py`: `--batch_predict`'s BatchPredictionJob request (batch_prediction.json).
"""
