"""What the gcloud CLI is given, checked in-process: the CLI is installed,
cloudbuild.yaml parses strictly into a Build and pushes the tag the job specs run, and
`trainer.jobspec` refuses a half-given package job. The real gcloud CLI sending
config.yaml, hptuning.yaml and cloudbuild.yaml to a capture server:
tests/processes/test_gcloud_runs.py.
"""

from __future__ import annotations

import shutil

import pytest
import yaml
from google.cloud.devtools.cloudbuild_v1.types import Build
from google.protobuf import json_format

from tests.support.helpers import CONFIG, HPTUNING, jobspec_refusal, parse_strictly
from tests.support.image_build import CLOUDBUILD
from trainer.jobspec.custom_job import DEFAULT_IMAGE


def test_gcloud_is_installed():
    """The proof below needs the real CLI; these machines ship it, so its absence fails."""
    assert shutil.which("gcloud"), "install the gcloud CLI: the job specs are proven with it"


def test_cloudbuild_yaml_parses_strictly_into_a_build():
    config = yaml.safe_load(CLOUDBUILD.read_text())
    build = parse_strictly(config, Build)
    assert build.timeout.total_seconds() == 7200
    assert build.options.machine_type.name == "E2_HIGHCPU_32"
    config["options"]["diskSizeGB"] = config["options"].pop("diskSizeGb")
    with pytest.raises(json_format.ParseError, match="diskSizeGB"):
        parse_strictly(config, Build)


def test_job_specs_run_the_immutable_tag_cloud_build_pushes():
    """The job spec names the commit-SHA tag, never :latest, which the next build moves."""
    config = yaml.safe_load(CLOUDBUILD.read_text())
    immutable = "${_REGION}-docker.pkg.dev/${PROJECT_ID}/${_REPOSITORY}/${_IMAGE}:${_TAG}"
    assert immutable in config["images"]
    pushed = immutable.replace("${PROJECT_ID}", "PROJECT_ID")
    for name, value in config["substitutions"].items():
        pushed = pushed.replace(f"${{{name}}}", value)
    assert pushed == DEFAULT_IMAGE
    assert not pushed.endswith(":latest")
    for spec in (CONFIG, HPTUNING):
        data = yaml.safe_load(spec.read_text())
        pools = data.get("workerPoolSpecs") or data["trialJobSpec"]["workerPoolSpecs"]
        assert {pool["containerSpec"]["imageUri"] for pool in pools} == {pushed}


def test_python_package_command_alone_is_refused(tmp_path, capsys):
    error = jobspec_refusal(["--python_package_command"], tmp_path, capsys)
    assert "--python_package_command says how to run --python_package: give both." in error
