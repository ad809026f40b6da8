"""The built-in video tools: `crop_video` (more frames of a time window) and `zoom_frame` (one
frame's region at a higher pixel budget), and `ClipSource`, which serves them frames.

Frames come from the prompt's own frames (the frame cache's entry, or what the prompt stage
decoded) when those already hold as many frames of the window as asked; otherwise the clip is
decoded once and remembered, so the other responses of the group (which tend to ask for the
same window) reuse it. A clip keeps the prompt's frame size: a call buys frames, not pixels;
`zoom_frame` buys pixels. Both stay within the visual-token budget the loop hands them.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import replace

import numpy as np
import torch

from easyvideor1.records import Frames
from easyvideor1.rollout.tools.protocol import Tool, ToolContext, ToolError, ToolOutput
from easyvideor1.vision.config import VisionConfig
from easyvideor1.vision.decode import MediaError, decode_video
from easyvideor1.vision.resize import resize_uint8
from easyvideor1.vision.sampling import frame_range


class ClipSource:
    """Clips and single frames of sample videos, each decoded once per run (bounded memory)."""

    def __init__(self, vision: VisionConfig, max_entries: int = 64):
        """`vision`: the run's frame settings (family, decoder); `max_entries`: clips remembered."""
        self.vision = vision
        self.max_entries = max_entries
        self._memo: OrderedDict[tuple, Frames] = OrderedDict()
        self.decoded = self.reused = self.from_prompt = 0

    def _remember(self, key: tuple, make) -> Frames:
        if key in self._memo:
            self._memo.move_to_end(key)
            self.reused += 1
            return self._memo[key]
        value = make()
        self._memo[key] = value
        if len(self._memo) > self.max_entries:
            self._memo.popitem(last=False)
        return value

    def clip(self, prompt_frames: Frames, start: float, end: float, n: int) -> Frames:
        """`n` frames spread over [start, end] s at the prompt frames' size, with metadata."""
        _, _, h, w = prompt_frames.pixels.shape
        key = ("clip", prompt_frames.source, start, end, n, h, w)
        return self._remember(key, lambda: self._clip(prompt_frames, start, end, n))

    def _clip(self, prompt_frames: Frames, start: float, end: float, n: int) -> Frames:
        meta = prompt_frames.metadata
        inside = [k for k, i in enumerate(meta.frames_indices) if start - 1e-9 <= i / meta.fps <= end + 1e-9]
        if len(inside) >= n:  # the prompt's frames (cache) already hold them
            self.from_prompt += 1
            pick = [inside[int(k)] for k in np.round(np.linspace(0, len(inside) - 1, n))]
            indices = [meta.frames_indices[k] for k in pick]
            return Frames(prompt_frames.pixels[pick], replace(meta, frames_indices=indices),
                          source=prompt_frames.source, cache_key=prompt_frames.cache_key)
        _, _, h, w = prompt_frames.pixels.shape
        v = self.vision
        cfg = replace(v, fps=n / (end - start), min_frames=n, max_frames=n,
                      video_min_pixels=min(v.video_min_pixels, h * w), video_max_pixels=h * w,
                      video_total_pixels=max(v.video_total_pixels, n * h * w))
        frames = self._decode(prompt_frames.source, cfg, start, end)
        return replace(frames, pixels=resize_uint8(frames.pixels, (h, w)))

    def frame(self, prompt_frames: Frames, time: float) -> torch.Tensor:
        """The source frame nearest `time` s, at the source resolution: [3, H, W] uint8."""
        meta = prompt_frames.metadata
        index = min(max(0, round(time * meta.fps)), meta.total_num_frames - 1)
        return self._remember(("frame", prompt_frames.source, index), lambda: self._frame(prompt_frames, index))

    def _frame(self, prompt_frames: Frames, index: int) -> torch.Tensor:
        meta = prompt_frames.metadata
        pixels = max(meta.width * meta.height, 1)
        cfg = replace(self.vision, min_frames=1, max_frames=2, video_min_pixels=1, video_max_pixels=pixels,
                      video_total_pixels=4 * pixels)
        # a quarter frame either side: exactly source frame `index` (both bounds round to it)
        frames = self._decode(prompt_frames.source, cfg, (index - 0.25) / meta.fps, (index + 0.25) / meta.fps)
        return frames.pixels[0]

    def _decode(self, path: str, cfg: VisionConfig, start: float, end: float) -> Frames:
        self.decoded += 1
        try:
            return decode_video(path, cfg, start, end)
        except MediaError as e:
            raise ToolError(f"the video cannot be read ({e.reason})") from e


def _video(ctx: ToolContext) -> Frames:
    videos = [fr for fr in ctx.frames if fr.metadata is not None]
    if not videos:
        raise ToolError("this sample has no video")
    return videos[0]


