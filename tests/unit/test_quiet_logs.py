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


def test_bitsandbytes_cpu_kernels_and_torchs_cuda_home_notes_are_hidden_whoever_prints_them():
    """Seen in the training image's smoke test (a CPU run): bitsandbytes' note at import, on
    a logger with no handler (Python's last resort prints it), and torch's extension
    builder's, through torch's own handler. Other messages of those loggers still show."""
    import io
    import logging

    quiet.silence_known_noise()
    for name, noise in [
        ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward from "
         "kernels-community: No module named 'kernels'. Please make sure you already `pip "
         "install kernels` and the kernels >= 0.11.1"),
        ("torch.utils.cpp_extension",
         "No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'"),
    ]:  # fmt: skip
        printed = io.StringIO()
        handler = logging.StreamHandler(printed)
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        try:
            logger.warning(noise)
            logger.warning("a real problem")
        finally:
            logger.removeHandler(handler)
        assert printed.getvalue() == "a real problem\n", name
