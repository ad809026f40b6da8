"""Writing videos with PyAV: the synthetic data generator, the tests and the benchmarks use it.

The container follows the file suffix, each with the codec it is usually found with:
.mp4 -> H.264, .mkv -> H.264, .webm -> VP9, .avi -> MPEG-4 part 2, .mov -> H.264.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import numpy as np

# suffix -> (codec, pixel format). H.264 in yuv420p is what real datasets mostly hold.
CODECS: dict[str, tuple[str, str]] = {
    ".mp4": ("libx264", "yuv420p"),
    ".mkv": ("libx264", "yuv420p"),
    ".mov": ("libx264", "yuv420p"),
    ".webm": ("libvpx-vp9", "yuv420p"),
    ".avi": ("mpeg4", "yuv420p"),
}


def write_video(
    path: str | os.PathLike,
    frames: np.ndarray,
    fps: float,
    codec: str | None = None,
    crf: int = 23,
    gop: int | None = None,
) -> Path:
    """Encode `frames` ([T, H, W, 3] uint8 RGB) to `path`; codec chosen by suffix unless given.

    H and W are padded to even sizes (yuv420p needs them) by repeating the last row/column.
    `gop` sets the keyframe interval (None: the encoder's default, 250 for x264). The file is
    written to a temporary name first and renamed, so a reader never sees half a video.
    """
    path = Path(path)
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"write_video({path}): frames must be [T, H, W, 3] uint8, got "
                         f"{frames.dtype} {tuple(frames.shape)}")
    if len(frames) == 0:
        raise ValueError(f"write_video({path}): no frames to write")
    suffix = path.suffix.lower()
    if codec is None and suffix not in CODECS:
        raise ValueError(f"write_video({path}): unknown suffix {suffix!r}; use one of "
                         f"{', '.join(CODECS)} or pass codec=")
    codec_name, pix_fmt = CODECS.get(suffix, (codec, "yuv420p"))
    codec_name = codec or codec_name
    h, w = frames.shape[1:3]
    if h % 2 or w % 2:
        frames = np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}{suffix}")
    rate = Fraction(fps).limit_denominator(1001)
    with av.open(str(tmp), mode="w", format=_FORMATS.get(suffix)) as container:
        stream = container.add_stream(codec_name, rate=rate)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = pix_fmt
        options = {}
        if codec_name in ("libx264", "libx265"):
            options["crf"] = str(crf)
        if codec_name == "libvpx-vp9":
            options.update({"crf": str(crf + 8), "b": "0", "deadline": "realtime", "cpu-used": "8"})
        if codec_name == "mpeg4":
            stream.bit_rate = 2_000_000
        stream.options = options
        if gop is not None:
            stream.codec_context.gop_size = gop
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    os.replace(tmp, path)
    return path


# Suffixes whose container PyAV cannot infer from the temporary name's suffix alone.
_FORMATS = {".mkv": "matroska", ".webm": "webm", ".mp4": "mp4", ".mov": "mov", ".avi": "avi"}
