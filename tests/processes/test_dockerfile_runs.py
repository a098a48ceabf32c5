"""docker/Dockerfile, checked without a Docker engine by running what it runs: lint, its
own commands, the DeepSpeed settings of docker/ds-build.env as bash sources them, the
docker/ scripts, and its Python laid out as the Dockerfile lays it out (fresh virtual
environments, pip), taking a newer copy of the package from a Python package job's
installer; the serve target's dependency listing. What reading the Dockerfile shows:
tests/unit/test_dockerfile.py."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys

import pytest
import tomllib

from tests.support.helpers import (
    REPO_ROOT,
    hadolint,
    module_origin,
    pip_in,
    venv_with_dependencies,
)
from tests.support.image_build import (
    CHECK_STACK,
    DOCKERFILE,
    constraint_pins,
    final_stage_env,
    instructions,
    pip_installs,
    requirement_name,
    shell_commands,
    stages,
)
from trainer.jobspec.custom_job import installing_command
from trainer.preflight import vertex_machines

DS_BUILD_ENV = REPO_ROOT / "docker" / "ds-build.env"

COMPUTE_CAPABILITY = {
    "NVIDIA_TESLA_T4": "7.5",
    "NVIDIA_TESLA_A100": "8.0",
    "NVIDIA_A100_80GB": "8.0",
    "NVIDIA_L4": "8.9",
    "NVIDIA_H100_80GB": "9.0",
    "NVIDIA_H100_MEGA_80GB": "9.0",
    "NVIDIA_H200_141GB": "9.0",
}


def test_hadolint_finds_nothing():
    result = subprocess.run([hadolint(), str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def listed_dependencies(stage) -> list[str]:
    """Run the stage's own command that lists the package's dependencies for pip."""
    run = next(rest for keyword, rest in stage if keyword == "RUN" and "tomllib" in rest)
    command = shell_commands(run)[0]
    assert command[:2] == ["python", "-c"] and command[3] == ">"
    return subprocess.run(
        [sys.executable, "-c", command[2]], cwd=REPO_ROOT, capture_output=True, text=True
    ).stdout.split()


def test_the_image_reads_the_packages_dependencies_from_pyproject():
    """Run the Dockerfile's own command that lists them; every one is pinned for CI."""
    listed = listed_dependencies(stages()[-1])
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["gpu"]
    assert listed == [dep.replace(" ", "") for dep in wanted]
    assert any(requirement_name(dep) == "bitsandbytes" for dep in listed), "--load_in_8bit"
    pins = constraint_pins()
    assert [dep for dep in listed if requirement_name(dep) not in pins] == []


def test_the_serving_image_reads_its_dependencies_from_pyproject_less_deepspeed():
    """The serve target's own command: the package's dependencies but DeepSpeed, and the
    `serve` extra (fastapi, uvicorn), every one pinned for CI."""
    serve = next(stage for stage in stages() if stage[0][1].endswith(" AS serve"))
    listed = listed_dependencies(serve)
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    wanted = [
        dep for dep in project["dependencies"] if requirement_name(dep) != "deepspeed"
    ] + project["optional-dependencies"]["serve"]
    assert listed == [dep.replace(" ", "") for dep in wanted]
    names = {requirement_name(dep) for dep in listed}
    assert {"torch", "transformers", "fastapi", "uvicorn"} <= names
    assert not names & {"deepspeed", "bitsandbytes"}
    pins = constraint_pins()
    assert [dep for dep in listed if requirement_name(dep) not in pins] == []


