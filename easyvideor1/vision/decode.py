"""Media file -> `Frames`: decode only the sampled frames, resize them, attach the metadata.

Videos: torchcodec (seeks to the sampled frames; converts only those to RGB), PyAV as the
fallback (decodes from the start, converts only the sampled frames). Both return identical
RGB frames (tests/vision/test_decode.py). Images: PIL. Every failure is a `MediaError`
naming the file, a short reason code (`REASONS`) and what to do.

Departure from qwen-vl-utils: the metadata's `duration` is total_num_frames / fps (the
same for every backend) rather than the container's own duration field.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from easyvideor1.records import Frames, VideoMetadata
from easyvideor1.vision.config import VisionConfig
from easyvideor1.vision.resize import resize_uint8
from easyvideor1.vision.sampling import frame_indices, image_size, video_size

log = logging.getLogger(__name__)

# reason code -> what it means and what to do
REASONS: dict[str, str] = {
    "missing": "file not found; check the path in the data file and --data-root",
    "unreadable": "file exists but cannot be read; check its permissions",
    "empty": "file has zero bytes; re-download or re-generate it",
    "not_a_video": "no video stream found (not a video, or a truncated/damaged container); "
                   "re-encode it or drop the sample",
    "no_frames": "the video stream holds no frames; re-encode it or drop the sample",
    "corrupt": "decoding failed part-way (damaged or truncated data); re-encode it or drop the sample",
    "bad_segment": "the sample's video_start/video_end select no frame of this video; fix the bounds",
    "not_an_image": "not an image PIL can read; convert it (PNG/JPEG) or drop the sample",
}


class MediaError(RuntimeError):
    """A media file that cannot be turned into frames: `path`, `reason` (a key of REASONS), `detail`."""

    kind = "media"

    def __init__(self, path: str, reason: str, detail: str = ""):
        self.path, self.reason, self.detail = str(path), reason, detail
        extra = f" ({detail})" if detail else ""
        super().__init__(f"cannot decode {self.kind} {self.path}: [{reason}] {REASONS[reason]}{extra}")


class VideoDecodeError(MediaError):
    """A video that cannot be decoded."""

    kind = "video"


class ImageDecodeError(MediaError):
    """An image that cannot be decoded."""

    kind = "image"


def _check_file(path: str, error: type[MediaError]) -> None:
    if not os.path.exists(path):
        raise error(path, "missing")
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise error(path, "unreadable")
    if os.path.getsize(path) == 0:
        raise error(path, "empty")


@dataclass
class _Opened:
    """An open video: its stream facts and a function reading frames [T, 3, H, W] uint8 by index."""

    fps: float
    total_frames: int
    width: int
    height: int
    read: Callable[[list[int]], torch.Tensor]
    close: Callable[[], None]
    backend: str


def _open_torchcodec(path: str, threads: int) -> _Opened:
    from torchcodec.decoders import VideoDecoder

    decoder = VideoDecoder(path, num_ffmpeg_threads=threads, seek_mode="exact", dimension_order="NCHW")
    meta = decoder.metadata
    return _Opened(float(meta.average_fps or 0.0), int(meta.num_frames or 0), meta.width, meta.height,
                   lambda idx: decoder.get_frames_at(indices=idx).data, lambda: None, "torchcodec")


def _open_pyav(path: str, threads: int) -> _Opened:
    import av

    container = av.open(path)
    try:
        if not container.streams.video:
            raise _NoVideoStream("the file has no video stream")
        stream = container.streams.video[0]
        # Count packets, not the header's `frames` (0 in Matroska/WebM): torchcodec's exact
        # mode counts the same way, so both backends agree on the indices.
        total = sum(1 for p in container.demux(stream) if p.size > 0)
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    except BaseException:
        container.close()
        raise
    stream.thread_type = "AUTO"
    stream.thread_count = threads

    def read(indices: list[int]) -> torch.Tensor:
        wanted = set(indices)
        last = max(wanted)
        container.seek(0, stream=stream)
        got: dict[int, np.ndarray] = {}
        for i, frame in enumerate(container.decode(stream)):
            if i in wanted:
                got[i] = frame.to_ndarray(format="rgb24")  # [H, W, 3]
            if i >= last:
                break
        if len(got) < len(wanted):
            first_missing = min(wanted - got.keys())
            raise _ShortStream(f"stream ended before frame {first_missing} of {total}")
        return torch.from_numpy(np.stack([got[i] for i in indices])).permute(0, 3, 1, 2).contiguous()

    return _Opened(float(rate or 0.0), total, stream.width, stream.height, read, container.close, "pyav")


class _NoVideoStream(Exception):
    pass


class _ShortStream(Exception):
    pass


OPENERS: dict[str, Callable[[str, int], _Opened]] = {"torchcodec": _open_torchcodec, "pyav": _open_pyav}


def _decode_with(opener: str, path: str, cfg: VisionConfig, start: float | None,
                 end: float | None) -> Frames:
    """Decode with one backend; raises VideoDecodeError with the reason it failed."""
    try:
        video = OPENERS[opener](path, cfg.decode_threads)
    except ImportError:
        raise
    except Exception as e:
        raise VideoDecodeError(path, "not_a_video", f"{opener}: {_short(e)}") from e
    try:
        if video.total_frames <= 0 or video.fps <= 0:
            raise VideoDecodeError(path, "no_frames", f"{opener}: {video.total_frames} frames at {video.fps} fps")
        try:
            indices = frame_indices(video.total_frames, video.fps, cfg, start, end)
        except ValueError as e:
            raise VideoDecodeError(path, "bad_segment", str(e)) from e
        try:
            pixels = video.read(indices)  # [T, 3, H, W] uint8
        except Exception as e:
            raise VideoDecodeError(path, "corrupt", f"{opener}: {_short(e)}") from e
    finally:
        video.close()
    size = video_size(pixels.shape[2], pixels.shape[3], len(indices), cfg)
    meta = VideoMetadata(fps=video.fps, total_num_frames=video.total_frames, frames_indices=indices,
                         width=video.width, height=video.height,
                         duration=video.total_frames / video.fps, backend=opener)
    return Frames(pixels=resize_uint8(pixels, size), metadata=meta, source=path)


def decode_video(path: str, cfg: VisionConfig, start: float | None = None,
                 end: float | None = None) -> Frames:
    """Sample, decode and resize the frames of the clip [start, end] seconds of `path`.

    Backend `auto` tries torchcodec and falls back to PyAV when torchcodec is not importable
    or fails on this file; the error, when both fail, carries both backends' messages.
    """
    path = str(path)
    _check_file(path, VideoDecodeError)
    if cfg.backend != "auto":
        return _decode_with(cfg.backend, path, cfg, start, end)
    try:
        return _decode_with("torchcodec", path, cfg, start, end)
    except ImportError as e:
        _warn_once(f"torchcodec unavailable ({_short(e)}); decoding with PyAV")
        return _decode_with("pyav", path, cfg, start, end)
    except VideoDecodeError as first:
        if first.reason == "bad_segment":
            raise
        try:
            frames = _decode_with("pyav", path, cfg, start, end)
        except VideoDecodeError as second:
            raise VideoDecodeError(path, second.reason, f"{second.detail}; {first.detail}") from second
        log.warning("torchcodec failed on %s (%s); decoded with PyAV", path, first.detail)
        return frames


def decode_image(path: str, cfg: VisionConfig) -> Frames:
    """Read an image as RGB (transparency composited on white) and resize it: [1, 3, H, W] uint8."""
    from PIL import Image, UnidentifiedImageError

    path = str(path)
    _check_file(path, ImageDecodeError)
    try:
        with Image.open(path) as img:
            if img.mode == "RGBA" or (img.mode == "P" and "transparency" in img.info):
                img = img.convert("RGBA")
                rgb = Image.new("RGB", img.size, (255, 255, 255))
                rgb.paste(img, mask=img.split()[3])
            else:
                rgb = img.convert("RGB")
            array = np.asarray(rgb)
    except UnidentifiedImageError as e:
        raise ImageDecodeError(path, "not_an_image", _short(e)) from e
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageDecodeError(path, "corrupt", _short(e)) from e
    pixels = torch.from_numpy(array.copy()).permute(2, 0, 1).unsqueeze(0)  # [1, 3, H, W]
    try:
        size = image_size(pixels.shape[2], pixels.shape[3], cfg)
    except ValueError as e:
        raise ImageDecodeError(path, "not_an_image", str(e)) from e
    return Frames(pixels=resize_uint8(pixels, size), metadata=None, source=path)


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    return text if len(text) <= 200 else text[:200] + "..."


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def probe_seconds(path: str) -> float:
    """Duration of a video from its container header (no decoding); 0.0 when unknown or unreadable."""
    import av

    try:
        with av.open(str(path)) as container:
            if container.duration is not None:
                return float(container.duration) / av.time_base
            stream = container.streams.video[0]
            if stream.duration is not None and stream.time_base is not None:
                return float(stream.duration * stream.time_base)
    except (av.error.FFmpegError, IndexError, OSError):
        pass
    return 0.0
