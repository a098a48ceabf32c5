"""The Model Garden vLLM image docs/serving.md names is not older than the one Google's samples
that it cites use. The samples are read by a person (this machine reaches no network):
SAMPLES_TAG is the newest tag of
GoogleCloudPlatform/vertex-ai-samples, notebooks/community/model_garden/
model_garden_gemma3_deployment_on_vertex.ipynb, read at commit d6570cb4 (2026-12-05); raise it
when the samples move on, and the docs must follow."""

from __future__ import annotations

import re
from pathlib import Path

SAMPLES_TAG = "20251205_0916_RC01"
IMAGE = "vertex-vision-model-garden-dockers/pytorch-vllm-serve"
TAG = re.compile(rf"{re.escape(IMAGE)}:(\d{{8}}_\d{{4}}_RC\d\d)")
SERVING = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def ordered(tag: str) -> tuple[str, str, int]:
    """A Model Garden tag (`YYYYMMDD_HHMM_RCNN`) as something that sorts by its age."""
    day, time, candidate = tag.split("_")
    return day, time, int(candidate.removeprefix("RC"))


def test_the_documented_vllm_image_is_not_older_than_the_samples():
    tags = TAG.findall(SERVING.read_text())
    assert tags, f"docs/serving.md names no {IMAGE} tag"
    stale = [tag for tag in tags if ordered(tag) < ordered(SAMPLES_TAG)]
    assert not stale, f"docs/serving.md names {stale}, older than the samples' {SAMPLES_TAG}"


def test_an_older_tag_is_found_older():
    assert ordered("20250312_0916_RC01") < ordered(SAMPLES_TAG)
    assert ordered("20251205_0916_RC00") < ordered(SAMPLES_TAG) < ordered("20260101_0000_RC00")
