"""`python -m trainer.build_cpu_ops`: compile DeepSpeed's CPU op now, not in the first run.

Without CUDA, DeepSpeed compiles its shared-memory collective op (`deepspeed_shm_comm`, about
45 s and 1.6 GB of compiler memory) when a process group first starts: inside the first run, as
rendezvous time, making a demo look stuck. `make install` runs this instead, into the directory
the launcher and tests use (`trainer.common.cache.torch_extensions_dir`). GPU images build
their ops when the image is built; on a CUDA machine this does nothing.
"""

from __future__ import annotations

import os
import sys
import time

from trainer.common.cache import cache_dir, clear_orphaned_build_locks, torch_extensions_dir

SHARED_MEMORY_OP = "ShareMemCommBuilder"
"""DeepSpeed's builder of the op its CPU process groups load (`deepspeed.comm.torch`)."""


def main() -> None:
    import torch

    if torch.cuda.is_available():
        print("CUDA is present: DeepSpeed's CPU op is not needed here.")
        return
    extensions = torch_extensions_dir(os.environ, cache_dir())
    os.environ["TORCH_EXTENSIONS_DIR"] = str(extensions)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    clear_orphaned_build_locks(extensions)
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder(SHARED_MEMORY_OP)
    started = time.monotonic()
    builder.load(verbose=False)
    print(
        f"DeepSpeed CPU op {builder.NAME} ready in {extensions} "
        f"({time.monotonic() - started:.0f} s)",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
