"""One command that proves the GPU path: every part measured on the GPUs found, one table.

`make gpu-check OUT=folder` (or this script) runs each part below in a process of its own with
its own time limit, one after the other on this node, and writes the table, Markdown and JSON,
into the folder after every part: one part that fails or runs past its limit leaves a row
saying so, and the others' rows. The limits on a GPU add up to under 8 minutes (`PARTS`). No
Hub: the models are built from real configuration classes at real sizes (Llama 3.1 8B's shape
for the chat steps, a 1B Llama for serving), with random weights and local tokenizers.

Each row: the part, its status (ok, failed, timed out, skipped, with the reason), what it
measured, the claim it checks (a CPU-side measurement or an on-paper figure of docs/), and the
seconds it took. The parts reuse the bench scripts that measure each on its own:
bench/step_time.py (the tasks' steps), bench/chat_memory.py (the plan's estimate),
bench/serve.py (the servers and their clients), bench/stop_checkpoint.py (the preemption),
bench/launch_time.py (the zygote's launch).

`--cpu` runs every part at tiny sizes on this machine's CPU, so the script cannot rot: a part
that needs CUDA-only libraries (bitsandbytes' 4-bit kernels, Liger's Triton kernels,
flash-attn, vLLM) says it was skipped and why.

    python bench/gpu_check.py --out FOLDER [--cpu] [--parts cuda-stack zygote ...]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
STATUSES = ("ok", "failed", "timed out", "skipped")
COLUMNS = ("part", "status", "measured", "claim", "seconds", "limit_s", "reason")
GPU_BUDGET_S = 480
"""What the parts' limits on a GPU add up to at most: 8 minutes on one H100-class GPU."""


class Skip(Exception):
    """A part that cannot run here (a library absent, CUDA needed): its row says why."""


@dataclass(frozen=True)
class Part:
    name: str
    function: str
    """The function of `source` that measures it: f(Context) -> {"measured": str, ...}."""
    claim: str
    limit_s: float
    """On a GPU."""
    cpu_limit_s: float
    """With --cpu, on a 2-core machine."""
    source: Path = Path(__file__)

    def limit(self, cpu: bool) -> float:
        return self.cpu_limit_s if cpu else self.limit_s


@dataclass
class Context:
    """What a part's function is given: the mode and a scratch folder the parts share (a
    model one part built is there for the next)."""

    cpu: bool
    scratch: Path
    partial: Path | None = None
    """Where `note` writes what was measured so far (a part past its limit keeps it)."""

    @property
    def device(self) -> str:
        return "cpu" if self.cpu else "cuda"

    def note(self, measured: str) -> None:
        """What the part measured so far: its row's figures if it is killed past its limit."""
        if self.partial is not None:
            self.partial.write_text(json.dumps({"measured": measured}))


PAPER_MFU = "on paper: 40 % MFU for a 7-9B step (docs/benchmarks.md, 'The MFU of a 7-9B step')"
PLAN = "the plan's estimate within 0.6-1.15 of the peak (on CPU: bench/chat_memory.py)"
ONCE_ON_A_GPU = "bench/serve.py on an H100 (docs/benchmarks.md 'On a GPU, measured once')"
HOW_MANY = "docs/serving.md, 'How many workers' (a GPU on paper; measured on CPU only)"
PARTS = [
    Part("cuda-stack", "cuda_stack",
         "torch, NCCL and DeepSpeed's fused ops load (docker/check-stack.sh checks the build)",
         20, 120),
    Part("zygote", "zygote", "the training processes fork from the zygote: no 'fresh "
         "interpreters' line (on CPU: tests/processes/test_zygote_runs.py)", 45, 150),
    Part("chat-lora-sdpa", "chat_lora_sdpa", f"{PAPER_MFU}; {PLAN}", 45, 120),
    Part("chat-lora-flash-attn", "chat_lora_flash", "packed rows on flash-attn's varlen "
         f"kernels beat sdpa (docs/tasks.md, 'Packing'); {PLAN}", 35, 60),
    Part("chat-qlora", "chat_qlora", "QLoRA's 4-bit base fits an L4 "
         f"(recipe llama-3.1-8b-qlora-l4.yaml); {PLAN}", 50, 60),
    Part("chat-liger", "chat_liger", "Liger's fused kernels raise tokens/s and lower the "
         f"peak against chat-lora-sdpa; {PLAN}", 35, 60),
    Part("task-steps", "task_steps", "ASSUMED_UTILISATION 0.2 of trainer/common/step_time.py "
         "(H100, docs/benchmarks.md 'A micro-batch's time': 0.17-0.34)", 40, 150),
    Part("serving-whisper", "serving_whisper", f"1 worker: {ONCE_ON_A_GPU}; 2 workers gain "
         f"nothing on whisper-small: {HOW_MANY}", 45, 180),
    Part("serving-bert", "serving_bert", f"1 worker: {ONCE_ON_A_GPU}; start with 2 workers for "
         f"BERT-base: {HOW_MANY}", 40, 150),
    Part("serving-chat", "serving_chat", "1 worker: docs/benchmarks.md 'Generation (a small "
         f"Llama), measured' (CPU); 2 workers gain nothing on a generation model: {HOW_MANY}",
         50, 150),
    Part("generation", "generation", "the generation engine's tokens/s beside vLLM's "
         "(docs/serving.md, 'Generation')", 45, 120),
    Part("preemption", "preemption", "SIGTERM mid-step to a complete checkpoint within "
         "--stop_grace_seconds (docs/restarts.md; on CPU: bench/stop_checkpoint.py)", 25, 60),
]  # fmt: skip


