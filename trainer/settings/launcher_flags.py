"""The launcher's own flags: read once per node by `python -m trainer`, never passed to the
training processes."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.common.flag_fields import flag


@dataclass(frozen=True)
class LauncherArguments:
    nproc_per_node: int | None = flag(
        None, "Processes per node (default: one per GPU; 1 on a CPU-only node)."
    )
    deepspeed: str = flag(
        "zero2",
        "DeepSpeed preset (zero2, zero3, zero3-offload), the path of a DeepSpeed "
        "JSON config, or none for plain DDP.",
    )
    master_port: int | None = flag(
        None,
        "Rendezvous port on the chief (default: the port in CLUSTER_SPEC, 2222 on "
        "Vertex AI; 29500 for a single node). Give every node the same value.",
    )
    rdzv_timeout: int = flag(
        1800,
        "Seconds the nodes wait for each other at start-up; a node still waiting 30 s "
        "after that exits 1.",
    )
    chief_resolve_timeout: int = flag(
        300, "Seconds a worker node retries resolving the chief's name before giving up."
    )
    skip_hub_check: bool = flag(
        False,
        "Ask the Hugging Face Hub nothing before launch (for a node that cannot reach it).",
    )
    secret: list[str] = flag(
        [],
        "NAME=projects/P/secrets/S/versions/V: that Secret Manager secret in the "
        "training processes' variable NAME; repeatable, never printed.",
        action="extend",
    )
    dry_run: bool = flag(
        False, "Print the resolved topology and launch command as JSON; start nothing."
    )
