#!/usr/bin/env bash
# `make image-test`: the images built and run the way Cloud Build and their users run them.
#
#   make image-test                                       docker, the real base images
#   make image-test DOCKER=/usr/bin/docker CUDA_BASE=standin/cuda:13.0.2-base-ubuntu24.04
#                                                         a machine that pulls from no registry
#
# 1. Builds (BuildKit, --network=host) the training image, the serving image (the `serve`
#    target) and the Ray image, tagged as the documents name them (vertex-hf-trainer,
#    vertex-hf-trainer-serve, vertex-hf-trainer-ray); prints each one's build time and size.
# 2. Runs the two smoke tests with the very commands of cloudbuild.yaml's smoke-test steps.
# 3. Runs what users run, as docker/Dockerfile's header writes it, in a folder of its own:
#    the launch plan offline; the built-in demo trained with that folder mounted (as root);
#    its delivered model served from that folder mounted read-only (the server is uid 10001):
#    health 200, then one transcription of a sentence espeak-ng speaks in a voice the demo
#    never trained on; the same model through google-cloud-aiplatform's own local client for
#    custom serving containers (LocalModel, from its `prediction` extra, in a venv of its own:
#    that extra pins a fastapi older than the server's), on Vertex AI-style routes.
# Ends with a summary: build times and sizes, each smoke test, the transcription, LocalModel's
# answer. Slow (cold: about 25 minutes on 2 cores; cached builds take seconds), and never part
# of `make test`: run it when docker/, cloudbuild.yaml, pyproject.toml or constraints.txt change.
#
# Environment: DOCKER (default docker), CUDA_BASE (default: docker/Dockerfile's), RAY_BASE
# (default: docker/Dockerfile.ray's; when CUDA_BASE is not the Dockerfile's, a stand-in made
# from CUDA_BASE: its Python 3 in a venv on PATH, as Vertex AI's Ray image has Python on PATH;
# it lacks that image's Ray and Python 3.11, which the build installs or does not need),
# PYTHON (the interpreter of this script's helpers and of LocalModel's venv; default python3),
# IMAGE_TEST_DIR (the work folder; default a new one under /tmp, kept for a look afterwards).
# A GPU is used when `nvidia-smi -L` finds one (docker run --gpus all), as the header says.
set -euo pipefail
PYTHON=${PYTHON:-python3}
# A path (the Makefile's .venv/bin/python) made absolute: the user workflows run elsewhere.
if [[ $PYTHON == */* ]]; then PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON"); fi
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
DOCKER=${DOCKER:-docker}
default_base=$(sed -n 's/^ARG CUDA_BASE=//p' docker/Dockerfile)
CUDA_BASE=${CUDA_BASE:-$default_base}
work=${IMAGE_TEST_DIR:-$(mktemp -d /tmp/image-test.XXXXXX)}
mkdir -p "$work"
export DOCKER_BUILDKIT=1
gpus=()
if nvidia-smi -L > /dev/null 2>&1; then gpus=(--gpus all); fi
summary=()
note() { summary+=("$*"); echo "=== $*"; }
started=$SECONDS
elapsed() { local s=$((SECONDS - $1)); printf '%d min %02d s' $((s / 60)) $((s % 60)); }
size() { "$DOCKER" image inspect -f '{{.Size}}' "$1" | awk '{printf "%.2f GB", $1 / 1e9}'; }

build() {  # build NAME ARGS...: one image, timed
    local name=$1 t0=$SECONDS
    shift
    echo "=== building $name"
    nice "$DOCKER" build --network=host "$@" -t "$name" .
    note "build $name: $(elapsed "$t0"), $(size "$name")"
}

build vertex-hf-trainer-serve --build-arg CUDA_BASE="$CUDA_BASE" -f docker/Dockerfile \
    --target serve
build vertex-hf-trainer --build-arg CUDA_BASE="$CUDA_BASE" -f docker/Dockerfile

ray_args=()
if [ -n "${RAY_BASE:-}" ]; then
    ray_args=(--build-arg RAY_BASE="$RAY_BASE")
elif [ "$CUDA_BASE" != "$default_base" ]; then
    RAY_BASE=standin/ray-base:from-cuda-base
    echo "=== a stand-in for Vertex AI's Ray image, from $CUDA_BASE: $RAY_BASE"
    nice "$DOCKER" build -q --network=host -t "$RAY_BASE" --build-arg BASE="$CUDA_BASE" - <<'EOF'
ARG BASE
FROM ${BASE}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv && apt-get clean && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/ray-python
ENV PATH=/opt/ray-python/bin:$PATH
EOF
    ray_args=(--build-arg RAY_BASE="$RAY_BASE")
fi
build vertex-hf-trainer-ray "${ray_args[@]}" -f docker/Dockerfile.ray
# DS_ACCELERATOR=cpu: no GPU to detect here, and DeepSpeed warns when it has to guess.
# (Each value is set apart before it is noted: a failed $(...) inside an argument would not
# stop the script.)
stack=$("$DOCKER" run --rm -e DS_ACCELERATOR=cpu vertex-hf-trainer-ray python -c \
"import sys, ray, torch, deepspeed, trainer.ray.job; print(f'ray {ray.__version__}, torch \
{torch.__version__}, deepspeed {deepspeed.__version__}, Python {sys.version.split()[0]}')")
note "ray image: $stack, base ${RAY_BASE:-Dockerfile.ray default}"

# --- the smoke tests, as cloudbuild.yaml's steps run them (images named as built above)
cloudbuild_command() {  # the bash -c line of a cloudbuild.yaml step, for the local images
    "$PYTHON" - "$1" "$DOCKER" <<'EOF'
import sys

import yaml

step = next(s for s in yaml.safe_load(open("cloudbuild.yaml"))["steps"] if s["id"] == sys.argv[1])
assert step["entrypoint"] == "bash" and step["args"][0] == "-c", step
command = step["args"][1]
for placeholder, value in [("${_REGION}-docker.pkg.dev/${PROJECT_ID}/${_REPOSITORY}/", ""),
                           ("${_IMAGE}", "vertex-hf-trainer"), ("${_TAG}", "latest"),
                           ("$$", "$")]:
    command = command.replace(placeholder, value)
assert command.startswith("docker run "), command
print(sys.argv[2] + command.removeprefix("docker"))
EOF
}
for step in smoke-test smoke-test-serve; do
    command=$(cloudbuild_command "$step")
    echo "=== $step: $command" | cut -c1-200
    t0=$SECONDS
    bash -c "$command" 2>&1 | tee "$work/$step.log"
    first_step=$(grep -o 'time to first step: .*' "$work/$step.log" || true)
    note "$step: passed in $(elapsed "$t0")${first_step:+; $first_step}"
done

# --- what users run (docker/Dockerfile's header), in a folder of its own
cd "$work"
mkdir -p cv/clips
for split in train dev test; do printf 'path\tsentence\n' > "cv/$split.tsv"; done
echo "=== the launch plan, offline"
"$DOCKER" run --rm "${gpus[@]}" --ipc=host -v "$PWD/cv:/workspace/cv:ro" vertex-hf-trainer \
    whisper-small.yaml --task speech-recognition --dataset_name ./cv --skip_hub_check \
    --dry-run > plan.json
plan=$("$PYTHON" -c "import json; t = json.load(open('plan.json'))['topology']; \
print(f\"a plan of {t['num_nodes']} node(s), {t['nproc_per_node']} process(es) each\")")
note "dry run: $plan"

echo "=== the built-in demo, the working folder mounted"
t0=$SECONDS
"$DOCKER" run --rm "${gpus[@]}" --ipc=host -v "$PWD:/workspace" vertex-hf-trainer 2>&1 \
    | tee demo.log
model=$PWD/outputs/demo/model
modes=$(find "$model" -printf '%m\n' | sort | uniq -c | awk '{printf "%s%s x %s", s, $1, $2; s=", "}')
result=$(grep -o 'result: .*' demo.log)
note "demo: trained in $(elapsed "$t0"): $result; modes in outputs/demo/model: $modes"

echo "=== a sentence the demo model never heard in this voice, spoken by espeak-ng"
sentence="five blue dogs"
voice=en-us+f2  # one of the demo's test voices (trainer/tasks/speech_recognition/demo.py TEST_SPEAKERS)
"$DOCKER" run --rm -v "$PWD:/workspace" --entrypoint espeak-ng vertex-hf-trainer \
    -v "$voice" -s 160 -w clip.wav "$sentence"
"$PYTHON" - <<'EOF'
import base64, json

clip = base64.b64encode(open("clip.wav", "rb").read()).decode()
json.dump({"instances": [{"audio": {"b64": clip}}]}, open("request.json", "w"))
EOF

serve_port=$("$PYTHON" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); \
print(s.getsockname()[1])")
server=image-test-serve-$$
trap '"$DOCKER" rm -f "$server" > /dev/null 2>&1 || true' EXIT
echo "=== the delivered model served, mounted read-only, on port $serve_port"
"$DOCKER" run -d --name "$server" "${gpus[@]}" -p "$serve_port:8080" \
    -v "$PWD/outputs/demo/model:/model:ro" vertex-hf-trainer-serve /model > /dev/null
"$PYTHON" - "$serve_port" "$DOCKER" "$server" "$sentence" "$voice" <<'EOF' | tee served.txt
import json, subprocess, sys, time, urllib.error, urllib.request

port, docker, server, sentence, voice = sys.argv[1:]
start, status = time.monotonic(), None
while time.monotonic() - start < 300 and status != 200:
    running = subprocess.run([docker, "inspect", "-f", "{{.State.Running}}", server],
                             capture_output=True, text=True).stdout.strip()
    if running != "true":
        logs = subprocess.run([docker, "logs", server], capture_output=True, text=True)
        sys.exit(f"error: the server exited:\n{logs.stdout}{logs.stderr}")
    try:
        status = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status
    except urllib.error.HTTPError as error:
        status = error.code
    except OSError:
        status = None
    time.sleep(0 if status == 200 else 1)
if status != 200:
    sys.exit(f"error: not healthy within 300 s (last: {status})")
healthy = time.monotonic() - start
request = urllib.request.Request(f"http://127.0.0.1:{port}/predict",
                                 data=open("request.json", "rb").read(),
                                 headers={"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=120) as response:
    code, body = response.status, json.loads(response.read())
print(f"serve: /model read-only, health 200 after {healthy:.0f} s; predict {code}: "
      f"{sentence!r} ({voice}) -> {body['predictions'][0]['text']!r}")
EOF
summary+=("$(cat served.txt)")
"$DOCKER" rm -f "$server" > /dev/null

echo "=== the same model through google-cloud-aiplatform's LocalModel"
venv=$work/aiplatform-venv
aiplatform=$(grep -i '^google-cloud-aiplatform==' "$repo/constraints.txt")
if [ ! -x "$venv/bin/python" ]; then
    "$PYTHON" -m venv "$venv"
    "$venv/bin/pip" install --quiet "${aiplatform}" "${aiplatform/==/[prediction]==}"
fi
"$venv/bin/python" - "$model" "$DOCKER" <<'EOF' | tee localmodel.txt
import json, subprocess, sys

from google.cloud.aiplatform.prediction import LocalModel

model_dir, docker = sys.argv[1:]
routes = "/v1/endpoints/image-test/deployedModels/demo"
local_model = LocalModel(
    serving_container_image_uri="vertex-hf-trainer-serve",
    serving_container_predict_route=f"{routes}:predict",
    serving_container_health_route=routes,
    serving_container_ports=[8080],
)
with local_model.deploy_to_local_endpoint(artifact_uri=model_dir,
                                          container_ready_timeout=600) as endpoint:
    health = endpoint.run_health_check()
    answer = endpoint.predict(request_file="request.json",
                              headers={"Content-Type": "application/json"})
    container = endpoint.container
endpoint.container = None  # stopped by the with; its __del__ would stop it again, removed
container.remove()  # LocalModel stops its container and leaves it behind
assert health.status_code == 200 and answer.status_code == 200, (health.text, answer.text)
print(f"LocalModel: health {health.status_code}, predict {answer.status_code} on {routes}:predict:"
      f" {answer.text.strip()}")
EOF
summary+=("$(cat localmodel.txt)")

echo
echo "=== image-test passed in $(elapsed "$started") (DOCKER=$DOCKER CUDA_BASE=$CUDA_BASE" \
    "RAY_BASE=${RAY_BASE:-Dockerfile.ray default}; work folder $work)"
printf '%s\n' "${summary[@]}"
