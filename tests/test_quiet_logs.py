"""Only meaningful lines: a real 2-process run through `python -m trainer` prints no
warning or progress bar that is not on trainer/common/quiet.py's allow-list."""

from __future__ import annotations

import re
import warnings

import pytest

from tests.support.helpers import run_trainer, trainer_env
from trainer.common import quiet

LOOKS_LIKE_NOISE = re.compile(
    r"warn|deprecat|\d+%\|"  # warnings, deprecations, tqdm bars (`50%|#####`)
    r"|\d+(?:\.\d+)?\s?(?:it|examples|files)/s\]",  # tqdm's rate at the end of a bar
    re.IGNORECASE,
)


def noise_lines(output: str) -> list[str]:
    """Lines (and tqdm redraws, which end in carriage returns) that look like noise."""
    lines = re.split(r"[\r\n]+", output)
    return [line for line in lines if LOOKS_LIKE_NOISE.search(line)]


@pytest.mark.slow
def test_a_short_two_process_run_prints_no_unlisted_warning_or_bar(tmp_path, demo_cache):
    code, output = run_trainer(
        ["--nproc_per_node", "2", "--max_steps", "2", "--eval_steps", "2", "--save_steps", "2",
         "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "6",
         "--max_eval_samples", "6", "--output_dir", "out"],
        cwd=tmp_path,
        env=trainer_env(demo_cache),
    )  # fmt: skip
    assert code == 0, output[-3000:]
    assert "eval at step 2" in output and "final model and processor saved" in output
    assert noise_lines(output) == [], "not on trainer/common/quiet.py's allow-list"


def test_the_noise_detector_sees_warnings_and_bars():
    """The check above must be able to fail: the lines the issue saw are caught."""
    seen = (
        "/x/c10d_logger.py:83: FutureWarning: `torch.distributed.all_gather_into_tensor` is "
        "deprecated.\nLoading weights: 100%|##########| 89/89 [00:00<00:00, 29197.74it/s]\r"
        "Generating train split: 48 examples [00:00, 14830.69 examples/s]\n"
        "[transformers] The attention mask is not set with a batched input\n"
        "step 2/4 (50%) | epoch 0.33 | loss 21.8 | 19.34 samples/s | data wait 10% | eta 0:00:01"
    )
    assert len(noise_lines(seen)) == 3


def test_listed_warnings_are_hidden_and_others_still_show():
    import io
    import logging

    from transformers.utils import logging as hf_logging

    printed = io.StringIO()
    handler = logging.StreamHandler(printed)  # as transformers' own: on its library logger
    logging.getLogger("transformers").addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.resetwarnings()
            quiet.silence_known_noise()
            warnings.warn(
                "`torch.distributed.all_gather_into_tensor` is deprecated. Use x.",
                FutureWarning,
                stacklevel=2,
            )
            warnings.warn("something new is deprecated", FutureWarning, stacklevel=2)
        logger = hf_logging.get_logger("transformers.generation.utils")
        logger.warning("The attention mask is not set with a batched input, and cannot be ...")
        logger.warning("a real problem")
        from deepspeed.utils import logger as deepspeed_logger  # its own handler, no parent's

        deepspeed_logger.addHandler(handler)
        deepspeed_logger.warning("MPU is not provided, setting tp size to 1 in checkpoint loading.")
        deepspeed_logger.warning("a real DeepSpeed problem")
    finally:
        logging.getLogger("transformers").removeHandler(handler)
        logging.getLogger(quiet.DEEPSPEED_LOGGER).removeHandler(handler)
    assert [str(w.message) for w in caught] == ["something new is deprecated"]
    assert printed.getvalue() == "a real problem\na real DeepSpeed problem\n"
    assert all(noise.reason for noise in quiet.ALLOWED)
