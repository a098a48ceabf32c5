"""The tagging task's `Task`: what the launcher reads of a task before training."""

from __future__ import annotations

from tests.support.token_classification.spec import NAME, SPEC
from trainer.common.errors import UserError
from trainer.tasks.base import Task


class TaggingTask(Task):
    """What the launcher reads of a task before training: its flags, metric and model."""

    spec = SPEC
    default_metric = "exact_tags"
    metric_names = ("exact_tags",)

    def model_class(self):
        from transformers import AutoModelForTokenClassification

        return AutoModelForTokenClassification

    def column_flags(self) -> dict[str, str]:
        return {"tags_column_name": self.options.tags_column_name}

    def _not_trained(self, *args, **kwargs):
        raise UserError(f"{NAME} is a test's task: it is served, not trained")

    load_datasets = load_test_split = references = predicted_values = _not_trained
    load_source = build_model_and_processor = data_collator = compute_metrics = _not_trained
