"""docker/Dockerfile, read without a Docker engine: the dependency set it installs, the
DeepSpeed settings it shares with docker/check-stack.sh, its two stages, its entrypoint,
what the build context may contain, and the Python layout `make image-check` builds. What
takes a program run (hadolint, the Dockerfile's own commands, the docker/ scripts, pip in
fresh virtual environments laid out as the image's Python):
tests/processes/test_dockerfile_runs.py."""

from __future__ import annotations

import fnmatch
import re
import shlex

import pytest

from tests.support.helpers import REPO_ROOT
from tests.support.image_build import (
    CHECK_STACK,
    DOCKERFILE,
    constraint_pins,
    final_stage_env,
    instructions,
    pip_installs,
    requirement_name,
    stages,
)

TORCH_CUDA = {"2.13": "13.0"}
"""CUDA version of the torch wheels on PyPI, by torch minor version (the base image's
CUDA, whose forward-compatibility libraries the launcher may use, must match it)."""


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


def test_code_changes_do_not_reinstall_dependencies():
    order = [(keyword, rest) for keyword, rest in instructions() if keyword in ("COPY", "RUN")]
    code = order.index(("COPY", "trainer ./trainer"))
    after = [rest for keyword, rest in order[code:] if keyword == "RUN"]
    assert len(after) == 1 and "--no-deps" in after[0], "only the package itself, no deps"
    dependency_runs = [i for i, (keyword, rest) in enumerate(order) if "pip install" in rest]
    assert all(i < code for i in dependency_runs[:-1])


def arg_defaults() -> dict[str, str]:
    return dict(
        re.match(r'(\w+)="?([^"]*)"?', rest).groups()
        for keyword, rest in instructions()
        if keyword == "ARG" and "=" in rest
    )


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


def test_image_check_is_a_make_target_of_its_own():
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(
        r"^image-check:\n\tPYTHON=\$\(PYTHON\) docker/check-stack\.sh$", makefile, re.M
    )
    assert not re.search(r"^test:.*image-check", makefile, re.M), "not run by every CI run"


def test_the_entrypoint_is_the_launcher_with_no_default_arguments():
    entrypoints = [rest for keyword, rest in instructions() if keyword == "ENTRYPOINT"]
    assert entrypoints == ['["python", "-m", "trainer"]']
    assert not [rest for keyword, rest in instructions() if keyword == "CMD"], "no args: demo"
    env = final_stage_env()
    assert env["PATH"].startswith("/opt/venv/bin:/opt/python-user/bin:"), "`python` is the venv's"
    assert env["PYTHONUSERBASE"] == "/opt/python-user", "the user site, where trainer lives"


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
                    "tests/unit/test_cli.py", "docs/deploy.md", ".env", "service-account.json",
                    "trainer/__pycache__/launch.cpython-312.pyc", "config.yaml"):  # fmt: skip
        assert dockerignore_excludes(outside), f"{outside} would be sent to the Docker daemon"


@pytest.mark.parametrize("keyword", ["ENV", "ARG"])
def test_no_credentials_are_baked_into_a_layer(keyword):
    for instruction, rest in instructions():
        if instruction == keyword:
            for name in re.findall(r"(\w+)=", rest):
                assert not re.search(r"TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL", name), name


def test_the_image_check_lays_out_python_as_the_image_does():
    """`make image-check` builds the image's layout: a venv with system site packages, and
    the package with --user in a user site of its own."""
    code = CHECK_STACK.read_text()
    assert re.search(r'-m venv --system-site-packages "\$dest/venv"', code)
    assert 'PYTHONUSERBASE="$dest/python-user"' in code
    package = [line for line in code.splitlines() if line.startswith("pip install") and
               line.endswith(" .")]  # fmt: skip
    assert package == [f"pip install {' '.join(pip_installs()[-1])}"]