# --- running the parts ----------------------------------------------------------------------


def run_part(part: Part, out: Path, cpu: bool) -> dict:
    """`part` in a process of its own (a session of its own: what it starts is ended with it),
    killed past its limit; its row."""
    logs, results = out / "logs", out / "results"
    logs.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    result = results / f"{part.name}.json"
    result.unlink(missing_ok=True)
    partial_of(result).unlink(missing_ok=True)
    argv = [sys.executable, __file__, "--child", str(part.source), part.function, str(result),
            "--out", str(out), *(["--cpu"] if cpu else [])]  # fmt: skip
    limit = part.limit(cpu)
    row = {"part": part.name, "claim": part.claim, "limit_s": limit, "measured": "-",
           "reason": ""}  # fmt: skip
    started = time.monotonic()
    with open(logs / f"{part.name}.log", "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                   env=part_environment(cpu), start_new_session=True)  # fmt: skip
        try:
            process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            end_tree(process)
    row["seconds"] = round(time.monotonic() - started, 1)
    return row | outcome(process.returncode, result, logs / f"{part.name}.log", limit)


def end_tree(process: subprocess.Popen) -> None:
    """SIGKILL to the part's process, its session and every descendant, those in process groups
    of their own too (a compile's jobs under ninja): nothing it started outlives it."""
    import psutil

    descendants = psutil.Process(process.pid).children(recursive=True)
    os.killpg(process.pid, signal.SIGKILL)
    for descendant in descendants:
        with contextlib.suppress(psutil.NoSuchProcess):
            descendant.kill()
    process.wait()


def outcome(returncode: int, result: Path, log: Path, limit: float) -> dict:
    """The row's status, reason and figures from the child's exit and its result file."""
    if returncode == -signal.SIGKILL:
        partial = partial_of(result)
        so_far = json.loads(partial.read_text()) if partial.exists() else {}
        return so_far | {"status": "timed out", "reason": f"past its {limit:g} s limit"}
    if returncode != 0 or not result.exists():
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        return {"status": "failed", "reason": (lines or ["no output"])[-1][:300]}
    return json.loads(result.read_text())


def partial_of(result: Path) -> Path:
    return result.with_suffix(".partial.json")


def part_environment(cpu: bool) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(BENCH)])}
    if cpu:
        env["OMP_NUM_THREADS"] = "1"
    return env


def child(source: str, function: str, result: Path, context: Context) -> None:
    """In the part's process: run its function, write its row's status and figures."""
    if Path(source).resolve() == Path(__file__).resolve():
        measure = globals()[function]
    else:
        sys.modules.setdefault("gpu_check", sys.modules[__name__])  # its Skip, not a copy's
        spec = importlib.util.spec_from_file_location("planted_part", source)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        measure = getattr(module, function)
    try:
        row = {"status": "ok", "reason": ""} | measure(context)
    except Skip as why:
        row = {"status": "skipped", "reason": str(why)}
    result.write_text(json.dumps(row))


