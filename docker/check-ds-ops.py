"""Fail when DeepSpeed did not install an op that docker/ds-build.env asks for.

DeepSpeed skips an op it cannot build and still installs successfully, so without this
check an image would ship without its compiled optimizer and compile it at every start
(or fail: the runtime image has no nvcc). The ops are read from the DS_BUILD_<OP>=1
variables of the environment (ds-build.env, sourced), not listed a second time here.

    set -a; . docker/ds-build.env; set +a; python docker/check-ds-ops.py
"""

import os
import sys


def wanted_ops(env: dict[str, str]) -> list[str]:
    prefix = "DS_BUILD_"
    return sorted(
        name[len(prefix) :].lower()
        for name, value in env.items()
        if name.startswith(prefix) and name != "DS_BUILD_OPS" and value == "1"
    )


def main() -> int:
    from deepspeed.git_version_info import installed_ops

    wanted = wanted_ops(dict(os.environ))
    if not wanted:
        print(
            "error: no DS_BUILD_<OP>=1 in the environment: source docker/ds-build.env",
            file=sys.stderr,
        )
        return 1
    missing = [op for op in wanted if not installed_ops.get(op)]
    if missing:
        print(
            f"error: DeepSpeed ops not compiled in: {', '.join(missing)} (see the build log)",
            file=sys.stderr,
        )
        return 1
    print(f"DeepSpeed ops compiled in: {', '.join(wanted)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