def ds_build_settings() -> dict[str, str]:
    """docker/ds-build.env as the Dockerfile and check-stack.sh see it: sourced by bash."""
    script = f'set -a; . "{DS_BUILD_ENV}"; set +a; env -0'
    result = subprocess.run(["bash", "-c", script], env={}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    pairs = [entry.split("=", 1) for entry in result.stdout.split("\0") if "=" in entry]
    return {k: v for k, v in pairs if k.startswith("DS_") or k == "TORCH_CUDA_ARCH_LIST"}


def test_deepspeed_ops_are_compiled_for_every_gpu_the_job_specs_offer():
    settings = ds_build_settings()
    arch_list = set(settings["TORCH_CUDA_ARCH_LIST"].split(";"))
    for gpu, _ in vertex_machines.GPU_MACHINES.values():
        assert COMPUTE_CAPABILITY[gpu] in arch_list, f"{gpu} missing from TORCH_CUDA_ARCH_LIST"
        capability = vertex_machines.ACCELERATORS[gpu][1]
        assert ".".join(map(str, capability)) == COMPUTE_CAPABILITY[gpu], "jobspec's checks use it"
    assert "7.0" not in arch_list, "CUDA 13 cannot target Volta"
    assert settings["DS_ACCELERATOR"] == "cuda" and settings["DS_BUILD_OPS"] == "0"
    assert {settings["DS_BUILD_FUSED_ADAM"], settings["DS_BUILD_CPU_ADAM"]} == {"1"}

    build = next(
        rest for keyword, rest in instructions() if "deepspeed" in rest and "RUN" in keyword
    )
    commands = [" ".join(command) for command in shell_commands(build)]
    assert commands[0].startswith("CUDA_HOME=$(/opt/build/cuda-toolkit.sh install)")
    assert ". /opt/build/ds-build.env" in commands and "set +a" in commands
    assert commands[-1] == "/opt/build/cuda-toolkit.sh remove", "no toolkit left behind"
    for setting in ("--no-build-isolation", "ds_report", "check-ds-ops.py", "portable-cxx"):
        assert setting in build


def test_the_smoke_test_expects_the_ops_ds_build_env_compiles():
    smoke = (REPO_ROOT / "docker" / "smoke-test.sh").read_text()
    listed = re.search(r"for op in \(([^)]*)\)", smoke).group(1)
    wanted = [
        name[len("DS_BUILD_") :].lower()
        for name, value in ds_build_settings().items()
        if name.startswith("DS_BUILD_") and name != "DS_BUILD_OPS" and value == "1"
    ]
    assert set(re.findall(r'"(\w+)"', listed)) == set(wanted)


def test_cuda_toolkit_script_refuses_a_cpu_torch_and_a_remove_without_install(tmp_path):
    """The test venv's torch is the CPU build: no CUDA version to fetch nvcc for."""
    script = str(REPO_ROOT / "docker" / "cuda-toolkit.sh")
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    for args, expected in (
        (["install"], "error: this torch does not require NVIDIA's cuda-toolkit wheels"),
        (["remove"], "error: "),
        ([], "error: usage: "),
    ):
        result = subprocess.run([script, *args], env=env, capture_output=True, text=True)
        assert result.returncode != 0 and result.stdout == "", args
        assert result.stderr.startswith(expected) and result.stderr.count("\n") == 1, result.stderr


def test_check_ds_ops_fails_when_an_op_was_not_compiled():
    """The test venv's DeepSpeed was installed with DS_BUILD_OPS=0: nothing compiled in."""
    env = {**os.environ, **ds_build_settings()}
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "docker" / "check-ds-ops.py")],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 1
    assert (
        result.stderr
        == "error: DeepSpeed ops not compiled in: cpu_adam, fused_adam (see the build log)\n"
    )


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(
        name.replace("-", "_"), REPO_ROOT / "docker" / name
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_sass_reads_cuobjdumps_listing():
    sass = load_script("check-sass.py")
    listing = (
        "\nFatbin elf code:\n================\narch = sm_75\n"
        "ELF file    1: fused_adam_op.1.sm_75.cubin\n"
        "ELF file    2: fused_adam_op.2.sm_80.cubin\n"
        "ELF file    3: fused_adam_op.3.sm_90a.cubin\n"
    )
    assert sass.cubin_archs(listing) == {"sm_75", "sm_80", "sm_90a"}
    assert sass.wanted_archs(ds_build_settings()["TORCH_CUDA_ARCH_LIST"]) == {
        "sm_75", "sm_80", "sm_89", "sm_90"
    }  # fmt: skip
    assert sass.wanted_archs("8.0 9.0+PTX") == {"sm_80", "sm_90"}


def run_check_stack(tmp_path, python_version: str, check_dir):
    """check-stack.sh with a stand-in Python that reports `python_version`: the refusals
    come before anything is built, so the stand-in is never asked for more."""
    python = tmp_path / f"python{python_version}"
    python.write_text(f"#!/bin/sh\necho {python_version}\n")
    python.chmod(0o755)
    result = subprocess.run(
        [str(CHECK_STACK)],
        env={**os.environ, "PYTHON": str(python), "IMAGE_CHECK_DIR": str(check_dir)},
        capture_output=True, text=True,
    )  # fmt: skip
    return python, result


def test_check_stack_refuses_a_python_other_than_the_images(tmp_path):
    other, result = run_check_stack(tmp_path, "3.11", tmp_path / "check")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"error: {other} is Python 3.11; the image runs 3.12")
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "check").exists(), "refused before building anything"


