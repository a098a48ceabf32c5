"""docker/Dockerfile, read without a Docker engine: the dependency set it installs, the
DeepSpeed settings it shares with docker/check-stack.sh, the training image's two stages,
its entrypoint, what the build context may contain, and the Python layout `make
image-check` builds; its `serve` target (the serving image) and how cloudbuild.yaml builds,
smoke-tests and pushes it. What takes a program run (hadolint, the Dockerfile's own
commands, the docker/ scripts, pip in fresh virtual environments laid out as the image's
Python): tests/processes/test_dockerfile_runs.py."""

from __future__ import annotations

import fnmatch
import re
import shlex

import pytest
import yaml

from tests.support.helpers import REPO_ROOT
from tests.support.image_build import (
    CHECK_STACK,
    CLOUDBUILD,
    DOCKERFILE,
    PIP_CHECK,
    RAY_DOCKERFILE,
    constraint_pins,
    final_stage_env,
    instructions,
    pip_installs,
    requirement_name,
    shell_commands,
    stages,
)
from trainer.serve.contract import DEFAULT_PORT

TORCH_CUDA = {"2.13": "13.0"}
"""CUDA version of the torch wheels on PyPI, by torch minor version (the base image's
CUDA, whose forward-compatibility libraries the launcher may use, must match it)."""


def targets(pip_args: list[str]) -> list[str]:
    """What a `pip install` installs: its non-flag arguments (flag values skipped)."""
    found, skip = [], False
    for word in pip_args:
        if skip:
            skip = False
        elif word in ("--constraint", "-c", "--requirement", "-r", "--build-constraint"):
            skip = True
        elif not word.startswith("-"):
            found.append(word)
    return found


def stage_named(name: str) -> list[tuple[str, str]]:
    """The instructions of the stage `FROM ... AS name`, the FROM line first."""
    return next(stage for stage in stages() if stage[0][1].endswith(f" AS {name}"))


def training_stages() -> list[list[tuple[str, str]]]:
    """The training image's stages: the builder and the last stage (the default target)."""
    return [stage_named("builder"), stages()[-1]]


def stage_pip_installs(stage: list[tuple[str, str]]) -> list[list[str]]:
    """Each `pip install` of the stage's RUN instructions, as `pip_installs` reads them."""
    installs = []
    for keyword, rest in stage:
        for command in shell_commands(rest) if keyword == "RUN" else []:
            words = [w for w in command if not re.fullmatch(r"[A-Z_]+=.*", w)]  # env prefixes
            if words[:2] == ["pip", "install"]:
                installs.append(words[2:])
    return installs


def install_steps(installs: list[list[str]]) -> list[tuple[str, bool, bool, bool]]:
    """(what, without build isolation, without dependencies, without conflict warnings) of
    each `pip install` that names what it installs (a --requirement file names nothing)."""
    return [(targets(a)[0].split("[")[0], "--no-build-isolation" in a, "--no-deps" in a,
             "--no-warn-conflicts" in a)
            for a in installs if targets(a)]  # fmt: skip


