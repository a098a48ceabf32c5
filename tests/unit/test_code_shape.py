"""The shape the code keeps as it grows (docs/architecture.md): functions simple enough to
read (radon's cyclomatic-complexity grades), module names that say one thing, and a run
configuration that imports nothing above trainer/common (its cost in a fresh process:
tests/processes/test_run_config_import.py)."""

from __future__ import annotations

from collections import defaultdict

from radon.complexity import cc_rank, cc_visit
from radon.visitors import Class

from tests.support.helpers import REPO_ROOT

PACKAGE = REPO_ROOT / "trainer"
MAX_C_FUNCTIONS = 10
"""Functions graded C (complexity 11-20) allowed in trainer/; D and worse are not."""


def graded_functions() -> list[tuple[str, str, int]]:
    """(module path, function name, complexity) of every function and method."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = str(path.relative_to(REPO_ROOT))
        for block in cc_visit(path.read_text()):
            for function in block.methods if isinstance(block, Class) else [block]:
                found[module, function.lineno] = (module, function.fullname, function.complexity)
    return list(found.values())


def test_no_function_is_hard_to_follow():
    graded = graded_functions()
    assert len(graded) > 500, "every function is graded"
    worse = [f for f in graded if cc_rank(f[2]) not in "ABC"]
    assert worse == [], "D or worse: split it into named steps"
    in_training = [f for f in graded if f[0].startswith("trainer/training/")]
    assert [f for f in in_training if cc_rank(f[2]) not in "AB"] == [], "B or better there"
    graded_c = [f for f in graded if cc_rank(f[2]) == "C"]
    assert len(graded_c) <= MAX_C_FUNCTIONS, graded_c


def test_module_names_say_one_thing():
    """A module name means the same in every package: `hardware` the detected node in one
    package and the dataclass in another read alike in a traceback and in an import."""
    packages = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            packages[path.stem].append(str(path.parent.relative_to(REPO_ROOT)))
    assert {name: where for name, where in packages.items() if len(where) > 1} == {}


def test_the_settings_package_imports_only_common():
    for path in (PACKAGE / "settings").glob("*.py"):
        imports = [line.split()[1] for line in path.read_text().splitlines()
                   if line.startswith(("from trainer", "import trainer"))]  # fmt: skip
        assert all(name.startswith(("trainer.common", "trainer.settings")) for name in imports), (
            path,
            imports,
        )


def test_every_task_has_its_module_and_its_flags():
    from trainer.settings.task_flags import TASK_FLAGS
    from trainer.tasks import _TASK_MODULES, load_task

    assert set(_TASK_MODULES) == set(TASK_FLAGS)
    for name, flags in TASK_FLAGS.items():
        assert load_task(name).arguments_class is flags