def run_all(parts: list[Part], out: Path, cpu: bool, header: dict) -> list[dict]:
    """Every part in turn, the table rewritten after each."""
    rows: list[dict] = []
    started = time.monotonic()
    for part in parts:
        print(f"{part.name} (limit {part.limit(cpu):g} s) ...", file=sys.stderr, flush=True)
        rows.append(run_part(part, out, cpu))
        row = rows[-1]
        print(f"  {row['status']} in {row['seconds']} s: {row['measured']} {row['reason']}",
              file=sys.stderr, flush=True)  # fmt: skip
        header["wall_s"] = round(time.monotonic() - started, 1)
        write_table(out, header, rows)
    return rows


def write_table(out: Path, header: dict, rows: list[dict]) -> None:
    (out / "gpu_check.json").write_text(json.dumps({**header, "rows": rows}, indent=2))
    (out / "gpu_check.md").write_text(markdown(header, rows))


def markdown(header: dict, rows: list[dict]) -> str:
    lines = [f"{header['mode']}: {header['device']}; {header['date']}, commit "
             f"{header['commit']}; wall time {header.get('wall_s', 0):.0f} s", "",
             "| part | status | measured | claim checked | seconds (limit) |",
             "|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        status = row["status"] + (f": {row['reason']}" if row["reason"] else "")
        seconds = f"{row['seconds']:.0f} ({row['limit_s']:g})"
        lines.append(f"| {row['part']} | {cell(status)} | {cell(row['measured'])} "
                     f"| {cell(row['claim'])} | {seconds} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def header_of(cpu: bool) -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                            capture_output=True, check=False).stdout.strip()  # fmt: skip
    return {"mode": "CPU (--cpu, tiny sizes)" if cpu else "GPU", "device": device_name(cpu),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": commit or "?"}  # fmt: skip


def device_name(cpu: bool) -> str:
    if cpu:
        return f"{os.cpu_count()}-core CPU"
    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    names = done.stdout.split("\n") if done.returncode == 0 else []
    gpus = [name.strip() for name in names if name.strip()]
    return f"{len(gpus)} x {gpus[0]}" if gpus else "no GPU found by nvidia-smi"


# --- the parts: the CUDA stack and the zygote ---------------------------------------------


def cuda_stack(context: Context) -> dict:
    """torch, a one-rank all-reduce (NCCL on a GPU, gloo on CPU), DeepSpeed's Adam op."""
    import torch
    import torch.distributed as dist

    figures = [f"torch {torch.__version__}"]
    if not context.cpu:
        count = torch.cuda.device_count()
        figures.append(f"{count} x {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}")
        figures.append("NCCL " + ".".join(map(str, torch.cuda.nccl.version())))
    (context.scratch / "store").unlink(missing_ok=True)  # a run before's
    store = dist.FileStore(str(context.scratch / "store"), 1)
    dist.init_process_group("gloo" if context.cpu else "nccl", store=store, rank=0,
                            world_size=1)  # fmt: skip
    tensor = torch.ones(4, device=context.device)
    dist.all_reduce(tensor)
    dist.destroy_process_group()
    figures.append(f"all-reduce {'gloo' if context.cpu else 'nccl'} ok")
    builder = deepspeed_op(context)
    started = time.monotonic()
    builder.load(verbose=False)
    figures.append(f"DeepSpeed's {builder.NAME} op loaded in {time.monotonic() - started:.1f} s")
    return {"measured": "; ".join(figures)}


def deepspeed_op(context: Context):
    """On a GPU, DeepSpeed's fused Adam (built into the image); on CPU its shared-memory
    collective op, from the cache `make install` built it into (trainer/build_cpu_ops.py)."""
    if not context.cpu:
        from deepspeed.ops.op_builder import FusedAdamBuilder

        return FusedAdamBuilder()
    from trainer.build_cpu_ops import SHARED_MEMORY_OP
    from trainer.common.cache import cache_dir, torch_extensions_dir

    os.environ["TORCH_EXTENSIONS_DIR"] = str(torch_extensions_dir(os.environ, cache_dir()))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().create_op_builder(SHARED_MEMORY_OP)


def zygote(context: Context) -> dict:
    """A tiny BERT's launch (bench/launch_time.py's) with 2 processes (1 on one GPU)."""
    from launch_time import FIRST_STEP, assets, run_environment

    processes = 2 if context.cpu else min(2, gpu_count())
    flags = [*assets(context.scratch / "zygote"), "--nproc_per_node", str(processes)]
    if context.cpu:
        flags += ["--deepspeed", "none"]
    work = context.scratch / "zygote-run"
    work.mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "trainer", *flags, "--output_dir", "out"],
                          cwd=work, env=run_environment(REPO), capture_output=True,
                          text=True, check=False)  # fmt: skip
    output = done.stdout + done.stderr
    first = FIRST_STEP.search(output)
    if done.returncode or not first:
        raise RuntimeError(f"the launch failed ({done.returncode}): {output[-500:]}")
    fresh = [line for line in output.splitlines() if "fresh interpreters" in line]
    verdict = fresh[0].strip() if fresh else "forked from the zygote (no 'fresh interpreters')"
    return {
        "measured": f"{processes} process(es): {verdict}; first step {first[1]} s",
        "status": "failed" if fresh else "ok",
        "reason": "the training processes did not fork from the zygote" if fresh else "",
    }


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


# --- the parts: the chat task's steps ------------------------------------------------------

LLAMA_31_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 14336,
               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
               "max_position_embeddings": 131072, "rope_theta": 500000.0,
               "tie_word_embeddings": False}  # fmt: skip
