"""`python -m trainer.jobspec`: write config.yaml and hptuning.yaml for Vertex AI.

Both jobs repeat the same worker pools, and a hand-edited spec fails late: Vertex AI
rejects an accelerator count the machine does not offer only after submission, a training
flag's typo only once the image is on every node. This writes both files from a few flags,
checks machine, output location and training flags first (with the launcher's parser), and
leaves one `error:` line and exit code 2 when something is wrong. The checked-in files are
its output for the defaults; `--check` says whether files on disk still match (tests use it).

With `--python_package` every pool runs this checkout's code on the released image: its
sdist is uploaded next to the job's outputs, and each pool becomes a `pythonPackageSpec`
with the image as executor (or, with `--python_package_command`, a `containerSpec` whose
command installs it first, as the Vertex AI SDK does for custom images): a code change
reaches Vertex AI in minutes, without an image build (docs/deploy.md).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from trainer.command_line.parser import FlagParser
from trainer.common.errors import UserError
from trainer.common.flag_fields import flag
from trainer.common.secrets import mask, secret_values
from trainer.jobspec import batch
from trainer.jobspec.custom_job import JobSpecArguments, check_options, custom_job_spec
from trainer.jobspec.job_checks import check_the_run, refuse_secrets, warn_of_spot_losses
from trainer.jobspec.tuning_job import tuning_job
from trainer.packaging import stage_package


@dataclass
class FileArguments:
    """Where the files go; not part of the spec, so not recorded in the files' header."""

    dest: str = flag(".", "Directory the two files are written to.")
    check: bool = flag(
        False, "Write nothing (and upload nothing); exit 1 if the files on disk differ."
    )


def render(
    argv: list[str], env: Mapping[str, str] | None = None, upload: bool = True
) -> dict[str, str]:
    """File name -> content, for this command line (pure apart from the run's checks and,
    with --python_package, the sdist built last and uploaded unless `upload` is false).
    The run is checked as the chief's launcher will (`check_the_run`): a job a node would
    refuse, or whose model or dataset the Hub no longer serves, fails before any GPU; a
    --spot job whose micro-batch would outlast the stop grace gets a `warning:` line."""
    options, training_flags = parse_arguments(argv)
    check_options(options)
    refuse_secrets(options, training_flags)
    run, plan = check_the_run(options, training_flags, os.environ if env is None else env)
    warn_of_spot_losses(options, run, plan)
    package_uri = stage_package(options.base_output_dir, upload) if options.python_package else None
    command = _command(argv)
    submit = {
        "config.yaml": "gcloud ai custom-jobs create --region=REGION --display-name=NAME "
        "--config=config.yaml",
        "hptuning.yaml": "gcloud ai hp-tuning-jobs create --region=REGION --display-name=NAME "
        "--config=hptuning.yaml",
    }
    specs = {
        "config.yaml": custom_job_spec(options, training_flags, package_uri),
        "hptuning.yaml": tuning_job(options, training_flags, run, package_uri),
    }
    return {
        name: f"# {submit[name]}\n# Written by: {command}\n"
        "# Change it by running that again with other flags (see docs/deploy.md), not by hand.\n"
        + yaml.safe_dump(spec, sort_keys=False, width=100)
        for name, spec in specs.items()
    }


def parse_arguments(argv: list[str]) -> tuple[JobSpecArguments, list[str]]:
    """The generator's flags; anything else is a training flag for every node."""
    namespace, training_flags = _parser(JobSpecArguments).parse_known_args(argv)
    return JobSpecArguments(**vars(namespace)), training_flags


def _parser(dataclass_type: type):
    return FlagParser([dataclass_type], prog="python -m trainer.jobspec")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        for dataclass_type in (JobSpecArguments, FileArguments):
            print(_parser(dataclass_type).format_help())
        print("Any other flag is passed to the training program on every node.\n")
        print(batch.parser().format_help())
        return
    try:
        output, spec_argv = _parser(FileArguments).parse_known_args(argv)
        files, submit = written_files(spec_argv, Path(output.dest), upload=not output.check)
    except UserError as error:
        print(f"error: {mask(str(error), secret_values(argv, os.environ))}", file=sys.stderr)
        sys.exit(2)
    if output.check:
        sys.exit(check_files(Path(output.dest), files, spec_argv))
    Path(output.dest).mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (Path(output.dest) / name).write_text(text)
        print(f"wrote {Path(output.dest) / name}")
    if submit:
        print(f"submit it: {submit}")


def written_files(
    spec_argv: list[str], dest: Path, upload: bool
) -> tuple[dict[str, str], str | None]:
    """The files this command line writes, and the command that submits them where the
    files do not say it themselves (a batch prediction request is plain JSON)."""
    if batch.requested(spec_argv):
        return batch.render(spec_argv, dest)
    return render(spec_argv, upload=upload), None


def check_files(dest: Path, files: dict[str, str], spec_argv: list[str]) -> int:
    """1, after a line for each file on disk that differs from what this writes; else 0."""
    stale = [name for name, text in files.items() if not _matches(dest / name, text)]
    for name in stale:
        print(f"{dest / name} is not what this writes: {_command(spec_argv)}")
    return 1 if stale else 0


def _command(argv: list[str]) -> str:
    return shlex.join(["python", "-m", "trainer.jobspec", *argv])


def _matches(path: Path, text: str) -> bool:
    return path.is_file() and path.read_text() == text


if __name__ == "__main__":
    main()
