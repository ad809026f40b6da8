"""`VisionConfig`: how frames are sampled and sized. The trainer embeds it as its `vision` section.

Every field that changes the pixels a model sees is part of the frame-cache key
(`key_params`); the decode backend and its thread count are not, because every backend
yields the same frames (tested).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from easyvideor1.models.families import get_family

BACKENDS = ("auto", "torchcodec", "pyav")
# `easyvideor1 cache` flag of each field that decides the cached pixels (vision/commands.py
# defines the flags; cache.py writes the command that rebuilds a cache from them).
CACHE_FLAGS = {
    "family": "--family", "fps": "--fps", "min_frames": "--min-frames", "max_frames": "--video-max-frames",
    "video_min_pixels": "--video-min-pixels", "video_max_pixels": "--video-max-pixels",
    "video_total_pixels": "--video-total-pixels", "image_min_pixels": "--image-min-pixels",
    "image_max_pixels": "--image-max-pixels",
}
_TOKEN = 28 * 28  # pixels of one merged Qwen2-VL token; defaults below are counted in them


@dataclass
class VisionConfig:
    """Frame sampling and resizing parameters (defaults follow Qwen's own: 2 fps, <= 128 frames)."""

    family: str = "qwen2_5_vl"
    """Model family (`models.families.MODEL_FAMILIES`): sets the grid factor and temporal patch size."""
    fps: float = 2.0
    """Target sampling rate of video frames, frames per second of source time."""
    min_frames: int = 4
    """Fewest frames sampled from a video (rounded up to the temporal patch size)."""
    max_frames: int = 128
    """Most frames sampled from a video (`video_max_frames`; rounded down to the temporal patch size)."""
    video_min_pixels: int = 128 * _TOKEN
    """Lower bound on H*W of each video frame."""
    video_max_pixels: int = 768 * _TOKEN
    """Upper bound on H*W of each video frame."""
    video_total_pixels: int = 24576 * _TOKEN
    """Budget over the whole video (per-family rule: `sampling.video_frame_budget`)."""
    image_min_pixels: int = 4 * _TOKEN
    """Lower bound on H*W of an image."""
    image_max_pixels: int = 1280 * _TOKEN
    """Upper bound on H*W of an image."""
    backend: str = "auto"
    """Video decoder: `torchcodec`, `pyav`, or `auto` (torchcodec, falling back to PyAV)."""
    decode_threads: int = 1
    """FFmpeg threads per decode (0: FFmpeg decides). Keep 1 when many workers decode at once."""

    def __post_init__(self) -> None:
        get_family(self.family)  # unknown names list the known ones
        if self.backend not in BACKENDS:
            raise ValueError(f"vision.backend={self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if not self.fps > 0:
            raise ValueError(f"vision.fps must be > 0, got {self.fps}")
        if not 1 <= self.min_frames <= self.max_frames:
            raise ValueError(f"vision frames: need 1 <= min_frames ({self.min_frames}) <= "
                             f"max_frames ({self.max_frames})")
        for lo, hi in (("video_min_pixels", "video_max_pixels"), ("image_min_pixels", "image_max_pixels")):
            if not 1 <= getattr(self, lo) <= getattr(self, hi):
                raise ValueError(f"vision: need 1 <= {lo} ({getattr(self, lo)}) <= {hi} ({getattr(self, hi)})")
        if self.video_total_pixels < self.video_min_pixels:
            raise ValueError(f"vision.video_total_pixels ({self.video_total_pixels}) is below "
                             f"video_min_pixels ({self.video_min_pixels})")
        if self.decode_threads < 0:
            raise ValueError(f"vision.decode_threads must be >= 0, got {self.decode_threads}")

    def key_params(self) -> dict[str, Any]:
        """Everything that decides the cached pixels: the fields above minus the decoder
        choice, plus the family's grid factor and temporal patch size."""
        family = get_family(self.family)
        params = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name not in ("backend", "decode_threads")}
        params["fps"] = float(params["fps"])
        params["grid_factor"] = family.grid_factor
        params["temporal_patch_size"] = family.temporal_patch_size
        params["video_budget_is_total"] = family.video_budget_is_total
        return params
