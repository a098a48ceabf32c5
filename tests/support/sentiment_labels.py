"""The label set of the sentiment set (tests/support/tiny_assets.py), in the order the text
task numbers it (sorted): what a model trained on it predicts, in this process
(tests/unit/test_text_task.py) and in real runs (tests/processes/test_text_task_runs.py,
test_lora_runs.py, test_hub_streaming.py)."""

SENTIMENTS = ["negative", "neutral", "positive"]
