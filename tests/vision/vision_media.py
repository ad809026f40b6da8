"""Real media files for the vision tests, made with our own encoder (see conftest.py).

Videos differ in codec, container, size (odd sizes too), frame rate and length; every frame
has a different picture (a bar moving across a gradient), so a wrong frame index shows up as
different pixels. Broken files cover each failure reason of `decode.REASONS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class VideoSpec:
    name: str
    frames: int
    height: int
    width: int
    fps: float
    gop: int | None = None


VIDEO_SPECS = [
    VideoSpec("h264.mp4", 30, 64, 96, 10.0),
    VideoSpec("h264.mkv", 25, 50, 70, 25.0),
    VideoSpec("vp9.webm", 20, 48, 64, 8.0),
    VideoSpec("mpeg4.avi", 24, 60, 80, 12.0),
    VideoSpec("odd.mov", 31, 65, 33, 29.97),  # odd sides: the encoder pads to 66x34
    VideoSpec("seek.mp4", 150, 90, 160, 30.0, gop=12),  # many keyframes: torchcodec really seeks
]


def moving_bar(frames: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """[T, H, W, 3] uint8: a smooth gradient with a bright bar that moves one step per frame."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 255 // max(width - 1, 1)), (y * 255 // max(height - 1, 1)),
                     np.full_like(x, int(rng.integers(0, 255)))], -1).astype(np.uint8)
    out = np.repeat(base[None], frames, axis=0)
    bar = max(2, width // 8)
    for t in range(frames):
        left = (t * 3) % max(1, width - bar)
        out[t, :, left:left + bar] = (255, 255, 255) if t % 2 else (250, 40, 40)
    return out


def write_broken(root: Path) -> None:
    good = (root / "h264.mp4").read_bytes()
    (root / "empty.mp4").write_bytes(b"")
    (root / "text.mp4").write_text("this is not a video\n" * 20)
    (root / "truncated.mp4").write_bytes(good[: len(good) // 2])  # the index (moov) is at the end
    damaged = bytearray(good)  # container intact, coded data overwritten
    for i in range(len(damaged) // 4, len(damaged) // 2):
        damaged[i] = (i * 7) % 256
    (root / "damaged.mp4").write_bytes(bytes(damaged))
    import av

    with av.open(str(root / "noframes.avi"), "w") as c:  # a video stream without a single frame
        s = c.add_stream("mpeg4", rate=10)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        c.start_encoding()
    png = (root / "rgb.png").read_bytes()
    (root / "truncated.png").write_bytes(png[: len(png) // 2])
    (root / "text.png").write_text("not an image")
