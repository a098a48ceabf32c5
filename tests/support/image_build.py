"""The files that build the images, as the tests read them without Docker or Cloud Build
(tests/unit/test_dockerfile.py, tests/processes/test_dockerfile_runs.py, the two
test_dockerfile_ray.py and the two test_gcloud.py modules):

- where they are: `DOCKERFILE`, `RAY_DOCKERFILE`, `CHECK_STACK`, `CLOUDBUILD`, `PIP_CHECK`;
- docker/Dockerfile read as Docker reads it: `instructions`, `stages`, `final_stage_env`,
  the shell commands of a RUN line (`shell_commands`) and its `pip install`s
  (`pip_installs`);
- the pins of constraints.txt (`constraint_pins`) and a requirement's normalised name
  (`requirement_name`).
"""

from __future__ import annotations

import re
import shlex

from tests.support.helpers import REPO_ROOT

DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"
RAY_DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile.ray"
CHECK_STACK = REPO_ROOT / "docker" / "check-stack.sh"
CLOUDBUILD = REPO_ROOT / "cloudbuild.yaml"
PIP_CHECK = REPO_ROOT / "docker" / "pip-check.txt"


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


def constraint_pins() -> dict[str, str]:
    pins = {}
    for line in (REPO_ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def requirement_name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~\[; ]", requirement)[0]).lower()


def stages() -> list[list[tuple[str, str]]]:
    """The instructions of each stage, the FROM line first."""
    result = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, rest))
    return result


def final_stage_env() -> dict[str, str]:
    """The final stage's ENV settings (NAME=VALUE pairs)."""
    settings = [rest for keyword, rest in stages()[-1] if keyword == "ENV"]
    return dict(pair.split("=", 1) for rest in settings for pair in shlex.split(rest))
