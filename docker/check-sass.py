"""Fail unless DeepSpeed's compiled CUDA ops hold machine code for every GPU asked for.

An op compiled without an architecture's SASS either JIT-compiles its PTX at every start
on that GPU or, without PTX, fails there with "no kernel image is available"; nothing on a
build machine without a GPU would notice. This lists the cubins in each compiled op with
cuobjdump and compares their sm_XY with TORCH_CUDA_ARCH_LIST (docker/ds-build.env).

    set -a; . docker/ds-build.env; set +a; python docker/check-sass.py /path/to/cuobjdump
"""

import os
import re
import subprocess
import sys
from pathlib import Path


def wanted_archs(arch_list: str) -> set[str]:
    """ "7.5;8.0 9.0+PTX" -> {"sm_75", "sm_80", "sm_90"}."""
    entries = [entry for entry in re.split(r"[;\s]+", arch_list) if entry]
    return {"sm_" + entry.split("+")[0].replace(".", "") for entry in entries}


def cubin_archs(listing: str) -> set[str]:
    """The architectures in `cuobjdump --list-elf` output (`... fused_adam.1.sm_80.cubin`)."""
    return set(re.findall(r"\.(sm_\d+[af]?)\.cubin", listing))


def main() -> int:
    if len(sys.argv) != 2 or not os.access(sys.argv[1], os.X_OK):
        print("error: usage: check-sass.py /path/to/cuobjdump", file=sys.stderr)
        return 2
    wanted = wanted_archs(os.environ.get("TORCH_CUDA_ARCH_LIST", ""))
    if not wanted:
        print("error: TORCH_CUDA_ARCH_LIST is empty: source docker/ds-build.env", file=sys.stderr)
        return 2
    import deepspeed

    ops = sorted((Path(deepspeed.__file__).parent / "ops").rglob("*.so"))
    with_device_code, failed = 0, False
    for op in ops:
        result = subprocess.run(
            [sys.argv[1], "--list-elf", str(op)], capture_output=True, text=True
        )
        found = cubin_archs(result.stdout)
        if not found:
            print(f"{op.name}: no device code (a CPU op)")
            continue
        with_device_code += 1
        missing = wanted - found
        print(f"{op.name}: SASS for {', '.join(sorted(found))}")
        if missing:
            print(f"error: {op.name} lacks SASS for {', '.join(sorted(missing))}", file=sys.stderr)
            failed = True
    if not with_device_code:
        print(f"error: none of {len(ops)} compiled op(s) holds GPU code", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