def makefile_installs() -> list[list[str]]:
    """The Makefile's installs: `$(PIP)` (the pinned set, build dependencies too) or
    `$(PIP_PINNED)` (the first, by the venv's own pip), in order, as pip arguments."""
    return [
        shlex.split(re.split(r"\$\(PIP(?:_PINNED)?\)", line, maxsplit=1)[1])
        for line in (REPO_ROOT / "Makefile").read_text().splitlines()
        if re.search(r"\$\(PIP(?:_PINNED)?\)", line) and not line.startswith("PIP")
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
    docker = [args for stage in training_stages() for args in stage_pip_installs(stage)]
    make = makefile_installs()
    for args in pip_installs():  # every stage's, the serving image's too
        assert "--constraint" in args and args[args.index("--constraint") + 1] == "constraints.txt"
        assert not any(re.search(r"[=<>]=|[<>]", t) for t in targets(args)), args  # no own pins
    copies = [rest for keyword, rest in instructions() if keyword == "COPY"]
    assert copies[0] == "constraints.txt ./", "constraints.txt is copied in before any install"

    # The Makefile's steps, in its order: pip, setuptools and wheel; torch; deepspeed without
    # build isolation; the package (`.[test]` there; in the image its dependencies, read from
    # pyproject.toml, at that point and its code last); openai-whisper without dependencies.
    steps = install_steps
    project = [step for step in steps(docker) if step[0] != "."]
    assert [step for step in steps(make) if step[0] != "."] == project
    assert [step[0] for step in steps(make)].index(".") == 3
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


BUILD_TOOLS = ["pip", "setuptools", "wheel"]


def test_every_environment_installs_the_pinned_pip_setuptools_and_wheel_first():
    """pip freeze leaves these three out unless told (--all); unpinned, setuptools (the build
    backend of DeepSpeed's wheel and of this package) was whatever was newest that day."""
    pins = constraint_pins()
    assert all(tool in pins for tool in BUILD_TOOLS), "constraints.txt pins them"
    assert "pip freeze --all " in (REPO_ROOT / "constraints.txt").read_text()
    for stage in (stage_named("builder"), stage_named("serve")):  # the stages that make a venv
        assert targets(stage_pip_installs(stage)[0]) == BUILD_TOOLS, stage[0]
    assert targets(makefile_installs()[0]) == BUILD_TOOLS
    first = next(line for line in CHECK_STACK.read_text().splitlines()
                 if line.startswith("pip install"))  # fmt: skip
    assert first == "pip install --constraint constraints.txt pip setuptools wheel"
    ray = re.findall(r"pip install ([^&\n]*)", RAY_DOCKERFILE.read_text())
    assert ray[0].split()[:5] == ["--constraint", "constraints.txt", *BUILD_TOOLS]
    # What pip builds in an isolated environment (an sdist dependency, the Ray image's
    # package) gets the pinned setuptools too.
    for args in pip_installs():
        if "--requirement" in args:
            assert args[args.index("--build-constraint") + 1] == "constraints.txt", args
    assert '--build-constraint constraints.txt ".[ray]"' in RAY_DOCKERFILE.read_text()
    assert "PIP := $(PIP_PINNED) --build-constraint constraints.txt" in (
        REPO_ROOT / "Makefile").read_text()  # fmt: skip


@pytest.mark.parametrize(("image", "stage"), [("training", None), ("serve", "serve")])
def test_pip_check_is_held_to_the_listed_exceptions_in_the_last_layer(image, stage):
    """docker/pip-check.txt lists what `pip check` reports in each image on purpose; the
    layer that installs the package runs docker/check-pip.sh on it, so a new unmet
    requirement fails the build. Each listed line is one the Dockerfile explains: a package
    installed without its dependencies, or DeepSpeed, which the serving image leaves out."""
    instructions_ = stages()[-1] if stage is None else stage_named(stage)
    last = [rest for keyword, rest in instructions_ if keyword == "RUN"][-1]
    assert shell_commands(last)[-1] == ["./check-pip.sh", image, "pip-check.txt"]
    copied = [rest.split()[:-1] for keyword, rest in instructions_ if keyword == "COPY"]
    assert any({"docker/check-pip.sh", "docker/pip-check.txt"} <= set(c) for c in copied)
    listed = [line.split(": ", 1)[1] for line in PIP_CHECK.read_text().splitlines()
              if line.startswith(f"{image}: ")]  # fmt: skip
    assert listed, f"pip-check.txt lists nothing for {image}"
    without_deps = {targets(args)[0] for args in stage_pip_installs(
        stage_named("builder") + instructions_) if "--no-deps" in args}  # fmt: skip
    for line in listed:
        package, version = line.split()[:2]
        if package == "vertex-hf-trainer":
            assert image == "serve" and line.endswith("requires deepspeed, which is not installed.")
        else:
            assert package in without_deps, f"{line}: not a --no-deps install of {image}"
            assert constraint_pins()[requirement_name(package)] == version, line


@pytest.mark.parametrize("target", ["training", "serve"])
def test_code_changes_do_not_reinstall_dependencies(target):
    stage = stages()[-1] if target == "training" else stage_named(target)
    order = [(keyword, rest) for keyword, rest in stage if keyword in ("COPY", "RUN")]
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
    builder, final = stages()[0], stages()[-1]
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


def test_image_test_is_a_make_target_taking_the_engine_and_base_it_is_given():
    """`make image-test` is the same target on a workstation (docker, the real base) and on a
    machine that pulls from no registry (DOCKER=..., CUDA_BASE=<a stand-in>)."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"^DOCKER \?= docker$", makefile, re.M)
    assert re.search(r"^CUDA_BASE \?=$", makefile, re.M), "empty: the Dockerfile's own base"
    assert re.search(
        r'^image-test: install\n\tDOCKER="\$\(DOCKER\)" CUDA_BASE="\$\(CUDA_BASE\)" '
        r'RAY_BASE="\$\(RAY_BASE\)" PYTHON=\$\(BIN\)/python \\\n\t\tdocker/image-test\.sh$',
        makefile,
        re.M,
    )
    assert not re.search(r"^test(-all)?:.*image-test", makefile, re.M), "too long for CI"
    script = (REPO_ROOT / "docker" / "image-test.sh").read_text()
    assert "default_base=$(sed -n 's/^ARG CUDA_BASE=//p' docker/Dockerfile)" in script
    assert "CUDA_BASE=${CUDA_BASE:-$default_base}" in script
    assert re.search(r"^ARG RAY_BASE=\S+\nFROM \$\{RAY_BASE\}$", RAY_DOCKERFILE.read_text(), re.M)


IMAGES = ("vertex-hf-trainer", "vertex-hf-trainer-serve")
SHELL_OPERATORS = {"|", ">", "2>&1", "&&", ";"}


def docker_runs(lines: list[str]) -> list[list[str]]:
    """The `docker run` commands of these lines (backslash continuations joined), as words;
    the engine's name is dropped, so that `docker` and `"$DOCKER"` read alike."""
    text = "\n".join(lines).replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        line = line.strip()
        if re.match(r'^("\$DOCKER"|docker) run ', line):
            found.append(shlex.split(line, comments=True)[1:])
    return found


def image_and_arguments(words: list[str]) -> tuple[str, list[str], list[str]]:
    """A `docker run`'s image, the arguments after it (up to a shell operator) and its mounts."""
    at = next(i for i, word in enumerate(words) if word in IMAGES)
    arguments = []
    for word in words[at + 1 :]:
        if word in SHELL_OPERATORS:
            break
        arguments.append(word)
    mounts = [words[i + 1] for i, word in enumerate(words[:at]) if word == "-v"]
    return words[at], arguments, mounts


def test_every_documented_docker_run_is_one_that_make_image_test_runs():
    """The Dockerfile's header and docs/deploy.md's local runs are run by `make image-test`
    as written: the same image, arguments and mounts (its own port, detach and GPU flags
    aside). The one exception needs what no test machine has: the Hub and a token."""
    header = DOCKERFILE.read_text().split("\n\n")[0]
    header = [line.removeprefix("#") for line in header.splitlines()]
    deploy = (REPO_ROOT / "docs" / "deploy.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", deploy, re.S)
    documented = docker_runs(header) + docker_runs("\n".join(blocks).splitlines())
    needs_the_hub = [run for run in documented if "-e" in run and "HF_TOKEN" in run]
    assert len(needs_the_hub) == 1, needs_the_hub
    script = (REPO_ROOT / "docker" / "image-test.sh").read_text().splitlines()
    tested = [image_and_arguments(run) for run in docker_runs(script)
              if any(word in IMAGES for word in run)]  # fmt: skip
    assert len(documented) >= 6, documented
    for run in documented:
        if run in needs_the_hub:
            continue
        image, arguments, mounts = image_and_arguments(run)
        assert any(image == t_image and arguments == t_arguments and set(mounts) <= set(t_mounts)
                   for t_image, t_arguments, t_mounts in tested), shlex.join(run)  # fmt: skip


def test_the_entrypoint_is_the_launcher_with_no_default_arguments():
    entrypoints = [rest for keyword, rest in stages()[-1] if keyword == "ENTRYPOINT"]
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


# The serving image: docker/Dockerfile's `serve` target (python -m trainer.serve).

COMPILERS_AND_HEADERS = ("g++", "gcc", "clang", "build-essential", "python3-dev", "-dev ",
                         "cuda-toolkit", "nvcc", "ninja")  # fmt: skip


def serve_stage() -> list[tuple[str, str]]:
    return stage_named("serve")


def test_the_serving_target_is_a_stage_of_its_own_and_training_stays_the_default():
    names = [stage[0][1] for stage in stages()]
    assert names == ["${CUDA_BASE} AS builder", "${CUDA_BASE} AS serve", "${CUDA_BASE}"], (
        "a build without --target still gives the training image: the last stage"
    )
    copies = [rest for keyword, rest in serve_stage() if keyword == "COPY"]
    assert not [rest for rest in copies if rest.startswith("--from")], "nothing of the builder"


def test_the_serving_image_has_no_deepspeed_no_compiler_and_no_devel_base():
    """The same CUDA *base* image as the training image (torch's wheels bring the CUDA
    libraries), never devel; no compiler, no headers, no DeepSpeed; the ffmpeg binary,
    which decodes speech instances."""
    assert not re.search(r"-(devel|cudnn-devel)-", arg_defaults()["CUDA_BASE"])
    runs = [rest for keyword, rest in serve_stage() if keyword == "RUN"]
    apt = next(rest for rest in runs if "apt-get install" in rest)
    packages = shell_commands(apt)[1][shell_commands(apt)[1].index("--no-install-recommends") + 1 :]
    assert set(packages) == {"ffmpeg", "python3", "python3-venv"}, packages
    for tool in COMPILERS_AND_HEADERS:
        assert tool not in f"{apt} ", tool
    check = next(rest for rest in runs if "command -v nvcc" in rest)
    assert shell_commands(check) == [["!", "command", "-v", tool]
                                     for tool in ("nvcc", "cc", "gcc", "g++")]  # fmt: skip
    installs = stage_pip_installs(serve_stage())
    assert not [args for args in installs if "deepspeed" in targets(args)]
    assert not any("ds-build.env" in rest or "cuda-toolkit.sh" in rest for _, rest in serve_stage())
    package = next(rest for rest in runs if rest.startswith("pip install --no-deps --no-build"))
    assert "find_spec('deepspeed') is None" in package, "the build fails if DeepSpeed got in"


def test_the_serving_image_installs_the_training_images_set_less_deepspeed():
    """Its pip installs: the training image's, in its order, without DeepSpeed, its own
    dependencies from pyproject.toml (the `serve` extra, no `gpu` one), the package last
    and, not being run by Python package jobs, into the venv instead of a user site."""
    installs = stage_pip_installs(serve_stage())
    training = [args for stage in training_stages() for args in stage_pip_installs(stage)]
    assert install_steps(installs) == [
        step for step in install_steps(training) if step[0] != "deepspeed"
    ]
    assert installs[-1] == ["--no-deps", "--no-build-isolation", "--constraint",
                            "constraints.txt", "."]  # fmt: skip
    order = [(keyword, rest) for keyword, rest in serve_stage() if keyword in ("COPY", "RUN")]
    first_copy = next(i for i, (keyword, _) in enumerate(order) if keyword == "COPY")
    first_install = next(i for i, (_, rest) in enumerate(order) if "pip install" in rest)
    assert order[first_copy] == ("COPY", "constraints.txt ./") and first_copy < first_install
    listing = next(rest for _, rest in order if "tomllib" in rest)
    assert "['optional-dependencies']['serve']" in listing and "'gpu'" not in listing
    assert "if not dep.startswith('deepspeed')" in listing


def test_the_serving_image_runs_the_server_as_a_user_of_its_own():
    users = [rest for keyword, rest in serve_stage() if keyword == "USER"]
    assert len(users) == 1 and re.fullmatch(r"(\d+):(\d+)", users[0]), "numeric: runAsNonRoot"
    uid = int(users[0].split(":")[0])
    assert uid >= 1000 and uid != 1000, "not root, and not the ubuntu user of the base image"
    useradd = next(
        rest for keyword, rest in serve_stage() if keyword == "RUN" and "useradd" in rest
    )
    gid = int(users[0].split(":")[1])
    assert f"--uid {uid} --gid {gid}" in useradd and f"groupadd --gid {gid}" in useradd
    assert "--create-home" in useradd, "a home for caches"
    keywords = [keyword for keyword, _ in serve_stage()]
    after_user = keywords[keywords.index("USER") :]
    assert "RUN" not in after_user and "COPY" not in after_user, "nothing is installed as it"


def test_the_serving_image_listens_on_vertex_ais_default_port_with_the_server():
    stage = serve_stage()
    assert [rest for keyword, rest in stage if keyword == "EXPOSE"] == [str(DEFAULT_PORT)]
    assert [rest for keyword, rest in stage if keyword == "ENTRYPOINT"] == [
        '["python", "-m", "trainer.serve"]'
    ]
    assert not [rest for keyword, rest in stage if keyword == "CMD"], (
        "model: arg or AIP_STORAGE_URI"
    )
    env = dict(
        pair.split("=", 1)
        for rest in (rest for keyword, rest in stage if keyword == "ENV")
        for pair in shlex.split(rest)
    )
    assert env["PATH"].startswith("/opt/venv/bin:"), "`python` is the venv's"
    assert "PYTHONUSERBASE" not in env


def cloudbuild_steps() -> dict[str, dict]:
    return {step["id"]: step for step in yaml.safe_load(CLOUDBUILD.read_text())["steps"]}


SERVE_IMAGE = "${_REGION}-docker.pkg.dev/${PROJECT_ID}/${_REPOSITORY}/${_IMAGE}-serve:${_TAG}"


def test_cloud_build_builds_smoke_tests_and_pushes_the_serving_image():
    steps = cloudbuild_steps()
    build = steps["build-serve"]
    assert build["args"][0] == "build" and build["args"][-1] == "."
    assert {"--file=docker/Dockerfile", "--target=serve", f"--tag={SERVE_IMAGE}"} <= set(
        build["args"]
    )
    # After the training build: the classic builder built this stage there, and its layers
    # are reused only from the local cache, which a --cache-from would exclude.
    assert build["waitFor"] == ["build"]
    assert not [arg for arg in build["args"] if arg.startswith("--cache-from")]
    smoke = steps["smoke-test-serve"]
    assert smoke["waitFor"] == ["build-serve"] and smoke["entrypoint"] == "bash"
    assert smoke["args"][-1] == (
        f'docker run --rm --entrypoint=bash {SERVE_IMAGE} -c "$$(cat docker/serve-smoke-test.sh)"'
    )
    assert SERVE_IMAGE in yaml.safe_load(CLOUDBUILD.read_text())["images"], "pushed"
    assert list(steps)[-2:] == ["build-serve", "smoke-test-serve"]


def test_the_serving_smoke_test_checks_health_and_one_prediction():
    script = (REPO_ROOT / "docker" / "serve-smoke-test.sh").read_text()
    assert script.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in script
    assert "build_tiny_whisper(" in script, "the demo's tiny Whisper, built offline"
    assert "python -m trainer.serve > server.log 2>&1 &" in script
    for variable in ("AIP_HTTP_PORT", "AIP_STORAGE_URI", "AIP_HEALTH_ROUTE", "AIP_PREDICT_ROUTE"):
        assert f"{variable}=" in script
    assert '{"instances": [{"audio": {"b64": clip}}]}' in script
    assert "len(predictions) == 1" in script
    assert 'find_spec("deepspeed") is None' in script and "os.getuid() != 0" in script
