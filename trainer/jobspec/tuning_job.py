"""The HyperparameterTuningJob that hptuning.yaml holds: the custom job as every trial's
spec, searching the learning rate and warm-up for the metric the trainer reports."""

from __future__ import annotations

from trainer.config.resolve import greater_is_better
from trainer.jobspec.custom_job import JobSpecArguments, custom_job_spec
from trainer.settings.run_config import RunConfig
from trainer.tasks.registry import load_task


def tuning_job(
    options: JobSpecArguments,
    training_flags: list[str],
    run: RunConfig,
    package_uri: str | None = None,
) -> dict:
    """A HyperparameterTuningJob without displayName (gcloud takes it as a flag). Vertex AI
    appends `--learning_rate=...` and `--warmup_steps=...` to every trial's args, after the
    recipe, so they override it. The metric is the one HypertuneCallback reports
    (trainer/training/callbacks.py): the flags' `metric_for_best_model`, with its direction."""
    task_class, training = load_task(run.task), run.training.values
    metric = (training["metric_for_best_model"] or task_class.default_metric).removeprefix("eval_")
    goal = "MAXIMIZE" if greater_is_better(task_class, training) else "MINIMIZE"
    return {
        "studySpec": {
            "metrics": [{"metricId": metric, "goal": goal}],
            "parameters": [
                {
                    "parameterId": "learning_rate",
                    "doubleValueSpec": {"minValue": 1.0e-6, "maxValue": 1.0e-4},
                    "scaleType": "UNIT_LOG_SCALE",
                },
                {
                    "parameterId": "warmup_steps",
                    "integerValueSpec": {"minValue": 0, "maxValue": 1000},
                    "scaleType": "UNIT_LINEAR_SCALE",
                },
            ],
            "measurementSelectionType": "BEST_MEASUREMENT",
        },
        "maxTrialCount": options.max_trial_count,
        "parallelTrialCount": options.parallel_trial_count,
        "trialJobSpec": custom_job_spec(options, training_flags, package_uri),
    }
