"""Frame and sample makers for the model tests: random uint8 frames of grid-multiple size with
hand-built VideoMetadata, so these tests do not depend on the decoders."""

from __future__ import annotations

import torch

from easyvideor1.models.families import Family
from easyvideor1.records import Frames, Sample, VideoMetadata


def make_video(
    family: Family, frames: int = 4, rows: int = 2, cols: int = 2, fps: float = 2.0, step: int = 1, seed: int = 0
) -> Frames:
    """Random video of `frames` frames, rows x cols grid cells, sampled every `step` source frames."""
    g = torch.Generator().manual_seed(seed)
    f = family.grid_factor
    pixels = torch.randint(0, 256, (frames, 3, rows * f, cols * f), dtype=torch.uint8, generator=g)
    indices = [i * step for i in range(frames)]
    total = indices[-1] + 1
    meta = VideoMetadata(fps, total, indices, cols * f, rows * f, total / fps, backend="torchcodec")
    return Frames(pixels, meta, source=f"video{seed}.mp4")


def make_image(family: Family, rows: int = 1, cols: int = 2, seed: int = 100) -> Frames:
    """Random image (T=1, no metadata) of rows x cols grid cells."""
    g = torch.Generator().manual_seed(seed)
    f = family.grid_factor
    pixels = torch.randint(0, 256, (1, 3, rows * f, cols * f), dtype=torch.uint8, generator=g)
    return Frames(pixels, None, source=f"image{seed}.png")


def make_sample(sample_id: str, frames: list[Frames]) -> Sample:
    """A sample listing the media of `frames`."""
    videos = [fr.source for fr in frames if fr.metadata is not None]
    images = [fr.source for fr in frames if fr.metadata is None]
    kind = "video" if videos else "image" if images else "text"
    return Sample("q", "a", "free-form", kind, videos=videos, images=images, problem_id=sample_id)
