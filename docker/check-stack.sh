#!/usr/bin/env bash
# `make image-check`: the image's Python stack built for real, without Docker or a GPU.
#
# Builds, in a fresh virtual environment outside the repository, what docker/Dockerfile's
# layers install, the same way: the CUDA build of torch from PyPI (the image's, not a +cpu
# wheel), nvcc and the CUDA headers from NVIDIA's PyPI wheels at torch's CUDA version
# (docker/cuda-toolkit.sh), DeepSpeed with the ops and architectures of
# docker/ds-build.env, the package's dependencies, openai-whisper, the package; all from
# constraints.txt. Then it checks what a Cloud Build would otherwise find out after half an
# hour: the ops are installed (ds_report, docker/check-ds-ops.py), their .so files hold
# machine code (SASS) for every architecture of TORCH_CUDA_ARCH_LIST (cuobjdump, from
# NVIDIA's wheel), and docker/smoke-test.sh (imports, a two-node --dry-run, two CPU
# training steps of the demo) passes in it: torch's CUDA build runs on a CPU.
#
# Slow (a ~3 GB download, DeepSpeed's ops compiled for every architecture) and not part
# of `make test`. Environment: PYTHON (a 3.12 interpreter, as the image's Ubuntu 24.04
# has), IMAGE_CHECK_DIR (default ~/.cache/vertex-trainer/image-check, replaced each run).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dest=${IMAGE_CHECK_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vertex-trainer/image-check}
python=${PYTHON:-python3}
image_python=3.12  # Ubuntu 24.04's python3, the interpreter of the image's venv

found=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
    || { echo "error: PYTHON=$python does not run: give a Python $image_python interpreter" >&2; exit 2; }
if [ "$found" != "$image_python" ]; then
    echo "error: $python is Python $found; the image runs $image_python (Ubuntu 24.04):" \
        "make image-check PYTHON=/path/to/python$image_python" >&2
    exit 2
fi
case "$dest" in "$repo"|"$repo"/*)
    echo "error: IMAGE_CHECK_DIR=$dest is inside the repository: put it in a cache dir" >&2
    exit 2 ;;
esac

# The image's pip has no configuration: this machine's (local wheel directories, version
# caps, another index) must not change what is installed.
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
unset PIP_FIND_LINKS PIP_CONSTRAINT PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_NO_INDEX \
    PIP_NO_BINARY PIP_ONLY_BINARY PIP_REQUIRE_VIRTUALENV
started=$SECONDS
step() { echo "--- $* [$((SECONDS - started)) s]"; }

step "fresh venv in $dest/venv"
rm -rf "$dest"
mkdir -p "$dest"
# As in the image: system site packages (so that a --user install is possible) and the
# package itself in a user site of its own (docs/deploy.md, "Code updates without an image
# build").
"$python" -m venv --system-site-packages "$dest/venv"
export VIRTUAL_ENV="$dest/venv" PATH="$dest/venv/bin:$PATH" PYTHONUSERBASE="$dest/python-user"
# What the Docker build context holds (.dockerignore): the package is installed from here.
mkdir "$dest/context"
cp -r "$repo/constraints.txt" "$repo/pyproject.toml" "$repo/README.md" "$repo/trainer" \
    "$dest/context/"
cd "$dest/context"

step "pip, setuptools and wheel at constraints.txt's versions"
pip install --constraint constraints.txt pip setuptools wheel

step "torch (the CUDA build from PyPI)"
pip install --constraint constraints.txt torch
python -c "import torch; assert torch.version.cuda, f'{torch.__version__} is a CPU build'; \
print(f'torch {torch.__version__}, CUDA {torch.version.cuda}')"

step "nvcc and CUDA headers from NVIDIA's wheels, then DeepSpeed's ops"
CUDA_HOME=$("$repo/docker/cuda-toolkit.sh" install)
export CUDA_HOME
"$CUDA_HOME/bin/nvcc" --version | tail -2
build_started=$SECONDS
(
    set -a
    # shellcheck source=ds-build.env
    . "$repo/docker/ds-build.env"
    set +a
    # --no-cache-dir: pip would reuse a DeepSpeed wheel it built before, whatever ops and
    # architectures it was built with (its cache key ignores DS_BUILD_*).
    CXX="$repo/docker/portable-cxx" MAX_JOBS=${MAX_JOBS:-$(nproc)} \
        pip install --no-cache-dir --no-build-isolation --constraint constraints.txt deepspeed
    ds_report
    python "$repo/docker/check-ds-ops.py"
)
step "DeepSpeed built in $((SECONDS - build_started)) s"
"$repo/docker/cuda-toolkit.sh" remove
unset CUDA_HOME

step "SASS in the compiled ops (cuobjdump from NVIDIA's wheel, outside the venv)"
PIP_CONFIG_FILE=/dev/null "$dest/venv/bin/pip" install --quiet --target "$dest/tools" \
    nvidia-cuda-cuobjdump
cuobjdump=$(find "$dest/tools" -name cuobjdump -type f | head -1)
(
    set -a
    . "$repo/docker/ds-build.env"
    set +a
    python "$repo/docker/check-sass.py" "$cuobjdump"
)

step "the package's dependencies, openai-whisper, the package"
python -c "import tomllib; \
print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
    > requirements.txt
pip install --constraint constraints.txt --build-constraint constraints.txt \
    --requirement requirements.txt
pip install --no-deps --no-warn-conflicts --constraint constraints.txt openai-whisper
pip install --user --no-deps --no-build-isolation --constraint constraints.txt .

step "installed packages constraints.txt does not pin (CUDA-only: the CPU venv it is frozen from lacks them)"
python - <<'PY'
import re
from importlib.metadata import distributions

def name(text):
    return re.sub(r"[-_.]+", "-", text).lower()

pinned = {name(line.split("==")[0]) for line in open("constraints.txt")
          if "==" in line and not line.startswith("#")}
extra = sorted(f"{d.metadata['Name']}=={d.version}" for d in distributions()
               if name(d.metadata["Name"]) not in pinned | {"vertex-hf-trainer"})
print("\n".join(extra) or "none")
PY

step "docker/smoke-test.sh in the venv"
TRAINER_CACHE_DIR="$dest/cache" bash "$repo/docker/smoke-test.sh"

step "done"
echo "image check passed in $((SECONDS - started)) s; venv: $(du -sh "$dest/venv" | cut -f1)"
