"""Which frames to take and what size to give them: pure functions on numbers, no pixels.

Follows qwen-vl-utils (`smart_nframes`, `calculate_video_frame_range`, `smart_resize`), the
reference the Qwen-VL papers and EasyVideoR1 use. Departures:
- a clip shorter than one temporal patch (e.g. a 1-frame video) is not an error: its frames
  are repeated up to `temporal_patch_size` (what the processors do when they pad);
- for families whose video budget counts all frames (Qwen3-VL, Qwen3.5, as their HF video
  processors do) `video_total_pixels` bounds T*H*W; for the others (Qwen2/2.5-VL) it bounds
  H*W summed over temporal patches, T/temporal_patch_size*H*W, as qwen-vl-utils does;
- the downscale branch of `smart_resize` never goes below one grid cell per side (HF's guard);
- `smart_resize` never exceeds `max_pixels` (when it allows one grid cell): where Qwen's rounding
  would (a frame so narrow that its short side is held at one cell, or a small frame whose sides
  both round up past a budget close to `min_pixels`), the long side, then the short one, is cut
  to fit. Only such frames differ from qwen-vl-utils; the budget check (`vision.budget`) relies
  on the bound.
"""

from __future__ import annotations

import math

import numpy as np

from easyvideor1.models.families import get_family
from easyvideor1.vision.config import VisionConfig

MAX_ASPECT_RATIO = 200  # Qwen's limit: longer sides make the vision tower's grid degenerate


def frame_range(total_frames: int, video_fps: float, start: float | None = None,
                end: float | None = None) -> tuple[int, int]:
    """First and last source frame (inclusive) of the clip [start, end] seconds.

    Bounds are clamped to the video; `start` rounds up and `end` rounds down to a frame.
    Raises ValueError when the segment holds no frame.
    """
    if total_frames <= 0 or video_fps <= 0:
        raise ValueError(f"video has {total_frames} frames at {video_fps} fps: nothing to sample")
    if start is None and end is None:
        return 0, total_frames - 1
    duration = total_frames / video_fps
    first = math.ceil(max(0.0, min(start, duration)) * video_fps) if start is not None else 0
    last = total_frames - 1
    if end is not None:
        last = min(math.floor(max(0.0, min(end, duration)) * video_fps), total_frames - 1)
    if first > last:
        raise ValueError(f"clip segment start={start}s end={end}s holds no frame of a "
                         f"{duration:.2f}s video ({total_frames} frames at {video_fps:g} fps)")
    return first, last


def num_frames(clip_frames: int, video_fps: float, fps: float, min_frames: int, max_frames: int,
               temporal_patch_size: int) -> int:
    """How many frames to sample from a clip of `clip_frames` source frames.

    clip duration * fps, clamped to [min_frames, max_frames] and to the clip's own frame
    count, then floored to a multiple of `temporal_patch_size` (never below one patch).
    """
    tp = temporal_patch_size
    lo = math.ceil(min_frames / tp) * tp
    hi = math.floor(min(max_frames, clip_frames) / tp) * tp
    n = clip_frames / video_fps * fps
    n = min(max(n, lo), hi, clip_frames)
    return max(tp, math.floor(n / tp) * tp)


def frame_indices(total_frames: int, video_fps: float, cfg: VisionConfig, start: float | None = None,
                  end: float | None = None) -> list[int]:
    """Source frame indices to decode: `num_frames` spread evenly over [start, end] (both ends
    included, rounded half to even like `torch.linspace(...).round()`)."""
    first, last = frame_range(total_frames, video_fps, start, end)
    tp = get_family(cfg.family).temporal_patch_size
    n = num_frames(last - first + 1, video_fps, cfg.fps, cfg.min_frames, cfg.max_frames, tp)
    return [int(i) for i in np.round(np.linspace(first, last, n))]


def smart_resize(height: int, width: int, factor: int, min_pixels: float,
                 max_pixels: float) -> tuple[int, int]:
    """(H, W) multiples of `factor`, closest to the input aspect ratio, with
    min_pixels <= H*W <= max_pixels (when the range allows a multiple of `factor`; where it does
    not, H*W <= max_pixels wins)."""
    if min(height, width) <= 0:
        raise ValueError(f"cannot resize a {height}x{width} frame")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio of a {height}x{width} frame exceeds {MAX_ASPECT_RATIO}; "
                         "crop or pad the media")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    if h * w > max_pixels >= factor * factor:  # see the module docstring: the budget is a bound
        long, short = (h, w) if h >= w else (w, h)
        long = max(factor, math.floor(max_pixels / short / factor) * factor)
        short = min(short, math.floor(max_pixels / long / factor) * factor)
        h, w = (long, short) if h >= w else (short, long)
    return h, w


def video_frame_budget(n_frames: int, cfg: VisionConfig) -> float:
    """Largest H*W allowed for each of `n_frames` frames (see the module docstring)."""
    family = get_family(cfg.family)
    share = cfg.video_total_pixels / n_frames
    if not family.video_budget_is_total:
        share *= family.temporal_patch_size
    return max(min(cfg.video_max_pixels, share), int(cfg.video_min_pixels * 1.05))


def video_size(height: int, width: int, n_frames: int, cfg: VisionConfig) -> tuple[int, int]:
    """Target (H, W) of the frames of a `height`x`width` video sampled to `n_frames` frames."""
    factor = get_family(cfg.family).grid_factor
    return smart_resize(height, width, factor, cfg.video_min_pixels, video_frame_budget(n_frames, cfg))


def image_size(height: int, width: int, cfg: VisionConfig) -> tuple[int, int]:
    """Target (H, W) of a `height`x`width` image."""
    factor = get_family(cfg.family).grid_factor
    return smart_resize(height, width, factor, cfg.image_min_pixels, cfg.image_max_pixels)
