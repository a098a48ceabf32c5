"""A fifth task, defined outside the product to show that a task is a folder and one registration
(tests/unit/test_task_registry.py): token classification, tagging each word of a text. Its
folder has the roles a shipped task's has (docs/tasks.md, "Adding a task"): `spec.py`,
`training.py`, `serving.py`. It is served and scored for real (a tiny BERT with a
token-classification head); its training side is only what the launcher's flags, checks and
LoRA plan read, so it refuses to train, in one line.

`register(SPEC)` (trainer/tasks/registry.py) is its one registration: no product file names it.
"""
