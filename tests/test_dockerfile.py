"""docker/Dockerfile, checked without a Docker engine: lint, the dependency set it installs,
the DeepSpeed ops it compiles (and the settings it shares with docker/check-stack.sh), its
two stages, its entrypoint, what the build context may contain, and its Python laid out
as the Dockerfile lays it out, taking a newer copy of the package from a Python package
job's installer."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import shlex
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
from trainer import jobspec
from trainer.preflight import vertex_machines

DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"
DS_BUILD_ENV = REPO_ROOT / "docker" / "ds-build.env"
CHECK_STACK = REPO_ROOT / "docker" / "check-stack.sh"

COMPUTE_CAPABILITY = {
    "NVIDIA_TESLA_T4": "7.5",
    "NVIDIA_TESLA_A100": "8.0",
    "NVIDIA_A100_80GB": "8.0",
    "NVIDIA_L4": "8.9",
    "NVIDIA_H100_80GB": "9.0",
    "NVIDIA_H100_MEGA_80GB": "9.0",
    "NVIDIA_H200_141GB": "9.0",
}
TORCH_CUDA = {"2.13": "13.0"}
"""CUDA version of the torch wheels on PyPI, by torch minor version (the base image's
CUDA, whose forward-compatibility libraries the launcher may use, must match it)."""


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    result, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.strip().startswith("#") or not (line.strip() or current):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1]
            continue
        keyword, _, rest = (current + line).strip().partition(" ")
        result.append((keyword.upper(), rest.strip()))
        current = ""
    return result


def shell_commands(run: str) -> list[list[str]]:
    """The simple commands of a RUN line, split on && ; | (quotes respected)."""
    lexer = shlex.shlex(run, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, current = [], []
    for token in lexer:
        if token in ("&&", ";", "|", "||"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    return [command for command in [*commands, current] if command]


def pip_installs() -> list[list[str]]:
    """Each `pip install` of the RUN instructions, as its arguments (in build order)."""
    installs = []
    for keyword, rest in instructions():
        for command in shell_commands(rest) if keyword == "RUN" else []:
            words = [w for w in command if not re.fullmatch(r"[A-Z_]+=.*", w)]  # env prefixes
            if words[:2] == ["pip", "install"]:
                installs.append(words[2:])
    return installs


def targets(pip_args: list[str]) -> list[str]:
    """What a `pip install` installs: its non-flag arguments (flag values skipped)."""
    found, skip = [], False
    for word in pip_args:
        if skip:
            skip = False
        elif word in ("--constraint", "-c", "--requirement", "-r"):
            skip = True
        elif not word.startswith("-"):
            found.append(word)
    return found


def makefile_installs() -> list[list[str]]:
    return [
        shlex.split(line.split("$(PIP)", 1)[1])
        for line in (REPO_ROOT / "Makefile").read_text().splitlines()
        if "$(PIP)" in line and not line.startswith("PIP ")
    ]


def constraint_pins() -> dict[str, str]:
    pins = {}
    for line in (REPO_ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def requirement_name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~\[; ]", requirement)[0]).lower()


def test_hadolint_finds_nothing():
    result = subprocess.run([hadolint(), str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_every_ignored_hadolint_rule_is_justified():
    text = DOCKERFILE.read_text()
    ignored = re.findall(r"# hadolint ignore=([\w,]+)", text)
    assert ignored, "no ignores: then this test has nothing to check; delete it"
    comments = [line for line in text.splitlines()
                if line.startswith("#") and "hadolint ignore" not in line]  # fmt: skip
    for rule in {rule for rules in ignored for rule in rules.split(",")}:
        assert any(rule in line for line in comments), f"{rule} is ignored without a reason"


def test_the_image_installs_the_ci_pinned_set_in_the_makefiles_order():
    docker, make = pip_installs(), makefile_installs()
    for args in docker:
        assert "--constraint" in args and args[args.index("--constraint") + 1] == "constraints.txt"
        assert not any(re.search(r"[=<>]=|[<>]", t) for t in targets(args)), args  # no own pins
    copies = [rest for keyword, rest in instructions() if keyword == "COPY"]
    assert copies[0] == "constraints.txt ./", "constraints.txt is copied in before any install"

    # The Makefile's steps, in its order: torch; deepspeed without build isolation; the
    # package (`.[test]` there; in the image its dependencies, read from pyproject.toml, at
    # that point and its code last); openai-whisper without dependencies.
    def steps(installs):
        return [(targets(a)[0].split("[")[0], "--no-build-isolation" in a, "--no-deps" in a,
                 "--no-warn-conflicts" in a)
                for a in installs if targets(a)]  # fmt: skip

    project = [step for step in steps(docker) if step[0] != "."]
    assert [step for step in steps(make) if step[0] != "."] == project
    assert [step[0] for step in steps(make)].index(".") == 2
    assert steps(docker)[-1][0] == "."
    requirements = next(i for i, a in enumerate(docker) if "--requirement" in a)
    whisper = next(i for i, a in enumerate(docker) if targets(a) == ["openai-whisper"])
    assert requirements < whisper, "no resolver runs after the dependency-less install"
    assert docker[-1][:3] == ["--user", "--no-deps", "--no-build-isolation"], (
        "the code layer adds nothing, in the user site (see the package's tests below)"
    )

    pins = constraint_pins()
    for package, *_ in project:
        assert requirement_name(package) in pins, f"{package} is not pinned in constraints.txt"


def test_the_image_reads_the_packages_dependencies_from_pyproject():
    """Run the Dockerfile's own command that lists them; every one is pinned for CI."""
    run = next(rest for keyword, rest in instructions() if keyword == "RUN" and "tomllib" in rest)
    command = shell_commands(run)[0]
    assert command[:2] == ["python", "-c"] and command[3] == ">"
    listed = subprocess.run(
        [sys.executable, "-c", command[2]], cwd=REPO_ROOT, capture_output=True, text=True
    ).stdout.split()
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["gpu"]
    assert listed == [dep.replace(" ", "") for dep in wanted]
    assert any(requirement_name(dep) == "bitsandbytes" for dep in listed), "--load_in_8bit"
    pins = constraint_pins()
    assert [dep for dep in listed if requirement_name(dep) not in pins] == []


