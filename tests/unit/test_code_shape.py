"""The shape the code keeps as it grows (docs/architecture.md): functions simple enough to
read (radon's cyclomatic-complexity grades), module names that say one thing, and a run
configuration that imports nothing above trainer/common (its cost in a fresh process:
tests/processes/test_run_config_import.py)."""

from __future__ import annotations

import ast
from collections import defaultdict

from radon.complexity import cc_rank, cc_visit
from radon.visitors import Class

from tests.support.helpers import REPO_ROOT

PACKAGE = REPO_ROOT / "trainer"
ROLES = ("spec", "training", "trainer", "serving", "demo")
"""The modules every task folder has in the same role (docs/tasks.md, "Adding a task")."""
MAX_C_FUNCTIONS = 5
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
    package and the dataclass in another read alike in a traceback and in an import. The task
    folders' role modules (`spec`, `training`, ...) are the one exception: the same role in
    every folder (tests/unit/test_task_folders.py)."""
    packages = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        in_task_folder = path.parent.parent == PACKAGE / "tasks"
        if path.name in ("__init__.py", "__main__.py") or (in_task_folder and path.stem in ROLES):
            continue
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


def test_every_task_spec_names_its_own_training_class():
    from trainer.tasks import load_task, registered

    for spec in registered():
        assert load_task(spec.name).spec is spec


def test_every_deferred_import_is_documented():
    """docs/architecture.md lists the imports of `trainer` modules made inside a function, each
    with its file and function: one added without a reason there fails here."""
    doc = (REPO_ROOT / "docs" / "architecture.md").read_text()
    section = doc[doc.index("These are the only deferred ones") : doc.index("A module's name")]
    undocumented = []
    for path in sorted((REPO_ROOT / "trainer").rglob("*.py")):
        name = str(path.relative_to(REPO_ROOT))
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            deferred = [
                node.module
                for node in ast.walk(function)
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trainer")
            ]
            if deferred and (f"`{name}`" not in section or f"`{function.name}`" not in section):
                undocumented.append(f"{name} {function.name}: {deferred}")
    assert undocumented == []


TESTS = REPO_ROOT / "tests"
PROCESS_MODULES = ("subprocess", "multiprocessing", "concurrent.futures.process")
PROCESS_CALLS = ("fork", "system", "popen", "spawnv", "execv", "execve", "execvp")


def test_no_test_module_imports_another():
    """Code two test modules share lives in tests/support/."""
    importing = [
        (str(path.relative_to(REPO_ROOT)), name)
        for path in TESTS.rglob("test_*.py")
        for name in imported_modules(path)
        if name.startswith(("tests.unit", "tests.processes"))
    ]
    assert importing == []


def test_the_unit_tier_starts_no_process():
    """tests/unit/ runs in the test's own process (docs/architecture.md, Testing); a test that
    starts one belongs in tests/processes/. (A patched `os.execve` is a tripwire, not a call.)"""
    starting = []
    for path in sorted((TESTS / "unit").glob("*.py")):
        found = [name for name in imported_modules(path) if name.startswith(PROCESS_MODULES)]
        found += [
            f"os.{node.func.attr}()"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in PROCESS_CALLS
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "os"
        ]  # fmt: skip
        starting += [f"{path.name}: {what}" for what in found]
    assert starting == []


def imported_modules(path) -> list[str]:
    """Every module `path` imports, at its top or inside a function."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_the_architecture_names_every_module():
    """docs/architecture.md's module lists are the code's: a module of a package with a
    section of its own ("### `trainer/data/`") is named there; any other (the ways in, a task
    folder's helpers) somewhere in the document. A task folder's role modules are described
    once, in the roles table (their presence: tests/unit/test_task_folders.py)."""
    doc = (REPO_ROOT / "docs" / "architecture.md").read_text()
    unnamed = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if path.name in ("__init__.py", "__main__.py"):
            continue
        if parts[0] == "tasks" and len(parts) == 3:
            named = path.stem in ROLES or f"`{parts[1]}/`" in doc and f"`{path.name}`" in doc
        else:
            named = f"`{path.name}`" in package_section(doc, parts[0] if len(parts) > 1 else "")
        if not named:
            unnamed.append(str(path.relative_to(REPO_ROOT)))
    assert unnamed == []


def package_section(doc: str, package: str) -> str:
    """The part of docs/architecture.md about `trainer/<package>/`, else all of it."""
    heading = f"### `trainer/{package}/`"
    if not package or heading not in doc:
        return doc
    section = doc[doc.index(heading) + len(heading) :]
    return section[: section.find("\n### ")] if "\n### " in section else section


def test_the_architecture_shows_the_layers_pyproject_enforces():
    """The layers block of docs/architecture.md is the layers contract, line for line."""
    import tomllib

    contracts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c["layers"] for c in contracts["contracts"] if c.get("containers") is None
                  and c["type"] == "layers")  # fmt: skip
    doc = (REPO_ROOT / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## Packages and their layers") :]
    block = section[section.index("```\n") + 4 : section.index("\n```", section.index("```\n"))]
    assert block.splitlines() == [f'"{layer}",' for layer in layers]


def test_the_architecture_names_the_task_folders_roles():
    """The roles table of docs/architecture.md ("`trainer/tasks/`") has a row per role module,
    the ones tests/unit/test_task_folders.py requires of every folder and the optional ones."""
    doc = (REPO_ROOT / "docs" / "architecture.md").read_text()
    section = package_section(doc, "tasks")
    rows = [line.split("|")[1].strip(" `") for line in section.splitlines()
            if line.startswith("| `")]  # fmt: skip
    assert rows == [f"{role}.py" for role in ("spec", "training", "trainer", "serving", "demo")]
    assert sorted(rows) == sorted(f"{role}.py" for role in ROLES)
