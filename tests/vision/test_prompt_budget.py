"""`vision.budget`: the most tokens a video or an image can become, against values worked out by
hand and against the real processors' prompts (the bound is reached, never passed), and
`smart_resize` keeping to its pixel budget where Qwen's rounding would not."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from easyvideor1.models.families import get_family
from easyvideor1.models.inputs import build_inputs
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.models.tiny import SIZES, TINY_CONFIGS, build_processor
from easyvideor1.models.tokenizer import SPECIAL_TOKENS, build_tokenizer, chat_template
from easyvideor1.records import Frames, Sample, VideoMetadata
from easyvideor1.vision.budget import (
    VideoBound,
    clip_tokens,
    image_tokens,
    largest_fitting,
    largest_video,
    prompt_vision_tokens,
)
from easyvideor1.vision.config import VisionConfig
from easyvideor1.vision.sampling import frame_indices, smart_resize, video_size

SEVEN_B = VisionConfig(family="qwen2_5_vl", max_frames=128, video_max_pixels=262144, video_total_pixels=10035200,
                       image_max_pixels=1048576)  # configs/qwen2_5_vl_7b_8gpu.yaml


def test_hand_values():
    # The review's numbers (before the fix): 128 frames of 262,144 px = 334.4 -> 334 tokens of 28x28
    # per temporal patch of 2 frames, x 64 = 21,376, + <|vision_start|> <|vision_end|>
    assert largest_video(dataclasses.replace(SEVEN_B, video_total_pixels=24576 * 784)) == VideoBound(21378, 128, 262144, 21376)
    # The shipped config: min(262144, 10035200 / n * 2) per frame. 76 frames: 334 x 38 = 12,692;
    # 80 frames: 250,880 px = 320 tokens x 40 = 12,800; 128 frames: 156,800 px = 200 x 64 = 12,800
    assert largest_video(SEVEN_B) == VideoBound(12802, 80, 250880, 12800)
    assert image_tokens(SEVEN_B) == 2 + 1337  # 1,048,576 / 784 = 1337.5
    assert prompt_vision_tokens(SEVEN_B, 1, 2) == 12802 + 2 * 1339 and prompt_vision_tokens(SEVEN_B, 0, 0) == 0
    # Qwen3-VL (budget over all frames, 32x32 tokens): 19,267,584 / 128 = 150,528 px = 147 tokens, and
    # before each of the 64 patches "<t seconds>" (12 at most) + start/end
    assert largest_video(VisionConfig(family="qwen3_vl")) == VideoBound(2 + 64 * (147 + 14), 128, 150528, 64 * 147)
    # The 1.05 x video_min_pixels floor binds past the total: 512 frames of a 32,768-token total get
    # 100,352 px each < int(1.05 * 100,352) = 105,369 px = 134 tokens, x 256 patches
    long = dataclasses.replace(SEVEN_B, max_frames=512, video_total_pixels=32768 * 784)
    assert largest_video(long) == VideoBound(2 + 256 * 134, 512, 105369, 256 * 134)
    # a whole 64 s 1080p clip at 30 fps: 128 frames of 280 x 504 (the 156,800 px budget) = 10 x 18 tokens
    assert clip_tokens(SEVEN_B, 64, 1080, 1920) == 2 + 64 * 10 * 18
    assert video_size(1080, 1920, 128, SEVEN_B) == (280, 504)


def test_largest_fitting():
    assert largest_fitting(1, 100, lambda x: x * x <= 50) == 7
    assert largest_fitting(1, 100, lambda x: x <= 100) == 100
    assert largest_fitting(8, 100, lambda x: x * x <= 50) is None


def test_smart_resize_keeps_to_its_budget_where_qwen_rounds_past_it():
    # Qwen's ceil: a 100x100 frame raised to 128 tokens of 28x28 becomes 12 x 12 = 144 cells,
    # past a budget of int(1.05 * 128 * 784) px = 134.4 cells: the long side is cut to 11
    assert smart_resize(100, 100, 28, 128 * 784, int(1.05 * 128 * 784)) == (11 * 28, 12 * 28)
    # one cell high and 150 wide (aspect 150): the short side is held at one cell, the long one cut to
    # the 100-cell budget
    assert smart_resize(28, 4200, 28, 784, 100 * 784) == (28, 100 * 28)
    # within budget: unchanged (qwen-vl-utils' values, tests/vision/test_sampling.py)
    assert smart_resize(1080, 1920, 28, 3136, 200704) == (336, 588)
    # over random shapes and budgets, never above max_pixels
    g = torch.Generator().manual_seed(0)
    for _ in range(2000):
        factor = (28, 32)[int(torch.randint(0, 2, (1,), generator=g))]
        side, aspect = int(torch.randint(1, 3000, (1,), generator=g)), float(torch.rand(1, generator=g)) * 199 + 1
        lo = int(torch.randint(1, 400, (1,), generator=g)) * factor * factor // 4 + 1
        hi = lo * (1 + float(torch.rand(1, generator=g)) * 20)
        h, w = smart_resize(side, max(1, round(side * aspect)), factor, lo, hi)
        assert h * w <= max(hi, factor * factor) and h % factor == 0 and w % factor == 0


def _tiny(family: str):
    fam = get_family(family)
    tokenizer = build_tokenizer(chat_template(fam.default_system_prompt))
    config = TINY_CONFIGS[family](SIZES["tiny"], {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS})
    return fam, build_processor(fam, tokenizer), mrope_spec(config)


def _video(cfg: VisionConfig, height: int, width: int, seconds: float, fps: float = 30.0) -> Frames:
    total = round(seconds * fps)
    indices = frame_indices(total, fps, cfg)
    h, w = video_size(height, width, len(indices), cfg)
    pixels = torch.randint(0, 256, (len(indices), 3, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    return Frames(pixels, VideoMetadata(fps, total, indices, width, height, seconds), source="v.mp4")


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_the_processor_reaches_the_bound_and_never_passes_it(family):
    """Prompt tokens a video adds, through the family's real processor and chat template: a square
    frame fills the per-frame budget exactly (a square number of cells); others stay under it."""
    fam, processor, spec = _tiny(family)
    f = fam.grid_factor
    cfg = VisionConfig(family=family, max_frames=8, min_frames=2, video_min_pixels=f * f, video_max_pixels=16 * f * f,
                       video_total_pixels=10 ** 9, image_min_pixels=f * f, image_max_pixels=9 * f * f)
    bound = largest_video(cfg)
    assert bound == VideoBound(2 + 4 * (16 + (14 if fam.timestamps == "frame_text" else 0)), 8, 16 * f * f, 4 * 16)

    def added(frames: list[Frames], videos: list[str], images: list[str]) -> int:
        sample = Sample("q", "a", "free-form", "video", videos=videos, images=images, problem_id="s")
        plain = Sample("q", "a", "free-form", "text", problem_id="t")
        with_media = build_inputs(sample, frames, "What happens?", processor, fam, spec)
        return with_media.prompt_len - build_inputs(plain, [], "What happens?", processor, fam, spec).prompt_len

    square = added([_video(cfg, 720, 720, 10.0)], ["v.mp4"], [])  # 8 frames of 4 x 4 cells
    if fam.timestamps == "frame_text":  # "<t seconds>": 6-7 tokens here, 12 allowed
        assert bound.tokens - 4 * (12 - 5) <= square <= bound.tokens
    else:
        assert square == bound.tokens
    for height, width, seconds in [(360, 640, 10.0), (1080, 1920, 3.0), (100, 700, 64.0), (30, 3000, 1.0)]:
        assert added([_video(cfg, height, width, seconds)], ["v.mp4"], []) <= bound.tokens, (height, width)
    image = torch.randint(0, 256, (1, 3, 3 * f, 3 * f), dtype=torch.uint8)
    both = added([_video(cfg, 720, 720, 10.0), Frames(image, None, "i.png"), Frames(image, None, "j.png")],
                 ["v.mp4"], ["i.png", "j.png"])
    assert both - square == 2 * image_tokens(cfg) == 2 * (2 + 9)
    assert prompt_vision_tokens(cfg, 1, 2) >= both
    assert math.isclose(bound.frame_pixels, 16 * f * f)