"""Llama 3.1 8B's configuration (its config.json on the Hub), random weights."""


@dataclass(frozen=True)
class ChatStep:
    attention: str = "sdpa"
    quantized: bool = False
    liger: bool = False


def chat_lora_sdpa(context: Context) -> dict:
    return chat_step(context, ChatStep())


def chat_lora_flash(context: Context) -> dict:
    needs(context, "flash_attn", "flash-attn's kernels")
    return chat_step(context, ChatStep(attention="flash_attention_2"))


def chat_qlora(context: Context) -> dict:
    needs(context, "bitsandbytes", "bitsandbytes' 4-bit kernels")
    return chat_step(context, ChatStep(quantized=True))


def chat_liger(context: Context) -> dict:
    needs(context, "liger_kernel", "Liger's Triton kernels")
    return chat_step(context, ChatStep(liger=True))


def needs(context: Context, module: str, what: str) -> None:
    if context.cpu:
        raise Skip(f"{what} need CUDA (the CPU equivalent is chat-lora-sdpa)")
    if importlib.util.find_spec(module) is None:
        raise Skip(f"{module} is not installed in this image")


def chat_step(context: Context, step: ChatStep) -> dict:
    """A LoRA step of the chat task on one packed row (4 chats, restarting positions, as TRL's
    padding-free packing makes it), gradient checkpointing, AdamW: tokens/s, MFU, and the
    peak memory against the plan's estimate (as bench/chat_memory.py measures it on CPU)."""
    import torch
    from chat_memory import SHAPE

    from trainer.common.step_time import peak_flops

    length, steps = (256, 1) if context.cpu else (4096, 3)
    model, counts = chat_model(context, step, LLAMA_31_8B if not context.cpu else SHAPE, length)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (1, length), device=context.device)
    positions = torch.arange(length // 4, device=context.device).repeat(4)[None]
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=not context.cpu)
    times = []
    for _ in range(steps + 1):
        synchronize(context)
        started = time.perf_counter()
        with autocast:
            model(input_ids=ids, position_ids=positions, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(context)
        times.append(time.perf_counter() - started)
    seconds = sum(times[1:]) / steps
    flops = counts["flops"]
    peak = None if context.cpu else peak_flops(torch.cuda.get_device_name(0), "16-bit")
    mfu = f"MFU {flops / seconds / peak:.2f}" if peak else "MFU - (no peak known here)"
    mfu = f"{flops / seconds / 1e12:.3g} model TFLOP/s, {mfu}"
    used, estimate = (
        peak_bytes(context, counts["rss_before"]),
        plan_estimate(model, counts, step, length),
    )
    return {"measured": f"{length / seconds:,.0f} tokens/s, {mfu}; peak {used / 2**30:.2f} "
                        f"GiB, plan {estimate / 2**30:.2f} GiB ({estimate / used:.2f}x)",
            "figures": {"tokens_per_s": length / seconds, "mfu": peak and flops / seconds / peak,
                        "peak_bytes": used, "estimated_bytes": estimate}}  # fmt: skip


def chat_model(context: Context, step: ChatStep, shape: dict, length: int):
    """Llama of `shape`, random weights (fp32, as the task loads it; bf16 under a 4-bit base),
    LoRA on the task's targets, gradient checkpointing; its parameter counts, and the model
    FLOPs of a row of `length` tokens (the task's count, `forward_flops_per_sample`, of the
    frozen base: LoRA's backward, no recomputation; counted before 4-bit packing halves the
    weights' element counts)."""
    import psutil
    import torch
    import transformers

    from trainer.common.step_time import encoder_forward_flops
    from trainer.settings.model_flags import ModelArguments
    from trainer.tasks.lora_adapters import parameter_counts, with_lora
    from trainer.tasks.step_memory import quantizable_weights
    from trainer.tasks.text_generation.spec import SPEC

    torch.manual_seed(0)
    counts = {"rss_before": psutil.Process().memory_info().rss}
    if step.liger:
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama()
    config = transformers.LlamaConfig(**shape, attn_implementation=step.attention)
    torch.set_default_dtype(torch.bfloat16 if step.quantized else torch.float32)
    with torch.device(context.device):
        model = transformers.LlamaForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    model.requires_grad_(False)
    counts["flops"] = encoder_forward_flops(model, length).training(False)
    counts["total"] = parameter_counts(model)[1]
    counts["quantizable"] = quantizable_weights(model)
    if step.quantized:
        quantize_4bit(model)
    if not context.cpu:  # the peak from here: the 16-bit weights 4-bit packing replaced are gone
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    lora = ModelArguments(peft="lora", lora_dropout=0.0, load_in_4bit=step.quantized)
    model = with_lora(model, lora, SPEC.lora_targets)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train()
    counts["trainable"] = parameter_counts(model)[0]
    return model, counts


def quantize_4bit(model) -> None:
    """The decoder layers' linear weights in NF4 with double quantization, computing in bf16,
    as `--load_in_4bit`'s BitsAndBytesConfig loads them (the LM head stays as it is)."""
    import bitsandbytes as bnb
    import torch

    for layer in model.model.layers:
        for name, linear in list(layer.named_modules()):
            if not isinstance(linear, torch.nn.Linear):
                continue
            parent = layer.get_submodule(name.rpartition(".")[0]) if "." in name else layer
            quantized = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=False,
                                          compute_dtype=torch.bfloat16, quant_type="nf4",
                                          compress_statistics=True, device="meta")  # fmt: skip
            quantized.weight = bnb.nn.Params4bit(linear.weight.data, requires_grad=False,
                                                 quant_type="nf4", compress_statistics=True
                                                 ).to(linear.weight.device)  # fmt: skip
            setattr(parent, name.rpartition(".")[2], quantized)
    model.is_loaded_in_4bit = True


