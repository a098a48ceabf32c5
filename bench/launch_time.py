"""Where the time from `python -m trainer` to the first step goes, on a tiny BERT.

A launch runs on each node the launcher (its checks use the code training uses, so it
imports the training stack), the `accelerate launch` agent (torchrun's, in the launcher's
process) and one training process per GPU, forked from the zygote that imported the training
stack while the launcher checked (trainer/launcher/zygote.py); before, the launcher exec'd
into the agent and each training process was a fresh interpreter, each importing its stack
from nothing. This measures, on the same tiny BERT and sentiment set the tests use (ZeRO-2,
as the text task's recipe runs on a CPU; one process, or `--processes`):

1. whole runs: `time to first step` and its phases (trainer/training/progress.py), and the
   launcher's own `launcher checks took` line, median of `--runs` runs;
2. each program's imports alone, in a fresh process (median of `--runs`): the launcher's
   (`trainer.launcher.prepare`), the agent's (`trainer.launcher.accelerate_launch` with
   accelerate's launch command and torchrun), a training process's (`trainer.training.run`,
   what the zygote imports), and all three in one process.

With `--baseline OTHER_CHECKOUT` both checkouts run alternately, run by run, each its own
code (bench/checkouts.py), so both see the same machine load.

    python bench/launch_time.py [--runs 3] [--processes 1] [--baseline OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkouts import REPO, add_baseline_flag, compared, environment, python  # noqa: E402

sys.path.insert(0, str(REPO))

IMPORTS = {
    "launcher": "import trainer.launcher.main, trainer.launcher.prepare",
    "agent": "import trainer.launcher.accelerate_launch, accelerate.commands.launch, "
    "torch.distributed.run",
    "training process": "import trainer.training.rank, trainer.training.run",
}
IMPORTS["all three, once"] = "; ".join(IMPORTS.values())

FIRST_STEP = re.compile(r"time to first step: ([\d.]+) s \((.*)\)")
PHASE = re.compile(r"([a-z][a-z ,]*?) ([\d.]+) s(?:, |$)")
LAUNCHER = re.compile(r"launcher checks took ([\d.]+) s")


def assets(root: Path) -> list[str]:
    """The tiny BERT and sentiment set of the tests, and the run's flags."""
    from tests.support.tiny_assets import build_tiny_bert, sentiment_sentences, write_sentiment_csv

    texts = [text for rows in sentiment_sentences().values() for text, _ in rows]
    build_tiny_bert(root / "bert", texts)
    write_sentiment_csv(root / "sentiment")
    return ["--task", "text-classification", "--model_name_or_path", str(root / "bert"),
            "--dataset_name", str(root / "sentiment"), "--text_column_name", "sentence",
            "--label_column_name", "sentiment", "--max_seq_length", "16", "--max_steps", "1",
            "--per_device_train_batch_size", "8", "--save_strategy", "no",
            "--eval_strategy", "no"]  # fmt: skip


def run_environment(checkout: Path) -> dict[str, str]:
    """A workstation's: no Vertex AI cluster variables, one thread, the checkout's code."""
    env = environment(checkout, OMP_NUM_THREADS="1")
    return {k: v for k, v in env.items() if k not in ("CLUSTER_SPEC", "RANK", "WORLD_SIZE")}


def whole_run(checkout: Path, flags: list[str], work: Path) -> dict[str, float]:
    """One run's figures: the launcher's checks, the time to the first step and its phases."""
    work.mkdir(parents=True)
    done = subprocess.run([python(checkout), "-m", "trainer", *flags, "--output_dir", "out"],
                          cwd=work, env=run_environment(checkout), capture_output=True,
                          text=True)  # fmt: skip
    output = done.stdout + done.stderr
    first, checks = FIRST_STEP.search(output), LAUNCHER.search(output)
    if done.returncode or not first or not checks:
        raise SystemExit(f"{checkout}: the run failed ({done.returncode}):\n{output[-3000:]}")
    figures = {"time to first step": float(first[1]), "launcher checks": float(checks[1])}
    for name, seconds in PHASE.findall(first[2]):
        figures[name] = float(seconds)
    first_phase = "launcher, torchrun and imports"
    figures["agent and training process start"] = figures[first_phase] - figures["launcher checks"]
    del figures[first_phase]
    return figures


def import_time(checkout: Path, statement: str) -> float:
    started = time.perf_counter()
    subprocess.run([python(checkout), "-c", statement], cwd=checkout,
                   env=run_environment(checkout), check=True, capture_output=True)  # fmt: skip
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    add_baseline_flag(parser)
    parser.add_argument("--processes", type=int, default=1, help="training processes per run")
    options = parser.parse_args()
    checkouts = compared(options)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in checkouts}
    imports: dict[str, dict[str, list[float]]] = {name: {} for name in checkouts}
    with tempfile.TemporaryDirectory() as temporary:
        flags = [*assets(Path(temporary)), "--nproc_per_node", str(options.processes)]
        for index in range(options.runs):
            for name, checkout in checkouts.items():
                work = Path(temporary) / f"{name}-{index}".replace(" ", "-")
                runs[name].append(whole_run(checkout, flags, work))
                for program, statement in IMPORTS.items():
                    times = imports[name].setdefault(program, [])
                    times.append(import_time(checkout, statement))
    print(f"{options.processes} training process(es), median of {options.runs} run(s); seconds\n")
    names = list(checkouts)
    print("| | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for figure in runs[names[0]][0]:
        cells = [f"{statistics.median(run[figure] for run in runs[n]):.1f}" for n in names]
        print(f"| {figure} | " + " | ".join(cells) + " |")
    for program in IMPORTS:
        cells = [f"{statistics.median(imports[n][program]):.1f}" for n in names]
        print(f"| imports alone: {program} | " + " | ".join(cells) + " |")
    if options.baseline:
        before = statistics.median(run["time to first step"] for run in runs["baseline"])
        after = statistics.median(run["time to first step"] for run in runs["this checkout"])
        print(f"\ntime to first step: this checkout takes {after / before:.2f}x the baseline's")


if __name__ == "__main__":
    main()