def test_code_changes_do_not_reinstall_dependencies():
    order = [(keyword, rest) for keyword, rest in instructions() if keyword in ("COPY", "RUN")]
    code = order.index(("COPY", "trainer ./trainer"))
    after = [rest for keyword, rest in order[code:] if keyword == "RUN"]
    assert len(after) == 1 and "--no-deps" in after[0], "only the package itself, no deps"
    dependency_runs = [i for i, (keyword, rest) in enumerate(order) if "pip install" in rest]
    assert all(i < code for i in dependency_runs[:-1])


def ds_build_settings() -> dict[str, str]:
    """docker/ds-build.env as the Dockerfile and check-stack.sh see it: sourced by bash."""
    script = f'set -a; . "{DS_BUILD_ENV}"; set +a; env -0'
    result = subprocess.run(["bash", "-c", script], env={}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    pairs = [entry.split("=", 1) for entry in result.stdout.split("\0") if "=" in entry]
    return {k: v for k, v in pairs if k.startswith("DS_") or k == "TORCH_CUDA_ARCH_LIST"}


def arg_defaults() -> dict[str, str]:
    return dict(
        re.match(r'(\w+)="?([^"]*)"?', rest).groups()
        for keyword, rest in instructions()
        if keyword == "ARG" and "=" in rest
    )


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


@pytest.mark.parametrize("script", [DOCKERFILE, CHECK_STACK])
def test_the_image_and_its_check_share_one_set_of_deepspeed_settings(script):
    """Both read docker/ds-build.env and neither sets a DS_* variable or the arch list
    itself, so the stack `make image-check` builds is the image's."""
    text = script.read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not re.findall(r"\b(DS_[A-Z_]+|TORCH_CUDA_ARCH_LIST)=", code), script.name
    assert re.search(r"\. \S*/ds-build\.env", code), f"{script.name} does not source it"
    assert 'cuda-toolkit.sh" install' in code or "cuda-toolkit.sh install" in code
    assert "--no-build-isolation --constraint constraints.txt deepspeed" in code
    assert "portable-cxx" in code and "check-ds-ops.py" in code
    # pip's wheel cache ignores DS_BUILD_*: a DeepSpeed wheel built before (with other ops,
    # or none, as `make install` builds it) must never be reused.
    assert "PIP_NO_CACHE_DIR=1" in code or "--no-cache-dir --no-build-isolation" in code


def test_the_smoke_test_expects_the_ops_ds_build_env_compiles():
    smoke = (REPO_ROOT / "docker" / "smoke-test.sh").read_text()
    listed = re.search(r"for op in \(([^)]*)\)", smoke).group(1)
    wanted = [
        name[len("DS_BUILD_") :].lower()
        for name, value in ds_build_settings().items()
        if name.startswith("DS_BUILD_") and name != "DS_BUILD_OPS" and value == "1"
    ]
    assert set(re.findall(r'"(\w+)"', listed)) == set(wanted)


def stages() -> list[list[tuple[str, str]]]:
    """The instructions of each stage, the FROM line first."""
    result = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, rest))
    return result