def plan_estimate(model, counts: dict, step: ChatStep, length: int) -> float:
    """`TrainingFootprint.step_bytes` for this model, batch 1, checkpointing, one GPU."""
    from trainer.tasks.step_memory import TrainingFootprint
    from trainer.tasks.text_generation.spec import ChatArguments
    from trainer.tasks.text_generation.training import ChatTask

    task = ChatTask(None, None, ChatArguments(max_seq_length=length), {})
    full, recomputed = task.activation_values_per_sample(model)
    footprint = TrainingFootprint(
        parameters=counts["total"] + counts["trainable"], trainable_parameters=counts["trainable"],
        activation_values=full, checkpointed_activation_values=recomputed, batch_size=1,
        mixed_precision=model.device.type == "cuda", zero_stage=None, optimizer_offloaded=False,
        world_size=1, frozen_in_4bit=step.quantized, quantizable_parameters=counts["quantizable"],
    )  # fmt: skip
    return footprint.step_bytes(True)


def peak_bytes(context: Context, rss_before: int) -> int:
    """The GPU's peak allocated bytes; on CPU the peak RSS over the RSS before the model."""
    import resource

    import torch

    if context.cpu:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    return torch.cuda.max_memory_allocated()


def synchronize(context: Context) -> None:
    import torch

    if not context.cpu:
        torch.cuda.synchronize()