def _seconds(name: str, value: float, duration: float) -> float:
    if not 0.0 <= value <= duration + 1e-6:
        raise ToolError(f"{name}={value:g} is outside the video (0 to {duration:g} s)")
    return float(value)


def crop_video(ctx: ToolContext, args: dict) -> ToolOutput:
    """Frames of [start, end] s at a higher rate: `fps` when given, else as many as the budget
    allows (never more than the window's source frames)."""
    video = _video(ctx)
    meta = video.metadata
    start, end = _seconds("start", args["start"], meta.duration), _seconds("end", args["end"], meta.duration)
    if not start < end:
        raise ToolError(f"start ({start:g}) must be before end ({end:g})")
    fps = args.get("fps")
    if fps is not None and not fps > 0:
        raise ToolError(f"fps must be > 0, got {fps:g}")
    tp, f = ctx.family.temporal_patch_size, ctx.family.grid_factor
    per_patch = (video.pixels.shape[2] // f) * (video.pixels.shape[3] // f)
    most = ctx.visual_tokens // per_patch * tp
    if most < tp:
        raise ToolError(f"over budget: a clip needs at least {per_patch} visual tokens, {ctx.visual_tokens} are left")
    try:
        first, last = frame_range(meta.total_num_frames, meta.fps, start, end)
    except ValueError:
        raise ToolError(f"the window {start:g}-{end:g} s holds no frame") from None
    n = min(most, max(tp, (last - first + 1) // tp * tp))
    if fps is not None:
        n = min(n, max(tp, math.ceil((end - start) * fps / tp) * tp))
    clip = ctx.clips.clip(video, start, end, n)
    times = ", ".join(f"{i / clip.metadata.fps:.2f}" for i in clip.metadata.frames_indices)
    return ToolOutput(f"{len(clip.metadata.frames_indices)} frames of {start:g}-{end:g} s, at t = {times} s.", [clip])


def zoom_frame(ctx: ToolContext, args: dict) -> ToolOutput:
    """The `box` region (relative [x1, y1, x2, y2]) of the frame at `time` s, resized to fill the
    call's visual-token budget (at most the image pixel budget)."""
    video = _video(ctx)
    meta = video.metadata
    time = _seconds("time", args["time"], meta.duration)
    x1, y1, x2, y2 = (float(v) for v in args["box"])
    if not (0.0 <= x1 < x2 <= 1.0 and 0.0 <= y1 < y2 <= 1.0):
        raise ToolError("box must be [x1, y1, x2, y2] with 0 <= x1 < x2 <= 1 and 0 <= y1 < y2 <= 1")
    full = ctx.clips.frame(video, time)  # [3, H, W]
    height, width = full.shape[1:]
    top, left = min(int(y1 * height), height - 1), min(int(x1 * width), width - 1)
    crop = full[:, top:max(top + 1, round(y2 * height)), left:max(left + 1, round(x2 * width))]
    f = ctx.family.grid_factor
    budget = min(ctx.visual_tokens * f * f, ctx.clips.vision.image_max_pixels)
    scale = math.sqrt(budget / (crop.shape[1] * crop.shape[2]))
    size = (max(f, math.floor(crop.shape[1] * scale / f) * f), max(f, math.floor(crop.shape[2] * scale / f) * f))
    if size[0] * size[1] // (f * f) > ctx.visual_tokens:
        raise ToolError(f"over budget: a zoomed frame needs at least {size[0] * size[1] // (f * f)} visual tokens, "
                        f"{ctx.visual_tokens} are left")
    image = resize_uint8(crop[None].contiguous(), size)
    return ToolOutput(f"The frame at t = {round(time * meta.fps) / meta.fps:.2f} s, region "
                      f"[{x1:g}, {y1:g}, {x2:g}, {y2:g}], at {size[1]}x{size[0]} pixels.",
                      [Frames(image, None, source=video.source)])


CROP_VIDEO = Tool(
    name="crop_video",
    description="Look again at part of the video: frames of [start, end] seconds at a higher frame rate, "
                "with their timestamps.",
    parameters={"type": "object", "properties": {
        "start": {"type": "number", "description": "Start of the window, seconds."},
        "end": {"type": "number", "description": "End of the window, seconds."},
        "fps": {"type": "number", "description": "Frames per second (default: as many as the budget allows)."}},
        "required": ["start", "end"]},
    fn=crop_video,
)
ZOOM_FRAME = Tool(
    name="zoom_frame",
    description="Look closely at one frame: the region `box` (relative x1, y1, x2, y2 in 0-1) of the frame "
                "at `time` seconds, at a higher resolution.",
    parameters={"type": "object", "properties": {
        "time": {"type": "number", "description": "Time of the frame, seconds."},
        "box": {"type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4,
                "description": "Region [x1, y1, x2, y2], relative to the frame's width and height."}},
        "required": ["time", "box"]},
    fn=zoom_frame,
)
