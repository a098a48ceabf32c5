#!/usr/bin/env bash
# Smoke test of a freshly built serving image (docker/Dockerfile's `serve` target), run by
# cloudbuild.yaml before anything is pushed:
#
#   docker run --rm --entrypoint=bash IMAGE-serve -c "$(cat docker/serve-smoke-test.sh)"
#
# It needs no GPU and no network: the image's stack (a CUDA 13 torch, no DeepSpeed, the
# ffmpeg binary, not root), then the server as Vertex AI runs it, on the built-in demo's
# tiny Whisper (random weights, built offline as the training demo builds it): started with
# Vertex AI's environment (port, routes, the model in AIP_STORAGE_URI), health polled until
# 200, and one prediction of one clip sent as {"b64": ...}, which ffmpeg decodes.
set -euo pipefail
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1  # no bar while the tiny Whisper is saved
cd "$(mktemp -d)"

echo "--- the image's stack"
python - <<'EOF'
import importlib.util, os, shutil

import fastapi, torch, transformers, uvicorn, trainer.serve

assert (torch.version.cuda or "").startswith("13."), f"torch is not a CUDA 13 build: {torch.version.cuda}"
assert importlib.util.find_spec("deepspeed") is None, "DeepSpeed is in the serving image"
assert shutil.which("ffmpeg"), "no ffmpeg binary: speech instances cannot be decoded"
assert os.getuid() != 0, "the server runs as root"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}, "
      f"fastapi {fastapi.__version__}, uvicorn {uvicorn.__version__}, uid {os.getuid()}")
EOF

echo "--- the demo's tiny Whisper"
python -c "from pathlib import Path; from trainer.tasks.speech_recognition.demo import build_tiny_whisper; \
build_tiny_whisper(Path('model'))"
test -f model/config.json

echo "--- one clip: a second of a 440 Hz tone at 22,050 Hz (the server resamples it)"
ffmpeg -nostdin -loglevel error -f lavfi -i sine=frequency=440:duration=1 -ar 22050 clip.wav

echo "--- the server, with Vertex AI's environment"
# Routes as Vertex AI sets them (never the defaults), so that the server is seen to read them.
export AIP_HTTP_PORT="${AIP_HTTP_PORT:-8080}" AIP_STORAGE_URI="$PWD/model" \
    AIP_HEALTH_ROUTE=/v1/endpoints/0/deployedModels/smoke \
    AIP_PREDICT_ROUTE=/v1/endpoints/0/deployedModels/smoke:predict
python -m trainer.serve > server.log 2>&1 &
server=$!
trap 'kill "$server" 2> /dev/null || true' EXIT

# Health: 503 while the model loads, 200 once it has run its warm-up prediction. A server
# that exits (a model it cannot load) or stays unready for 300 s fails the test.
python - "$server" <<'EOF' || { cat server.log >&2; exit 1; }
import os, sys, time, urllib.error, urllib.request


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # not a zombie
    except FileNotFoundError:
        return False


url = f"http://127.0.0.1:{os.environ['AIP_HTTP_PORT']}{os.environ['AIP_HEALTH_ROUTE']}"
server, start, status = int(sys.argv[1]), time.monotonic(), None
while time.monotonic() - start < 300:
    if not running(server):
        sys.exit(f"error: the server exited before it was healthy (last health status: {status})")
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    except OSError:
        status = None  # the port is not open yet
    if status == 200:
        print(f"healthy after {time.monotonic() - start:.0f} s")
        sys.exit(0)
    time.sleep(1)
sys.exit(f"error: not healthy within 300 s (last health status: {status})")
EOF

echo "--- one prediction"
python - <<'EOF' || { cat server.log >&2; exit 1; }
import base64, json, os, urllib.request

url = f"http://127.0.0.1:{os.environ['AIP_HTTP_PORT']}{os.environ['AIP_PREDICT_ROUTE']}"
clip = base64.b64encode(open("clip.wav", "rb").read()).decode()
request = urllib.request.Request(
    url, data=json.dumps({"instances": [{"audio": {"b64": clip}}]}).encode(),
    headers={"Content-Type": "application/json"},
)
with urllib.request.urlopen(request, timeout=120) as response:
    body = json.loads(response.read())
print(json.dumps(body))
predictions = body.get("predictions")
assert isinstance(predictions, list) and len(predictions) == 1, body
assert isinstance(predictions[0].get("text"), str), body
EOF

echo "serve smoke test passed"