# --- the parts: the other tasks' steps ----------------------------------------------------


def task_steps(context: Context) -> dict:
    """bench/step_time.py's forward and backward at the default recipes' models and batches
    (whisper-small 16, ViT-base 8, BERT-base 32; on CPU whisper-tiny and batch 1)."""
    import step_time
    import torch

    args = argparse.Namespace(device=context.device, half_weights=False, peak_tflops=None,
                              repeats=1 if context.cpu else 3, warmup=1)  # fmt: skip
    _, peak = step_time.device_peak(args)
    workloads = [(step_time.whisper("tiny" if context.cpu else "small"), 16),
                 (step_time.vit_base(), 8), (step_time.bert_base(), 32)]  # fmt: skip
    figures = []
    for workload, batch in workloads:
        batch = 1 if context.cpu else batch
        torch.manual_seed(0)
        (row,) = step_time.measure(workload, "full", [batch], args, peak)
        if row.measured_s is None:
            figures.append(f"{row.model}: batch {batch} did not fit")
            continue
        mfu = f", MFU {row.implied_utilisation:.2f}" if row.implied_utilisation else ""
        figures.append(f"{row.model}: {batch / row.measured_s:,.1f} samples/s{mfu}")
    return {"measured": "; ".join(figures)}


# --- the parts: serving -------------------------------------------------------------------

CLIENTS = (1, 4, 16)
WORKERS = (1, 2)


def serving_whisper(context: Context) -> dict:
    return serving(context, "demo" if context.cpu else "speech")


def serving_bert(context: Context) -> dict:
    return serving(context, "text")


def serving_chat(context: Context) -> dict:
    return serving(context, "chat")


def serving(context: Context, task: str) -> dict:
    """bench/serve.py's server with 1 and 2 model workers, driven at 1, 4 and 16 clients."""
    import serve

    model_dir = served_model(context, task)
    budget = {"requests": 8} if context.cpu else {"duration": 2.0}
    bodies = [json.dumps({"instances": [one]}).encode() for one in serve.instances(task)]
    per_second = {}
    with running_servers(context, model_dir) as servers:
        for clients in CLIENTS:  # each level on both servers in turn: a changing load meets both
            for workers, server in servers.items():
                per_second[workers, clients] = serve.drive(server, bodies, clients, budget)
                context.note(f"so far: {requests_line(per_second)}")
    name = serve.TASK_MODELS[task] if task != "chat" or context.cpu else "1B Llama"
    return {"measured": f"{name} requests/s: {requests_line(per_second)}",
            "figures": {f"{w} workers, {c} clients": figures["per_second"]
                        for (w, c), figures in per_second.items()}}  # fmt: skip


@contextlib.contextmanager
def running_servers(context: Context, model_dir: Path):
    """A server per `WORKERS` value, all started and ready; stopped at the end."""
    import serve

    cores = 1 if context.cpu else os.cpu_count()
    servers = {}
    try:
        for workers in WORKERS:
            servers[workers] = serve.Server(model_dir, cores, serve.DEFAULT_MAX_BATCH_SIZE,
                                            serve.DEFAULT_MAX_WAIT_MS, workers=workers)  # fmt: skip
        for server in servers.values():
            server.wait_ready()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def requests_line(per_second: dict) -> str:
    """`1 worker: 1c 3.2, 4c 9.8, 16c 20.1; 2 workers: ...` (requests/s at each client count
    measured so far)."""
    cells = []
    for workers in WORKERS:
        levels = [f"{c}c {per_second[workers, c]['per_second']:.1f}"
                  for c in CLIENTS if (workers, c) in per_second]  # fmt: skip
        cells.append(f"{workers} worker{'s' * (workers > 1)}: {', '.join(levels) or '-'}")
    return "; ".join(cells)


def served_model(context: Context, task: str) -> Path:
    """The task's model folder under the shared scratch, built once (bench/serve.py's
    builders; on a GPU the chat model is a 1B Llama)."""
    import serve

    model_dir = context.scratch / "models" / task
    if not (model_dir / "config.json").exists():
        builder = build_1b_llama if task == "chat" and not context.cpu else serve.BUILDERS[task]
        builder(model_dir)
    return model_dir


