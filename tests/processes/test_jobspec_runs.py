"""`python -m trainer.jobspec --python_package`: the checkout's sdist, built by the `build`
package (its backend in a process of its own), uploaded next to the job's outputs and run
by every pool; another checkout that is not a buildable package is refused by the real
command line. The job specs without a package: tests/unit/test_jobspec.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import yaml
from google.cloud.aiplatform_v1.types import CustomJobSpec

from tests.support.helpers import REPO_ROOT, parse_strictly
from tests.support.job_specs import rendered
from trainer.command_line.recipes import RECIPES_DIR
from trainer.config.deepspeed import PRESETS_DIR
from trainer.jobspec import __main__ as jobspec
from trainer.jobspec.custom_job import DEFAULT_IMAGE
from trainer.packaging import sdist_digest


def package_pools(job: dict) -> list[dict]:
    """Each worker pool's pythonPackageSpec (and no containerSpec beside it)."""
    assert all("containerSpec" not in pool for pool in job["workerPoolSpecs"])
    return [pool["pythonPackageSpec"] for pool in job["workerPoolSpecs"]]


def test_python_package_uploads_the_checkouts_sdist_and_runs_it_on_the_image(gcs, tmp_path, capsys):
    """--python_package: the sdist lands in the job's bucket under its content's digest,
    uploaded with the real client (to the emulator); every pool runs it with the image as
    executor, with the args and env the image's entrypoint would get. The same code again
    is found there, under the same name."""
    from tests.support.gcs_emulator import BUCKET
    from trainer.storage.store import open_store

    base = f"gs://{BUCKET}/package-job"
    jobspec.main(["--python_package", "--base_output_dir", base, "--dest", str(tmp_path / "job")])
    job = yaml.safe_load((tmp_path / "job" / "config.yaml").read_text())
    parse_strictly(job, CustomJobSpec)
    image_job = rendered("--base_output_dir", base)["config.yaml"]
    specs = package_pools(job)
    (uri,) = {uri for spec in specs for uri in spec["packageUris"]}
    folder, _, name = uri.rpartition("/")
    assert re.fullmatch(rf"{base}/packages/[0-9a-f]{{16}}", folder) and name == (
        "vertex_hf_trainer-0.1.0.tar.gz"
    )
    for spec, image_pool in zip(specs, image_job["workerPoolSpecs"], strict=True):
        assert spec == {
            "executorImageUri": DEFAULT_IMAGE,
            "packageUris": [uri],
            "pythonModule": "trainer",
            "args": image_pool["containerSpec"]["args"],
            "env": image_pool["containerSpec"]["env"],
        }
    tuning = yaml.safe_load((tmp_path / "job" / "hptuning.yaml").read_text())
    assert tuning["trialJobSpec"] == job
    assert f"uploaded {uri}" in capsys.readouterr().out

    open_store(folder).download(tmp_path / "got")
    sdist = tmp_path / "got" / name
    assert sdist_digest(sdist).startswith(folder.rpartition("/")[2])
    with tarfile.open(sdist) as archive:
        names = {member.split("/", 1)[-1] for member in archive.getnames()}
    shipped = {path.relative_to(REPO_ROOT).as_posix() for path in
               [*RECIPES_DIR.glob("*.yaml"), *PRESETS_DIR.glob("*.json"),
                *(REPO_ROOT / "trainer").rglob("*.py")]}  # fmt: skip
    assert shipped <= names, "the code and every data file it reads at run time"
    assert not [name for name in names if name.startswith("tests")]

    jobspec.main(["--python_package", "--base_output_dir", base, "--dest", str(tmp_path / "again")])
    assert f"{uri} is already there" in capsys.readouterr().out
    assert (tmp_path / "again" / "config.yaml").read_text() == (
        tmp_path / "job" / "config.yaml"
    ).read_text()


def test_python_package_check_builds_but_uploads_nothing(gcs, tmp_path, capsys):
    from tests.support.gcs_emulator import BUCKET
    from trainer.storage.store import open_store

    base = f"gs://{BUCKET}/checked-job"
    argv = ["--python_package", "--base_output_dir", base, "--check", "--dest", str(tmp_path)]
    with pytest.raises(SystemExit) as missing:
        jobspec.main(argv)
    assert missing.value.code == 1, "no files there yet"
    out = capsys.readouterr().out
    assert "(not uploaded)" in out and f"{tmp_path / 'config.yaml'} is not what" in out
    assert open_store(base).list_files() == {}


def copy_of_the_checkout(root):
    """What the sdist is built from (the package, its metadata), copied to `root`."""
    shutil.copytree(REPO_ROOT / "trainer", root / "trainer",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for name in ("pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy(REPO_ROOT / name, root / name)
    return root


def unversioned_git_checkout(root) -> None:
    """A git checkout whose pyproject.toml gives a version that is not one (PEP 440)."""
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'version = "zero"'))


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda root: None,
         "--python_package builds the sdist of a git checkout, and {root} is not one"),
        (unversioned_git_checkout,
         "{root} is not a buildable package: configuration error: `project.version` must be "
         "pep440"),
    ],
    ids=["not-git", "bad-version"],
)  # fmt: skip
def test_python_package_refuses_a_tree_that_is_not_a_buildable_package(
    tmp_path, gcs, spoil, message
):
    """`python -m trainer.jobspec --python_package` of another checkout (on PYTHONPATH):
    one error line, exit code 2, nothing written, nothing uploaded."""
    from tests.support.gcs_emulator import BUCKET
    from trainer.storage.store import open_store

    root = copy_of_the_checkout(tmp_path / "checkout")
    spoil(root)
    dest = tmp_path / "job"
    dest.mkdir()
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "STORAGE_EMULATOR_HOST": gcs}
    result = subprocess.run(
        [sys.executable, "-m", "trainer.jobspec", "--python_package", "--base_output_dir",
         f"gs://{BUCKET}/refused", "--dest", str(dest)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: {message.format(root=root)}"), result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""
    assert list(dest.iterdir()) == [] and open_store(f"gs://{BUCKET}/refused").list_files() == {}
