#!/usr/bin/env bash
# Smoke test of a freshly built image, run by cloudbuild.yaml before anything is pushed:
#
#   docker run --rm --shm-size=2g --entrypoint=bash IMAGE -c "$(cat docker/smoke-test.sh)"
#
# It needs no GPU and no network (the build machine has neither a GPU nor the model hub):
# imports, the CUDA build of torch, DeepSpeed's ops compiled for torch's CUDA, the launcher's
# driver check, the launch plan of a simulated two-node Vertex AI job, and a short CPU
# training run of the built-in demo through the real entrypoint (two processes, DeepSpeed
# ZeRO-2, evaluation, saving). docker/check-stack.sh runs it outside Docker as well.
set -euo pipefail
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
cd "$(mktemp -d)"

echo "--- imports"
# DS_ACCELERATOR=cpu: the accelerator DeepSpeed picks on a machine without a GPU anyway,
# named, so that it does not warn that it "was unable to detect" one.
DS_ACCELERATOR=cpu python - <<'EOF'
import accelerate, datasets, deepspeed, google.cloud.storage, hypertune, jiwer, torch
import torchcodec.decoders, transformers, trainer
from deepspeed.git_version_info import installed_ops, torch_info

assert (torch.version.cuda or "").startswith("13."), f"torch is not a CUDA 13 build: {torch.version.cuda}"
built_for = torch_info["cuda_version"]
assert built_for == torch.version.cuda, f"DeepSpeed's ops built for CUDA {built_for}, torch has {torch.version.cuda}"
missing = [op for op in ("fused_adam", "cpu_adam") if not installed_ops.get(op)]
assert not missing, f"DeepSpeed ops not compiled into the image: {missing}"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), deepspeed {deepspeed.__version__}, "
      f"transformers {transformers.__version__}, accelerate {accelerate.__version__}")
EOF

echo "--- ds_report: the compiled ops and the stack they were built for"
# Only those lines: ds_report also lists every op the image does not build (ninety lines of
# [NO], warnings about their build dependencies, a failed link) and "[FAIL] nvcc missing":
# the image has no CUDA compiler on purpose, its ops were compiled in the builder stage. A
# ds_report that fails prints everything.
report=$(DS_ACCELERATOR=cuda ds_report 2>&1) || { echo "$report" >&2; exit 1; }
sed 's/\x1b\[[0-9;]*m//g' <<<"$report" \
    | grep -E '^(op name|fused_adam|cpu_adam) |^(torch |deepspeed |shared memory).* \.{3,} '
echo "nvcc: none in the image, as intended (the ops above were compiled in the builder stage)"

echo "--- launch plan of node 1 in a two-node job (8 GPUs each, simulated)"
# The recipe's data is in a bucket and its model on the Hub, neither reachable here: an
# empty Common Voice-style directory passes the layout checks, and the Hub is not asked.
mkdir -p cv/clips && for split in train dev test; do printf 'path\tsentence\n' > "cv/$split.tsv"; done
CLUSTER_SPEC='{"cluster": {"workerpool0": ["cmle-training-workerpool0-ab-0:2222"],
  "workerpool1": ["cmle-training-workerpool1-ab-0:2222"]},
  "environment": "cloud", "task": {"type": "workerpool1", "index": 0}}' \
    python -m trainer whisper-small.yaml --deepspeed zero2 --nproc_per_node 8 --dry-run \
    --dataset_name ./cv --skip_hub_check > plan.json 2> notices.txt \
    || { cat notices.txt >&2; exit 1; }
# The launcher's first line: its driver check found no driver and read torch's CUDA.
grep -Fx "NVIDIA driver: none loaded (a CPU run); torch's CUDA 13.0" notices.txt
python - <<'EOF'
import json

plan = json.load(open("plan.json"))
topology = plan["topology"]
expected = {"num_nodes": 2, "node_rank": 1, "world_size": 16, "master_port": 2222,
            "master_addr": "cmle-training-workerpool0-ab-0"}
assert {key: topology[key] for key in expected} == expected, topology
print(" ".join(plan["command"]))
EOF

echo "--- CPU training: the built-in demo for 2 steps, 2 processes, DeepSpeed ZeRO-2"
python -m trainer --nproc_per_node 2 --max_steps 2 --logging_steps 1 --eval_steps 2 \
    --save_steps 2 --max_eval_samples 4 --output_dir smoke
test -f smoke/model/config.json

echo "smoke test passed"
