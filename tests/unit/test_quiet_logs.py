"""Only meaningful lines: warnings on trainer/common/quiet.py's allow-list are hidden, others
still show, and the detector that reads a real run's output for noise
(tests/processes/test_demo_run.py) catches what an issue saw."""

from __future__ import annotations

import warnings

from tests.support.log_noise import noise_lines
from trainer.common import quiet


def test_the_noise_detector_sees_warnings_and_bars():
    """The check on a real run (tests/processes/test_demo_run.py) must be able to fail:
    the lines the issue saw are caught."""
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
