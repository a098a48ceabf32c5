"""This checkout's code as an sdist in the job's bucket: what a Python package job
(`python -m trainer.jobspec --python_package`) installs on the released image, so that a
code change reaches Vertex AI in minutes, without an image build (docs/deploy.md, "Code
updates without an image build").
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from trainer.common.errors import UserError
from trainer.storage.store import TransferError, open_store

PACKAGES_DIRNAME = "packages"
"""Where under --base_output_dir the sdists go, each in a folder named by its content."""


def source_checkout() -> Path:
    """The checkout this `trainer` package is imported from: the code the job will run."""
    return Path(__file__).resolve().parent.parent


def working_tree_files(root: Path) -> list[str]:
    """The files of the working tree as git sees it: tracked and untracked, less what .gitignore
    excludes (what `gcloud builds submit` uploads for an image build, too), keeping a virtual
    environment, outputs and caches out of the copy the sdist is built from."""
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, text=True,
    )  # fmt: skip
    if listed.returncode != 0:
        reason = (listed.stderr.strip().splitlines() or ["git failed"])[-1]
        raise UserError(
            f"--python_package builds the sdist of a git checkout, and {root} is not one "
            f"({reason}); run it from a clone of the project."
        )
    return [name for name in listed.stdout.split("\0") if name and (root / name).is_file()]


def build_sdist(root: Path, scratch: Path) -> Path:
    """`python -m build --sdist` of the working tree at `root`, on a copy in `scratch` (setuptools
    writes egg-info beside the sources), by the running environment when it has the build
    backend (pyproject's build-system.requires, as a `make install` venv), else isolated."""
    try:
        from build import BuildBackendException, BuildException, ProjectBuilder
        from build.env import DefaultIsolatedEnv
        from pyproject_hooks import quiet_subprocess_runner
    except ImportError:
        raise UserError(
            "--python_package needs the `build` package: make install, or pip install build."
        ) from None
    source = scratch / "source"
    for name in working_tree_files(root):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, source / name)
    try:
        builder = ProjectBuilder(source, runner=quiet_subprocess_runner)
        if not builder.check_dependencies("sdist"):
            return Path(builder.build("sdist", scratch / "dist"))
        with DefaultIsolatedEnv() as env:
            builder = ProjectBuilder.from_isolated_env(env, source, quiet_subprocess_runner)
            env.install(builder.build_system_requires)
            env.install(builder.get_requires_for_build("sdist"))
            return Path(builder.build("sdist", scratch / "dist"))
    except (BuildException, BuildBackendException) as error:
        raise UserError(f"{root} is not a buildable package: {_build_failure(error)}") from None


def _build_failure(error: Exception) -> str:
    """The line that says why: the backend's last line of output, else the error itself."""
    output = getattr(getattr(error, "exception", None), "output", None) or b""
    lines = [line.strip() for line in output.decode(errors="replace").splitlines()]
    lines = [line for line in lines if line]
    return lines[-1] if lines else str(error).strip().splitlines()[0]


def sdist_digest(sdist: Path) -> str:
    """SHA-256 of the sdist's file names and contents, not of its bytes: the tar and gzip headers
    hold build times, so the same code built twice (by the same setuptools) gets the same name
    (and --check agrees with a spec written before), and other code never does."""
    digest = hashlib.sha256()
    with tarfile.open(sdist) as archive:
        for member in sorted(archive.getmembers(), key=lambda member: member.name):
            name = member.name.split("/", 1)[-1]  # without the NAME-VERSION/ folder
            digest.update(f"{name}\0{member.size}\0".encode())
            if member.isfile():
                digest.update(archive.extractfile(member).read())
    return digest.hexdigest()


def stage_package(base_output_dir: str, upload: bool) -> str:
    """Build this checkout's sdist, upload it (unless not `upload`) to
    BASE/packages/DIGEST/NAME-VERSION.tar.gz and return that URI: named by content, so a
    restarted job installs the code it started with (as a pinned image tag would) and the same
    code is uploaded once; setuptools' file name, from which pip reads name and version."""
    with tempfile.TemporaryDirectory(prefix="trainer-sdist-") as scratch:
        sdist = build_sdist(source_checkout(), Path(scratch))
        folder = f"{base_output_dir.rstrip('/')}/{PACKAGES_DIRNAME}/{sdist_digest(sdist)[:16]}"
        uri = f"{folder}/{sdist.name}"
        if not upload:
            print(f"built {sdist.name}: {uri} (not uploaded)")
            return uri
        store = open_store(folder)
        store.check_writable()
        if sdist.name in store.list_files():
            print(f"{uri} is already there")
        else:
            try:
                store.upload(sdist.parent, [sdist.name])
            except TransferError as error:
                raise UserError(f"{error} (nothing was written)") from None
            print(f"uploaded {uri}")
    return uri
