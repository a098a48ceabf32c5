"""`--register_model NAME`, in training: once the model is delivered and every checkpoint
upload is settled, the chief registers the model in the Vertex AI Model Registry
(trainer/registry), labelled with the final evaluation's metric.

Last, because a registry that refuses must lose nothing: the model is already delivered, and
the line says where it is and gives the command that registers it. A restart of the job finds
the model delivered and registers it then (trainer/launcher/prepare.py); a model registered
once is never registered again (its record beside the model).
"""

from __future__ import annotations

import os

from trainer.registry.run_registration import run_registration
from trainer.training.assemble import TrainingRun
from trainer.training.failures import RunFailed


def register_the_model(run: TrainingRun) -> None:
    """The chief registers the delivered model, if the run asks; RunFailed with the command to
    retry when the registry refuses or does not answer."""
    if not run.config.outputs.register_model or not run.place.is_global_main:
        return
    from trainer.registry.registration import RegistrationFailed, register

    registration = run_registration(run.config, os.environ, final_metric(run))
    try:
        done = register(registration)
    except RegistrationFailed as failure:
        raise RunFailed(
            f"registering the model in the Vertex AI Model Registry failed ({failure}); "
            f"retry with: {registration.retry_command()}"
        ) from failure.__cause__
    print(done.line(registration.name), flush=True)


def final_metric(run: TrainingRun) -> tuple[str, str] | None:
    """The final evaluation's `--metric_for_best_model` (else the task's) and its value, as
    the registry's labels show them; None when the run did not evaluate at its last step."""
    trainer = run.trainer
    name = (trainer.args.metric_for_best_model or run.task.default_metric).removeprefix("eval_")
    steps = trainer.state.global_step
    for logs in reversed(trainer.state.log_history):  # the last: the delivered weights'
        if logs.get("step") == steps and f"eval_{name}" in logs:
            return name, f"{logs[f'eval_{name}']:.4g}"
    return None
