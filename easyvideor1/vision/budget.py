"""The most tokens a video or an image can become under a `VisionConfig`, counted as
`sampling` sizes frames: what the prompt budget check (`config.Config`) and `plan` read.

A video sampled to n frames (a multiple of the temporal patch size: any from one patch, for a
short clip, to `max_frames` floored to it) is n / temporal_patch_size temporal patches of
(H / grid_factor) x (W / grid_factor) merged tokens, with H*W <= `video_frame_budget(n)` (the
per-family `video_total_pixels` rule), which `smart_resize` never exceeds. So one patch holds at
most floor(budget / grid_factor^2) tokens, and the largest video is the largest of
patches(n) x that over every n: at max_frames when the per-frame cap binds, or where the
1.05 x video_min_pixels floor does. An image is one patch under image_max_pixels.
Text the processors add: <|vision_start|> and <|vision_end|> around each item, and for the
`frame_text` families (Qwen3-VL, Qwen3.5) a "<12.5 seconds>" text and another start/end pair
before every temporal patch (`TIMESTAMP_TOKENS` covers the Qwen tokenizer's timestamps up to
ten million seconds).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from easyvideor1.models.families import get_family
from easyvideor1.vision.config import VisionConfig
from easyvideor1.vision.sampling import num_frames, video_frame_budget, video_size

WRAPPER_TOKENS = 2  # <|vision_start|> ... <|vision_end|> around every image and video
TIMESTAMP_TOKENS = 12  # "<1234567.5 seconds>": "<", 7 + 1 digits, ".", " seconds", ">" (Qwen's digits split)


@dataclass(frozen=True)
class VideoBound:
    """The largest video a vision section admits."""

    tokens: int
    """Its prompt tokens: vision tokens plus the text the processor wraps them in."""
    frames: int
    """Frames sampled where that maximum is reached (the fewest such)."""
    frame_pixels: int
    """H*W cap of each of those frames (`sampling.video_frame_budget`)."""
    vision_tokens: int
    """Of `tokens`, the merged vision tokens alone (the vision tower's output; `plan` sizes its rows by them)."""


def patch_tokens(max_pixels: float, factor: int) -> int:
    """Most merged tokens of one frame (one temporal patch) resized under `max_pixels`."""
    return max(1, math.floor(max_pixels / (factor * factor)))


def _video_tokens(patches: int, per_patch: int, cfg: VisionConfig) -> int:
    extra = 2 + TIMESTAMP_TOKENS if get_family(cfg.family).timestamps == "frame_text" else 0
    return WRAPPER_TOKENS + patches * (per_patch + extra)


def largest_video(cfg: VisionConfig) -> VideoBound:
    """The most tokens one video can take under `cfg`, over every frame count the sampler picks."""
    family = get_family(cfg.family)
    tp, factor = family.temporal_patch_size, family.grid_factor
    best = VideoBound(0, 0, 0, 0)
    for n in range(tp, max(tp, cfg.max_frames // tp * tp) + 1, tp):
        budget = video_frame_budget(n, cfg)
        per_patch = patch_tokens(budget, factor)
        tokens = _video_tokens(n // tp, per_patch, cfg)
        if tokens > best.tokens:
            best = VideoBound(tokens, n, int(budget), n // tp * per_patch)
    return best


def image_tokens(cfg: VisionConfig) -> int:
    """The most tokens one image can take under `cfg`."""
    return WRAPPER_TOKENS + patch_tokens(cfg.image_max_pixels, get_family(cfg.family).grid_factor)


def prompt_vision_tokens(cfg: VisionConfig, videos: int, images: int) -> int:
    """The most tokens `videos` videos and `images` images take in one prompt under `cfg`."""
    return (videos and videos * largest_video(cfg).tokens) + (images and images * image_tokens(cfg))


def clip_tokens(cfg: VisionConfig, seconds: float, height: int, width: int, video_fps: float = 30.0) -> int:
    """The tokens the sampler gives a whole `seconds`-long `height` x `width` clip (what `plan`
    counts for a typical video; `largest_video` is the bound over every clip)."""
    family = get_family(cfg.family)
    frames = max(1, round(seconds * video_fps))
    n = num_frames(frames, video_fps, cfg.fps, cfg.min_frames, cfg.max_frames, family.temporal_patch_size)
    h, w = video_size(height, width, n, cfg)
    return _video_tokens(n // family.temporal_patch_size, (h // family.grid_factor) * (w // family.grid_factor), cfg)


def largest_fitting(lo: int, hi: int, fits: Callable[[int], bool]) -> int | None:
    """The largest value in [lo, hi] for which `fits` holds (`fits` non-increasing in the value:
    true up to some point, false after), or None when even `lo` does not fit."""
    if not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo
