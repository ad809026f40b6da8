"""Decoding real files: backends agree, the right frames come out, failures are named."""

from __future__ import annotations

import dataclasses

import av
import numpy as np
import pytest
import torch
from vision_media import VIDEO_SPECS

from easyvideor1.vision.config import VisionConfig
from easyvideor1.vision.decode import ImageDecodeError, VideoDecodeError, decode_image, decode_video
from easyvideor1.vision.resize import resize_uint8
from easyvideor1.vision.sampling import frame_indices, video_size

CFG = VisionConfig(min_frames=4, max_frames=16, fps=4.0)

try:  # torchcodec is optional (the `decode` extra; absent on the GPU machine's image)
    import torchcodec  # noqa: F401

    BACKENDS = ("torchcodec", "pyav")
    NO_TORCHCODEC = ""
except ImportError as e:  # PyAV alone: its checks still run; the agreement test then reports a skip
    BACKENDS = ("pyav",)
    NO_TORCHCODEC = f"torchcodec cannot be imported ({(str(e) or type(e).__name__).splitlines()[0]})"


def _all_frames_pyav(path) -> torch.Tensor:
    with av.open(str(path)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)  # [N, 3, H, W]


@pytest.mark.parametrize("spec", VIDEO_SPECS, ids=lambda s: s.name)
def test_backends_agree_and_pick_the_sampled_frames(media_dir, spec):
    path = media_dir / spec.name
    first, *others = [decode_video(path, dataclasses.replace(CFG, backend=b)) for b in BACKENDS]
    for other in others:
        assert torch.equal(first.pixels, other.pixels)
        assert dataclasses.replace(first.metadata, backend="") == dataclasses.replace(other.metadata, backend="")
    meta = first.metadata
    assert meta.total_num_frames == spec.frames
    assert meta.fps == pytest.approx(spec.fps, rel=1e-3)
    assert meta.duration == pytest.approx(spec.frames / spec.fps, rel=1e-3)
    # independent reference: decode every frame, take the planned indices, resize
    everything = _all_frames_pyav(path)
    indices = frame_indices(spec.frames, meta.fps, CFG)
    assert meta.frames_indices == indices
    expected = resize_uint8(everything[indices], video_size(*everything.shape[2:], len(indices), CFG))
    assert torch.equal(first.pixels, expected)
    assert first.pixels.dtype == torch.uint8 and first.pixels.shape[2] % 28 == 0 and first.pixels.shape[3] % 28 == 0
    hf = meta.to_hf()
    assert hf["frames_indices"] == indices and hf["total_num_frames"] == spec.frames
    if NO_TORCHCODEC:  # PyAV passed the checks above; the agreement half had nothing to compare
        pytest.skip(f"{NO_TORCHCODEC}: PyAV checked alone, backend agreement not checked")


def test_segment_and_seeking(media_dir):
    """A clip segment of a video with many keyframes: both backends, against the full decode."""
    path = media_dir / "seek.mp4"  # 150 frames at 30 fps, keyframe every 12
    everything = _all_frames_pyav(path)
    for backend in BACKENDS:
        cfg = dataclasses.replace(CFG, backend=backend)
        frames = decode_video(path, cfg, start=2.0, end=4.5)
        # frames 60..135 (76 frames, 2.53 s * 4 fps = 10.1 -> 10): linspace(60, 135, 10)
        assert frames.metadata.frames_indices == [60, 68, 77, 85, 93, 102, 110, 118, 127, 135]
        idx = frames.metadata.frames_indices
        assert torch.equal(frames.pixels, resize_uint8(everything[idx], tuple(frames.pixels.shape[2:])))
    with pytest.raises(VideoDecodeError, match="seek.mp4") as err:
        decode_video(path, CFG, start=9.0, end=10.0)
    assert err.value.reason == "bad_segment"


def test_family_grid_factor(media_dir):
    frames = decode_video(media_dir / "h264.mp4", dataclasses.replace(CFG, family="qwen3_vl"))
    assert frames.pixels.shape[2] % 32 == 0 and frames.pixels.shape[3] % 32 == 0
    assert frames.pixels.shape[0] % 2 == 0


def test_broken_videos_give_named_errors(media_dir, broken_videos):
    for name, reason in broken_videos.items():
        with pytest.raises(VideoDecodeError) as err:
            decode_video(media_dir / name, CFG)
        assert err.value.reason == reason, (name, str(err.value))
        assert name in str(err.value) and f"[{reason}]" in str(err.value)
    for backend in BACKENDS:  # a single backend still names the file
        for name in broken_videos:
            with pytest.raises(VideoDecodeError, match=name):
                decode_video(media_dir / name, dataclasses.replace(CFG, backend=backend))


def test_images(media_dir, broken_images):
    cfg = VisionConfig(image_min_pixels=28 * 28, image_max_pixels=64 * 28 * 28)
    rgb = decode_image(media_dir / "rgb.png", cfg)
    # 120x200 = 24000 <= 50176: round to 112x196 (4*28, 7*28)
    assert rgb.pixels.shape == (1, 3, 112, 196) and rgb.pixels.dtype == torch.uint8 and rgb.metadata is None
    jpg = decode_image(media_dir / "photo.jpg", cfg)
    assert jpg.pixels.shape == rgb.pixels.shape
    assert (jpg.pixels.int() - rgb.pixels.int()).abs().float().mean() < 4  # same picture, lossy
    alpha = decode_image(media_dir / "alpha.png", cfg)
    # alpha 128 over white: (picture * 128 + 255 * 127) / 255, here after the same resize (which
    # commutes with this blend up to rounding: measured within 1). Dropping the alpha channel
    # (PIL's convert("RGB")) gives the picture itself, up to 127 away where it is dark.
    over_white = (rgb.pixels.int() * 128 + 255 * 127 + 127) // 255
    assert alpha.pixels.shape == rgb.pixels.shape
    assert (alpha.pixels.int() - over_white).abs().max() <= 2
    assert (over_white - rgb.pixels.int()).abs().max() > 100  # the picture has dark parts: the check has teeth
    for name, reason in broken_images.items():
        with pytest.raises(ImageDecodeError, match=name) as err:
            decode_image(media_dir / name, cfg)
        assert err.value.reason == reason
