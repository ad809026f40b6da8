"""Shared, module-built inputs of the curation tests: a tiny model, a "letter" teacher, a small
synthetic suite with one corrupt video (the command-line options are in curationfixtures)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model

from curationfixtures import letter_model


@pytest.fixture(scope="package")
def curation_inputs(tmp_path_factory) -> dict:
    """{"model", "teacher", "data", "records", "ids"}: 12 synthetic samples (3 per task: colour,
    motion and image_colour are multiple choice, count is numerical) and a record whose video is
    not a video."""
    root = tmp_path_factory.mktemp("curation")
    model = build_tiny_model("qwen2_5_vl", root / "model", seed=0)
    teacher = letter_model(root / "teacher")
    suite = write_suite(root / "synth", num_train=12, num_val=0, seed=3,
                        tasks=("colour", "motion", "count", "image_colour"))["train"]
    records = [json.loads(line) for line in suite.read_text().splitlines()]
    bad = root / "synth" / "videos" / "corrupt.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypmp42 this is no video" * 8)
    corrupt = dict(records[0], problem_id="corrupt-video", videos=["videos/corrupt.mp4"], data_type="video")
    records.insert(5, corrupt)
    data = root / "synth" / "curate.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    return {"root": root, "model": model, "teacher": teacher, "data": data, "records": records,
            "ids": [r["problem_id"] for r in records]}


@pytest.fixture
def fresh(tmp_path):
    """A new output folder."""
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    return out