LLAMA_1B = {"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 8192,
            "num_attention_heads": 32, "num_key_value_heads": 8,
            "tie_word_embeddings": False}  # fmt: skip
"""Llama 3.2 1B's shape (its vocabulary: the tiny local tokenizer's)."""


def build_1b_llama(model_dir: Path) -> None:
    """bench/serve.py's small Llama at 1B's shape, made on the GPU and saved in bf16."""
    import torch
    from serve import build_llama

    build_llama(model_dir, LLAMA_1B, device="cuda", dtype=torch.bfloat16)


def generation(context: Context) -> dict:
    """The server's generation at 16 clients (1 worker), in tokens/s, beside vLLM's offline
    `generate` on the same model and prompts where vLLM is installed."""
    import serve

    model_dir = served_model(context, "chat")
    bodies = [json.dumps({"instances": [one]}).encode() for one in serve.instances("chat")]
    server = serve.Server(model_dir, 1 if context.cpu else os.cpu_count(),
                          serve.DEFAULT_MAX_BATCH_SIZE, serve.DEFAULT_MAX_WAIT_MS)  # fmt: skip
    try:
        server.wait_ready()
        budget = {"requests": 16} if context.cpu else {"duration": 3.0}
        engine = serve.drive(server, bodies, 16, budget)["per_second"] * serve.CHAT_TOKENS
    finally:
        server.stop()
    context.note(f"engine {engine:,.0f} tokens/s; vLLM started, not done")
    return {"measured": f"engine {engine:,.0f} tokens/s; vLLM {vllm_tokens(context, model_dir)}"}


def vllm_tokens(context: Context, model_dir: Path) -> str:
    if context.cpu:
        return "skipped: needs CUDA"
    if importlib.util.find_spec("vllm") is None:
        return "skipped: not installed in this image"
    from serve import CHAT_TOKENS, SENTENCES
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model_dir), dtype="bfloat16", enforce_eager=True,
              gpu_memory_utilization=0.5)  # fmt: skip
    prompts = [SENTENCES[i % len(SENTENCES)] for i in range(64)]
    sampling = SamplingParams(max_tokens=CHAT_TOKENS, ignore_eos=True, temperature=0.0)
    started = time.perf_counter()
    answers = llm.generate(prompts, sampling)
    tokens = sum(len(answer.outputs[0].token_ids) for answer in answers)
    return f"{tokens / (time.perf_counter() - started):,.0f} tokens/s"


# --- the parts: a preemption ----------------------------------------------------------------


def preemption(context: Context) -> dict:
    """bench/stop_checkpoint.py's node, its state on the device and a step running when
    SIGTERM comes: the time to a complete checkpoint in the GCS emulator."""
    import stop_checkpoint

    from tests.support.gcs_emulator import running_emulator

    size_mb = 64 if context.cpu else 256
    with running_emulator() as emulator:
        os.environ["STORAGE_EMULATOR_HOST"] = emulator
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        row = stop_checkpoint.measure(size_mb, context.scratch, env, step_on=context.device)
    return {"measured": f"{row['bytes'] / 1e6:,.0f} MB: save {row['save_s']:.2f} s, upload "
                        f"{row['upload_s']:.2f} s (emulator), SIGTERM to manifest "
                        f"{row['sigterm_to_manifest_s']:.2f} s", "figures": row}  # fmt: skip


# --- the command line -----------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the folder the table goes to")
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on this CPU")
    parser.add_argument("--parts", nargs="+", choices=[part.name for part in PARTS],
                        help="these parts only (default: all)")  # fmt: skip
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        scratch = args.out / "scratch"
        scratch.mkdir(exist_ok=True)
        result = Path(args.child[2])
        child(args.child[0], args.child[1], result, Context(args.cpu, scratch, partial_of(result)))
        return
    parts = [part for part in PARTS if not args.parts or part.name in args.parts]
    header = header_of(args.cpu)
    rows = run_all(parts, args.out, args.cpu, header)
    print(markdown(header, rows))
    print(f"written: {args.out / 'gpu_check.md'}, {args.out / 'gpu_check.json'}")


if __name__ == "__main__":
    main()
