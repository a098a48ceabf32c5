"""No secret is printed or saved by a real run, and its training processes get each one.

A two-process `python -m trainer` run with a canary in every way in (a flag, ordinary
environment variables, a `--secret` from the loopback Secret Manager fake,
tests/support/secret_manager_fake.py): every byte it printed and wrote is searched, and what
its training processes find in their environments is reported by a start hook (digests of
the secrets, never the values). The masking, the dry run,
the job spec and the refusals, in this process: tests/unit/test_secrets.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.helpers import DEMO_SPEECH_FLAGS, start_trainer, trainer_env, with_start_hook
from tests.support.secret_manager_fake import running_fake
from tests.support.secret_references import RESOURCE
from trainer.node.secret_manager import EMULATOR_VARIABLE

SECRETS_SEEN = """
# sitecustomize: each training process (forked from the zygote, where this patches its
# program) writes digests of the secrets it finds in its environment, and the run's handed-over
# configuration as it is (the search of every written byte would find a secret there).
import hashlib
import json
import os
from pathlib import Path

if "multiprocessing.forkserver" in Path("/proc/self/cmdline").read_text():
    import trainer.training.rank as rank

    _run_rank = rank.run_rank

    def _reporting_run_rank(flags):
        seen = {{name: hashlib.sha256(os.environ[name].encode()).hexdigest()
                 for name in ("MY_TOKEN", "HF_TOKEN", "WANDB_API_KEY") if name in os.environ}}
        seen["run config"] = os.environ["TRAINER_RUN_CONFIG"]
        Path("{folder}", "rank-" + os.environ["RANK"]).write_text(json.dumps(seen))
        return _run_rank(flags)

    rank.run_rank = _reporting_run_rank
"""


def digest(value: str) -> str:
    import hashlib

    return hashlib.sha256(value.encode()).hexdigest()


@pytest.mark.slow
def test_a_run_writes_and_prints_no_secret_and_its_processes_get_each(tmp_path, demo_assets):
    """Canaries through every way in: `--hub-token=V` (a flag is given once; the other
    spellings are the dry-run tests above), HF_TOKEN and WANDB_API_KEY in the environment,
    and a `--secret` from the fake Secret Manager. Every byte the run wrote and printed is
    searched."""
    canaries = {name: f"CANARY_{name}_7f1d" for name in "ACDE"}
    with running_fake({RESOURCE: canaries["E"]}) as fake:
        seen_dir = tmp_path / "seen"
        seen_dir.mkdir()
        env = trainer_env(
            tmp_path / "cache",
            HF_TOKEN=canaries["C"],
            WANDB_API_KEY=canaries["D"],
            **{EMULATOR_VARIABLE: fake.url},
        )
        env = with_start_hook(env, tmp_path / "hooks", SECRETS_SEEN.format(folder=seen_dir))
        args = ["--nproc_per_node", "2",
                "--model_name_or_path", str(demo_assets.model_dir),
                "--dataset_name", str(demo_assets.dataset_dir), *DEMO_SPEECH_FLAGS,
                "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1",
                "--logging_steps", "1", "--eval_strategy", "no",
                "--per_device_train_batch_size", "2", "--output_dir", "out",
                f"--hub-token={canaries['A']}",
                "--secret", f"MY_TOKEN={RESOURCE}"]  # fmt: skip
        code, output = start_trainer(args, cwd=tmp_path, env=env).finish()
    assert code == 0, output[-3000:]
    assert fake.accessed == [RESOURCE]
    seen = [json.loads(path.read_text()) for path in sorted(seen_dir.iterdir())]
    assert len(seen) == 2, "the two training processes did not report"
    for process_env in seen:  # digests compared, values never printed
        assert process_env["MY_TOKEN"] == digest(canaries["E"])
        assert process_env["HF_TOKEN"] == digest(canaries["A"]), "the flag wins over the variable"
        assert process_env["WANDB_API_KEY"] == digest(canaries["D"])
        assert not any(c in process_env["run config"] for c in canaries.values())

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
