"""Helpers of the tool-loop tests: a real clip on disk, prompts with tools, and a tiny model taught
(by a few steps of supervised fitting) to call a tool, since a random one never writes a call."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch

from easyvideor1.models.collate import collate
from easyvideor1.models.inputs import append_response
from easyvideor1.prompts import Prompt, PromptBuilder
from easyvideor1.records import Sample
from easyvideor1.rollout.tools.registry import TOOLS
from easyvideor1.vision.cache import FrameSource
from easyvideor1.vision.config import VisionConfig
from easyvideor1.vision.encode import write_video

CALL = '<tool_call>\n{"name": "crop_video", "arguments": {"start": 1.0, "end": 2.5}}\n</tool_call>'


def write_clip(path: Path, seconds: int = 4, fps: int = 8, size: int = 64) -> Path:
    """A clip whose every frame has its own colour (so frames differ), `seconds` long at `fps`."""
    t = np.arange(seconds * fps)
    frames = np.zeros((len(t), size, size, 3), dtype=np.uint8)
    frames[..., 0] = (t * 7 % 256)[:, None, None]
    frames[..., 1] = (255 - t * 5 % 256)[:, None, None]
    frames[:, size // 4: size // 2, size // 4: size // 2, 2] = 200
    return write_video(path, frames, fps)


def vision_of(family: str) -> VisionConfig:
    """Small budgets: 4 prompt frames of 2 x 2 grid cells (1 fps over a 4 s clip)."""
    f = 28 if family in ("qwen2_vl", "qwen2_5_vl") else 32
    px = 4 * f * f
    return VisionConfig(family=family, fps=1.0, min_frames=2, max_frames=4, video_min_pixels=px,
                        video_max_pixels=px, video_total_pixels=64 * px, image_min_pixels=f * f,
                        image_max_pixels=16 * f * f)


def tool_prompt(tiny, clip: Path, problem_id: str = "clip", tools=("crop_video", "zoom_frame"),
                sample_tools: list[str] | None = None) -> Prompt:
    """The prompt of a one-video sample in a run with `tools`: the chat template lists those the
    sample is offered (`sample_tools`: its record's `tools` field)."""
    sample = Sample("What colour is the square?", "blue", "free-form", "video", videos=[str(clip)],
                    problem_id=problem_id, tools=sample_tools)
    builder = PromptBuilder(FrameSource(vision_of(tiny.family.name), mode="realtime"), tiny.processor, tiny.family,
                            tiny.spec, render=lambda s: s.problem, tools=[TOOLS[t].schema() for t in tools])
    return builder.build(sample)


def taught(tiny, prompt: Prompt | list[Prompt], text: str, steps: int = 150, model=None):
    """A copy of `model` (default `tiny.model`) fitted to answer `prompt` (or each of a list, in
    one batch) with `text` + end of turn (greedy); `tiny`: anything with `.processor`, `.family`, `.spec`."""
    model = copy.deepcopy(tiny.model if model is None else model).train()
    tok = tiny.processor.tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    prompts = prompt if isinstance(prompt, list) else [prompt]
    batch = collate([append_response(p.inputs, ids, tiny.spec) for p in prompts], tiny.family, tiny.spec,
                    tok.pad_token_id)
    target = batch.input_ids.clone()
    target[~batch.loss_mask] = -100
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for _ in range(steps):
            logits = model(**batch.model_kwargs()).logits[:, :-1]
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target[:, 1:].flatten(), ignore_index=-100)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if loss.item() < 0.01:
                break
    return model.eval()