def test_the_final_stage_is_the_cuda_base_image_with_the_builders_venv():
    builder, final = stages()
    assert builder[0] == ("FROM", "${CUDA_BASE} AS builder") and final[0] == (
        "FROM",
        "${CUDA_BASE}",
    )
    torch_version = constraint_pins()["torch"].rsplit(".", 1)[0]
    match = re.fullmatch(
        r"nvidia/cuda:(\d+\.\d+)\.\d+-base-ubuntu[\d.]+", arg_defaults()["CUDA_BASE"]
    )
    assert match, "the smallest CUDA image: torch's wheels bring the CUDA libraries"
    assert match.group(1) == TORCH_CUDA[torch_version], "its forward-compat libcuda is torch's CUDA"

    copies = [rest for keyword, rest in final if keyword == "COPY"]
    assert "--from=builder /opt/venv /opt/venv" in copies
    assert all(
        "--from" not in rest or rest == "--from=builder /opt/venv /opt/venv" for rest in copies
    )
    final_text = " ".join(rest for _, rest in final)
    for build_only in ("cuda-toolkit.sh", "ds-build.env", "python3-venv", "nvcc --version"):
        assert build_only not in final_text
    check = next(rest for keyword, rest in final if keyword == "RUN" and "nvcc" in rest)
    assert check.startswith("! command -v nvcc") and "/usr/local/cuda/compat/libcuda.so" in check


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


def test_image_check_is_a_make_target_of_its_own():
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(
        r"^image-check:\n\tPYTHON=\$\(PYTHON\) docker/check-stack\.sh$", makefile, re.M
    )
    assert not re.search(r"^test:.*image-check", makefile, re.M), "not run by every CI run"


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


def test_the_entrypoint_is_the_launcher_with_no_default_arguments():
    entrypoints = [rest for keyword, rest in instructions() if keyword == "ENTRYPOINT"]
    assert entrypoints == ['["python", "-m", "trainer"]']
    assert not [rest for keyword, rest in instructions() if keyword == "CMD"], "no args: demo"
    env = final_stage_env()
    assert env["PATH"].startswith("/opt/venv/bin:/opt/python-user/bin:"), "`python` is the venv's"
    assert env["PYTHONUSERBASE"] == "/opt/python-user", "the user site, where trainer lives"


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


def dockerignore_excludes(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    patterns = [line.strip() for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()]
    excluded = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in filter(lambda p: p and not p.startswith("#"), patterns):
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
            excluded = not negated
    return excluded


def test_the_build_context_holds_what_the_image_copies_and_nothing_else():
    copied = [
        source
        for keyword, rest in instructions()
        if keyword == "COPY" and not rest.startswith("--from")
        for source in rest.split()[:-1]
    ]
    for source in copied:
        assert not dockerignore_excludes(source), f"COPY {source} is excluded by .dockerignore"
    for inside in ("trainer/launcher/main.py", "trainer/recipes/whisper-small.yaml",
                   "trainer/presets/zero2.json"):  # fmt: skip
        assert not dockerignore_excludes(inside)
    for outside in (".git/config", ".venv/bin/python", "outputs/demo/model/config.json",
                    "tests/test_cli.py", "docs/deploy.md", ".env", "service-account.json",
                    "trainer/__pycache__/launch.cpython-312.pyc", "config.yaml"):  # fmt: skip
        assert dockerignore_excludes(outside), f"{outside} would be sent to the Docker daemon"


@pytest.mark.parametrize("keyword", ["ENV", "ARG"])
def test_no_credentials_are_baked_into_a_layer(keyword):
    for instruction, rest in instructions():
        if instruction == keyword:
            for name in re.findall(r"(\w+)=", rest):
                assert not re.search(r"TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL", name), name


def test_the_smoke_test_script_is_valid_bash():
    script = REPO_ROOT / "docker" / "smoke-test.sh"
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def final_stage_env() -> dict[str, str]:
    """The final stage's ENV settings (NAME=VALUE pairs)."""
    settings = [rest for keyword, rest in stages()[-1] if keyword == "ENV"]
    return dict(pair.split("=", 1) for rest in settings for pair in shlex.split(rest))


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


def test_the_image_check_lays_out_python_as_the_image_does():
    """`make image-check` builds the image's layout: a venv with system site packages, and
    the package with --user in a user site of its own."""
    code = CHECK_STACK.read_text()
    assert re.search(r'-m venv --system-site-packages "\$dest/venv"', code)
    assert 'PYTHONUSERBASE="$dest/python-user"' in code
    package = [line for line in code.splitlines() if line.startswith("pip install") and
               line.endswith(" .")]  # fmt: skip
    assert package == [f"pip install {' '.join(pip_installs()[-1])}"]


def test_the_installing_command_runs_the_sdist_on_the_image_offline(tmp_path, checkout_sdist):
    """--python_package_command's container command, run by a shell as Vertex AI would run
    it on the image (the sdist where the /gcs/ mount would show it; no package index):
    pip puts the sdist in the user site over the image's copy, and the launcher of the
    sdist gets the pool's args."""
    python, env, user_base = image_python(tmp_path)
    uri = f"gs://bucket/job/packages/0123456789abcdef/{checkout_sdist.name}"
    shell, flag, script, name = jobspec.installing_command(uri)
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
