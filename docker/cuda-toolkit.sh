#!/usr/bin/env bash
# The CUDA compiler that builds DeepSpeed's ops, from NVIDIA's PyPI wheels, in the active
# Python environment; removed again once the ops are built.
#
#   CUDA_HOME="$(docker/cuda-toolkit.sh install)"   prints the CUDA_HOME to build with
#   docker/cuda-toolkit.sh remove                   uninstalls what `install` added
#
# Its version is the one torch was built with: torch's own requirement on NVIDIA's
# `cuda-toolkit` metapackage (cuda-toolkit[cublas,...]==13.0.3), so nvcc, the runtime
# headers and CCCL always match torch's CUDA, with no version written here or in the
# Dockerfile. The image's final stage never gets them (no nvcc, no CCCL headers);
# docker/check-stack.sh runs the same script outside Docker.
set -euo pipefail

site=$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
added="$site/.cuda-toolkit-added"

case "${1:-}" in
install)
    version=$(python - <<'PY'
import re
from importlib.metadata import requires

pins = [m.group(1) for r in requires("torch") or []
        if (m := re.match(r"cuda-toolkit\[[^]]*\]==([\d.]+)", r))]
if not pins:
    raise SystemExit("error: this torch does not require NVIDIA's cuda-toolkit wheels "
                     "(a CPU build?): install the CUDA build of torch first")
print(pins[0])
PY
)
    names() { python -m pip list --format=freeze | cut -d= -f1 | sort; }
    before=$(names)
    python -m pip install --quiet "cuda-toolkit[nvcc,cccl]==$version" >&2
    comm -13 <(echo "$before") <(names) > "$added"
    major=${version%%.*}
    home="$site/nvidia/cu$major"
    test -x "$home/bin/nvcc" || { echo "error: no nvcc in $home after installing" \
        "cuda-toolkit[nvcc]==$version" >&2; exit 1; }
    # torch's extension builder links with -L$CUDA_HOME/lib64 -lcudart; the wheels ship
    # lib/ and only the versioned library.
    ln -sfn lib "$home/lib64"
    ln -sfn "libcudart.so.$major" "$home/lib/libcudart.so"
    echo "$home"
    ;;
remove)
    test -f "$added" || { echo "error: $added not found: run install first" >&2; exit 1; }
    if [ -s "$added" ]; then
        xargs python -m pip uninstall --quiet --yes < "$added" >&2
    fi
    for home in "$site"/nvidia/cu*; do
        rm -f "$home/lib64" "$home/lib/libcudart.so"
    done
    rm "$added"
    ;;
*)
    echo "error: usage: $0 install|remove" >&2
    exit 2
    ;;
esac
