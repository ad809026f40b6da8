"""`eval --tools` with the HF engine: a tiny model taught to call crop_video answers a `flash`
sample over several turns; the results row keeps every turn and call, and the tools are part of
the settings hash (runs without tools keep theirs)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from tool_helpers import CALL, taught

from easyvideor1.config_tree import ConfigError
from easyvideor1.data.synth import write_suite
from easyvideor1.evaluation.adapters import get_benchmark
from easyvideor1.evaluation.evaluator import EvalOptions, Evaluator
from easyvideor1.evaluation.settings import DecodingSettings
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.vision.config import VisionConfig

VISION = VisionConfig(family="qwen2_5_vl", fps=1.0, max_frames=4, video_min_pixels=3136, video_max_pixels=3136,
                      image_min_pixels=784, image_max_pixels=3136)


def test_eval_with_tools_keeps_every_turn(tmp_path):
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model")
    data = write_suite(tmp_path / "data", num_train=0, num_val=1, tasks=("flash",))["val"]
    options = EvalOptions(out_dir=str(tmp_path / "out"), cache_mode="realtime", dtype="float32", asynchronous=False,
                          max_batch=1)
    ev = Evaluator(str(model), engine="hf", options=options, vision=VISION, tools=("crop_video",),
                   sampling=DecodingSettings(temperature=0, max_new_tokens=400))
    bench = get_benchmark(str(data))
    prompt = ev.prepare(bench, bench.load(None)[0])
    assert '"name": "crop_video"' in prompt.inputs.prompt_text  # the chat template lists the tool
    hf = ev.engine.engine
    hf.model = taught(SimpleNamespace(processor=ev.processor, family=ev.family, spec=ev.spec), prompt, CALL,
                      model=hf.model)
    ev.run([str(data)])
    (row,) = [json.loads(line) for line in (tmp_path / "out" / "file-val.jsonl").read_text().splitlines()]
    assert row["status"] == "ok" and row["turns"][0] == CALL and len(row["turns"]) >= 2
    assert row["tool_calls"][0] == {"name": "crop_video", "arguments": {"start": 1.0, "end": 2.5}, "error": None,
                                    "visual_tokens": row["tool_calls"][0]["visual_tokens"]}
    assert row["tool_calls"][0]["visual_tokens"] > 0 and row["response"] in (row["turns"][-1], "")
    report = json.loads((tmp_path / "out" / "report.json").read_text())["benchmarks"]["file-val"]["tool_calls"]
    assert report == {"calls": len(row["tool_calls"]), "calls_per_response": len(row["tool_calls"]),
                      "errors": sum(c["error"] is not None for c in row["tool_calls"])}
    assert "Tool calls (`eval --tools`)" in (tmp_path / "out" / "report.md").read_text()
    settings = json.loads((tmp_path / "out" / "settings.json").read_text())["settings"]
    assert settings["tools"] == "crop_video"
    assert "tools" not in ev.settings.__class__(model_path="m").flat()  # no tools: the old hash


def test_eval_tools_need_the_hf_engine_and_known_names(tmp_path):
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model")
    options = EvalOptions(out_dir=str(tmp_path / "out"), dtype="float32")
    with pytest.raises(ConfigError, match="--tools: unknown tool.s. crop; valid: crop_video, zoom_frame"):
        Evaluator(str(model), engine="hf", options=options, vision=VISION, tools=("crop",))