def test_check_stack_refuses_to_build_inside_the_repository(tmp_path):
    _, result = run_check_stack(tmp_path, "3.12", REPO_ROOT / "x")
    assert result.returncode == 2 and "is inside the repository" in result.stderr
    assert not (REPO_ROOT / "x").exists()


def test_portable_cxx_pins_the_cpu_target(tmp_path):
    """DeepSpeed's -march=native would tie the CPU op to the build machine's CPU."""
    fake = tmp_path / "g++"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    result = subprocess.run(
        [str(REPO_ROOT / "docker" / "portable-cxx"), "-O3", "-march=native", "-fopenmp",
         "-D__AVX512__", "-I/dir with space", "-c", "cpu_adam.cpp"],
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert result.stdout.splitlines() == [
        "-O3", "-march=x86-64-v3", "-fopenmp", "-D__AVX256__", "-I/dir with space",
        "-c", "cpu_adam.cpp",
    ]  # fmt: skip


def test_the_reduction_server_plugin_is_optional_and_off_by_default():
    run = next(rest for keyword, rest in instructions() if "google-reduction-server" in rest)
    args = [rest for keyword, rest in instructions() if keyword == "ARG"]
    assert "REDUCTION_SERVER=0" in args
    # With the default the step does nothing at all (no apt, no network).
    result = subprocess.run(
        [shutil.which("bash"), "-o", "pipefail", "-c", run],
        env={"REDUCTION_SERVER": "0", "PATH": "/nonexistent"}, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0 and not result.stdout + result.stderr


def test_check_pip_passes_on_exactly_the_listed_lines_and_names_any_other(tmp_path):
    """docker/check-pip.sh with this environment's own pip: the list of what its `pip check`
    reports passes; a line it does not report, or one it reports and the list lacks, fails
    the build and is named."""
    pip_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": f"{pip_dir}:{os.environ['PATH']}"}
    reported = subprocess.run([os.path.join(pip_dir, "pip"), "check"], env=env,
                              capture_output=True, text=True).stdout.splitlines()  # fmt: skip
    reported = [line for line in reported if not line.startswith("No broken requirements")]
    script = str(REPO_ROOT / "docker" / "check-pip.sh")

    def check(lines: list[str]) -> subprocess.CompletedProcess:
        listed = tmp_path / "pip-check.txt"
        listed.write_text("# a comment\n" + "".join(f"here: {line}\n" for line in lines)
                          + "elsewhere: b 1 requires c, which is not installed.\n")  # fmt: skip
        return subprocess.run([script, "here", str(listed)], env=env, capture_output=True,
                              text=True)  # fmt: skip

    passed = check(reported)
    assert passed.returncode == 0, passed.stderr
    assert passed.stdout == (
        f"pip check: only the {len(reported)} unmet requirement(s) that pip-check.txt lists for "
        "here (packages installed without their dependencies on purpose)\n"
    )
    extra = "a 1 requires b, which is not installed."
    failed = check([*reported[1:], extra])
    assert failed.returncode == 1
    wanted = ["error: pip check differs from what pip-check.txt lists for here",
              f"  listed, no longer reported: {extra}"]  # fmt: skip
    if reported:
        wanted.append(f"  reported, not listed: {reported[0]}")
    assert sorted(failed.stderr.splitlines()[1:]) == sorted(wanted[1:])
    assert failed.stderr.splitlines()[0] == wanted[0]


@pytest.mark.parametrize("name", ["smoke-test.sh", "serve-smoke-test.sh", "check-pip.sh",
                                  "image-test.sh"])  # fmt: skip
def test_the_smoke_test_script_is_valid_bash(name):
    script = REPO_ROOT / "docker" / name
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def image_python(root) -> tuple:
    """The image's Python as the Dockerfile lays it out, under `root`: a venv made with the
    builder's own `python3 -m venv` flags, holding the dependencies (linked, see
    `venv_with_dependencies`), and the package installed by the Dockerfile's own last
    `pip install`, from a copy of what the final stage copies. Returns (python, the
    environment the image's ENV gives a process, the user site's base)."""
    builder = stages()[0]
    command = next(
        command
        for keyword, rest in builder
        if keyword == "RUN"
        for command in shell_commands(rest)
        if command[1:3] == ["-m", "venv"]
    )
    python = venv_with_dependencies(
        root / "venv", system_site_packages="--system-site-packages" in command
    )
    user_base = root / final_stage_env()["PYTHONUSERBASE"].strip("/").replace("/", "-")
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    env["PYTHONUSERBASE"] = str(user_base)
    source = root / "opt-trainer"
    for name in ("constraints.txt", "pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name if source.exists() else _mkdir(source) / name)
    shutil.copytree(
        REPO_ROOT / "trainer", source / "trainer", ignore=shutil.ignore_patterns("__pycache__")
    )
    installed = pip_in(python, "install", *pip_installs()[-1], env=env, cwd=source)
    assert installed.returncode == 0, installed.stderr
    return python, env, user_base


def _mkdir(path):
    path.mkdir(parents=True)
    return path


def installed_from(python, env: dict[str, str], cwd) -> list[str]:
    """Where each copy of the package that this Python sees was installed from (PEP 610),
    in sys.path's order: the first is the one imported."""
    script = (
        "import importlib.metadata as m, json; print(json.dumps([json.loads(d.read_text("
        "'direct_url.json'))['url'] for d in m.distributions(name='vertex-hf-trainer')]))"
    )
    found = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, env=env, cwd=cwd, check=True
    )
    return json.loads(found.stdout)


@pytest.mark.parametrize("user", [False, True], ids=["plain", "user"])
def test_the_image_runs_the_copy_a_package_installer_puts_in(tmp_path, checkout_sdist, user):
    """A Python package job's installer (pip, with or without --user) puts the sdist into
    the image: either way `python -m trainer` then runs the sdist's code. A --user install
    replaces the image's copy; a plain one goes to the venv, before it on sys.path (pip
    leaves it: "outside environment")."""
    python, env, user_base = image_python(tmp_path)
    assert module_origin(python, "trainer.__main__", env, tmp_path).is_relative_to(user_base)
    assert installed_from(python, env, tmp_path) == [(tmp_path / "opt-trainer").as_uri()]

    flags = ["--user"] if user else []
    installed = pip_in(python, "install", *flags, "--no-build-isolation", str(checkout_sdist),
                       env=env, cwd=tmp_path)  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    where = user_base if user else tmp_path / "venv"
    assert module_origin(python, "trainer.__main__", env, tmp_path).is_relative_to(where)
    image_copy = [] if user else [(tmp_path / "opt-trainer").as_uri()]
    assert installed_from(python, env, tmp_path) == [checkout_sdist.as_uri(), *image_copy]


def test_pip_refuses_a_user_install_in_the_layouts_the_image_avoids(tmp_path, checkout_sdist):
    """Why the image is laid out as it is: a venv without system site packages has no user
    site, and a package in the venv's own site-packages cannot be shadowed from it."""
    env = {**os.environ, "PYTHONUSERBASE": str(tmp_path / "user")}
    user_install = ["install", "--user", "--no-build-isolation", str(checkout_sdist)]
    isolated = venv_with_dependencies(tmp_path / "isolated")
    refused = pip_in(isolated, *user_install, env=env)
    assert refused.returncode != 0
    assert "User site-packages are not visible in this virtualenv" in refused.stderr

    shared = venv_with_dependencies(tmp_path / "shared", system_site_packages=True)
    installed = pip_in(shared, "install", "--no-deps", "--no-build-isolation", str(checkout_sdist),
                       env=env)  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    refused = pip_in(shared, *user_install, env=env)
    assert refused.returncode != 0 and "lack sys.path precedence" in refused.stderr


def test_the_installing_command_runs_the_sdist_on_the_image_offline(tmp_path, checkout_sdist):
    """--python_package_command's container command, run by a shell as Vertex AI would run
    it on the image (the sdist where the /gcs/ mount would show it; no package index):
    pip puts the sdist in the user site over the image's copy, and the launcher of the
    sdist gets the pool's args."""
    python, env, user_base = image_python(tmp_path)
    uri = f"gs://bucket/job/packages/0123456789abcdef/{checkout_sdist.name}"
    shell, flag, script, name = installing_command(uri)
    assert f"/gcs/bucket/job/packages/0123456789abcdef/{checkout_sdist.name}" in script
    script = script.replace(f"/gcs/{uri.removeprefix('gs://')}", str(checkout_sdist))
    env |= {"PATH": f"{python.parent}:{env['PATH']}", "PIP_NO_INDEX": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}  # fmt: skip
    ran = subprocess.run([shell, flag, script, name, "--help"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "--nproc_per_node" in ran.stdout, "the launcher's own --help, from the args"
    assert module_origin(python, "trainer.__main__", env, tmp_path).is_relative_to(user_base)
    assert installed_from(python, env, tmp_path) == [checkout_sdist.as_uri()]
