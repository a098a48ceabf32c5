"""The environment variables through which the launcher hands a run to the training
processes of its node: a contract between trainer/launcher and trainer/training, which
import nothing from each other."""

TRAINING_MODULE = "trainer.training.rank"
"""The program the launcher has `accelerate launch` start in every process."""

FORKED_ENTRY = "forked_main"
"""The function of `TRAINING_MODULE` that a training process forked from the node's zygote
runs, given the agent's environment (trainer/launcher/zygote.py)."""

PRELOAD_MODULE = "trainer.training.preload"
"""What the zygote imports before it forks the training processes: the training stack."""

ZYGOTE_VERDICT_VARIABLE = "TRAINER_ZYGOTE_VERDICT"
"""A file the zygote writes once it has imported `PRELOAD_MODULE`: `ZYGOTE_VERDICT_OK`, or why
processes forked from it could not use CUDA (they then start as fresh interpreters)."""

ZYGOTE_VERDICT_OK = "ok"

RUN_CONFIG_VARIABLE = "TRAINER_RUN_CONFIG"
"""The resolved run configuration, as JSON (trainer/settings/run_config.py `RunConfig`)."""

LAUNCHED_AT_VARIABLE = "TRAINER_LAUNCHED_AT"
"""When `python -m trainer` started (epoch seconds): the training program reports the time
from there to its first optimizer step."""

SECRET_VARIABLES_VARIABLE = "TRAINER_SECRET_VARIABLES"
"""The names, comma-separated, of the variables the launcher filled with secrets (`--secret`,
`--hub_token` as HF_TOKEN): a failure report masks their values even where the name does
not look secret (trainer/common/secrets.py `secret_values`)."""

STOP_REPORTS_VARIABLE = "TRAINER_STOP_REPORTS"
"""A directory of this node's agent (trainer/launcher/accelerate_launch.py) in which each
training process leaves a file when it begins training (`TRAINING_MARK`: from then on it holds
a SIGTERM until its step is saved) and when it has printed its `preempted:` line after a stop
(`STOP_SAID_MARK`): after a SIGTERM the agent then knows whether the stop was reported,
whether the processes were killed before they could save (a step longer than the grace), or
whether none had begun training, and the line is its own. The first process to find that a
failure was on another node creates `ECHO_LINE_MARK` there, and says the node's line."""

STOP_SAID_MARK = "rank-"
TRAINING_MARK = "training-rank-"
"""Each followed by the process's global rank."""
ECHO_LINE_MARK = "echo-line"
