"""No secret is printed or saved by a real run, and its training processes get each one.

A two-process `python -m trainer` run with a canary in every way in (a flag, ordinary
environment variables, a `--secret` from the loopback Secret Manager fake,
tests/support/secret_manager_fake.py): every byte it printed and wrote is searched, and the
environments of its training processes are read while they run. The masking, the dry run,
the job spec and the refusals, in this process: tests/unit/test_secrets.py.
"""

from __future__ import annotations

import psutil
import pytest
import torch

from tests.support.helpers import DEMO_SPEECH_FLAGS, start_trainer, trainer_env, wait_until
from tests.support.secret_manager_fake import running_fake
from tests.support.secret_references import RESOURCE
from trainer.common.handoff import RUN_CONFIG_VARIABLE
from trainer.node.secret_manager import EMULATOR_VARIABLE


def training_environments(launcher: psutil.Process) -> list[dict[str, str]]:
    """The environments of the launcher's training processes alive now."""
    found = []
    for process in launcher.children(recursive=True):
        try:
            if "trainer.training.rank" in process.cmdline():
                found.append(process.environ())
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.mark.slow
def test_a_run_writes_and_prints_no_secret_and_its_processes_get_each(tmp_path, demo_assets):
    """Canaries through every way in: `--hub-token=V` (a flag is given once; the other
    spellings are the dry-run tests above), HF_TOKEN and WANDB_API_KEY in the environment,
    and a `--secret` from the fake Secret Manager. Every byte the run wrote and printed is
    searched."""
    canaries = {name: f"CANARY_{name}_7f1d" for name in "ACDE"}
    with running_fake({RESOURCE: canaries["E"]}) as fake:
        env = trainer_env(
            tmp_path / "cache",
            HF_TOKEN=canaries["C"],
            WANDB_API_KEY=canaries["D"],
            **{EMULATOR_VARIABLE: fake.url},
        )
        args = ["--nproc_per_node", "2",
                "--model_name_or_path", str(demo_assets.model_dir),
                "--dataset_name", str(demo_assets.dataset_dir), *DEMO_SPEECH_FLAGS,
                "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1",
                "--logging_steps", "1", "--eval_strategy", "no",
                "--per_device_train_batch_size", "2", "--output_dir", "out",
                f"--hub-token={canaries['A']}",
                "--secret", f"MY_TOKEN={RESOURCE}"]  # fmt: skip
        trainer = start_trainer(args, cwd=tmp_path, env=env)
        launcher = psutil.Process(trainer.process.pid)
        seen: list[dict[str, str]] = []

        def two_training_processes() -> bool:
            seen[:] = training_environments(launcher)
            return len(seen) == 2 or trainer.process.poll() is not None

        wait_until(two_training_processes, 300, "the two training processes")
        code, output = trainer.finish()
    assert code == 0, output[-3000:]
    assert fake.accessed == [RESOURCE]
    assert len(seen) == 2, "the run ended before its training processes were seen"
    for process_env in seen:  # compared, never printed
        assert process_env["MY_TOKEN"] == canaries["E"]
        assert process_env["HF_TOKEN"] == canaries["A"], "the flag wins over the variable"
        assert process_env["WANDB_API_KEY"] == canaries["D"]
        assert not any(c in process_env[RUN_CONFIG_VARIABLE] for c in canaries.values())

    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    names = {path.name for path in written}
    assert {"training_args.bin", "trainer_state.json", "model.safetensors"} <= names
    assert any(name.startswith("events.out.tfevents") for name in names)
    assert len(list((tmp_path / "out").glob("checkpoint-*/training_args.bin"))) == 2
    for path in written:
        content = path.read_bytes()
        leaked = [name for name, value in canaries.items() if value.encode() in content]
        assert not leaked, f"{path.relative_to(tmp_path)} holds canary {leaked}"
    assert not [name for name, value in canaries.items() if value in output]
    saved = torch.load(tmp_path / "out" / "model" / "training_args.bin", weights_only=False)
    assert saved.hub_token is None and saved.max_steps == 2
