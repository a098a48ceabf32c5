"""docker/Dockerfile.ray, read without a Docker engine: a base image Ray on Vertex AI
accepts, the Ray version the cluster runs pinned for the client too, and the pinned set
(its lint: tests/processes/test_dockerfile_ray_runs.py)."""

from __future__ import annotations

import re

from tests.support.helpers import REPO_ROOT
from tests.support.image_build import RAY_DOCKERFILE as DOCKERFILE

BASE = re.compile(
    r"^ARG RAY_BASE=(us|europe|asia)-docker\.pkg\.dev/vertex-ai/training/"
    r"ray-gpu\.(\d+)-(\d+)\.py3(\d+):latest$",
    re.MULTILINE,
)


def test_the_base_is_vertex_ais_ray_gpu_image_of_the_pinned_ray_and_python():
    """Ray on Vertex AI takes custom images built on its Ray images; the job's Ray (client and
    workers) must be the cluster's version, so the pin and the base's tag agree."""
    base = BASE.search(DOCKERFILE.read_text())
    assert base, "the base must be one of Vertex AI's ray-gpu images"
    pinned = re.search(r"^ray==(\d+)\.(\d+)\.\d+$", (REPO_ROOT / "constraints.txt").read_text(),
                       re.MULTILINE)  # fmt: skip
    assert (base.group(2), base.group(3)) == pinned.groups()
    assert base.group(4) == "11", "Ray 2.47 images are Python 3.11 (the venv's minor too)"
    extra = (REPO_ROOT / "pyproject.toml").read_text()
    assert f'"ray[train,default]=={".".join(pinned.groups())}.' in extra


def test_every_pip_install_takes_the_pinned_set():
    installs = re.findall(r"pip install ([^&\n]*)", DOCKERFILE.read_text())
    assert len(installs) == 5, installs
    assert all("--constraint constraints.txt" in args for args in installs), installs


def test_deepspeed_installs_without_a_cuda_compiler_with_the_images_gpu_list():
    """Without TORCH_CUDA_ARCH_LIST, DeepSpeed's setup.py on a machine with no GPU asks nvcc
    for the architectures, and fails where the base has none (the stand-in `make image-test`
    builds on); the list is docker/ds-build.env's, the one the training image compiles for."""
    text = DOCKERFILE.read_text()
    install = re.search(r"^    && (TORCH_CUDA_ARCH_LIST=.*) \\\n +(pip install .* deepspeed)$",
                        text, re.MULTILINE)  # fmt: skip
    assert install, "DeepSpeed's install names the architectures"
    assert install.group(1) == (
        'TORCH_CUDA_ARCH_LIST=$(. ./ds-build.env && echo "$TORCH_CUDA_ARCH_LIST") DS_BUILD_OPS=0'
    )
    copy = next(line for line in text.splitlines() if line.startswith("COPY constraints.txt"))
    assert "docker/ds-build.env" in copy.split()
    assert re.search(r'^TORCH_CUDA_ARCH_LIST="[\d.;]+"$',
                     (REPO_ROOT / "docker" / "ds-build.env").read_text(), re.MULTILINE)  # fmt: skip
