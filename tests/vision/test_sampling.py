"""Frame selection and resize plans against values worked out by hand (in the comments)."""

from __future__ import annotations

import dataclasses

import pytest

from easyvideor1.vision.config import VisionConfig
from easyvideor1.vision.sampling import (
    frame_indices,
    frame_range,
    image_size,
    num_frames,
    smart_resize,
    video_frame_budget,
    video_size,
)


def test_frame_range_whole_clip_and_segments():
    assert frame_range(300, 30.0) == (0, 299)
    # start 1.0 s -> frame 30; end 2.5 s -> frame 75
    assert frame_range(300, 30.0, 1.0, 2.5) == (30, 75)
    # start rounds up: 1.01 * 30 = 30.3 -> 31; end past the video clamps to the last frame
    assert frame_range(300, 30.0, 1.01, 99.0) == (31, 299)
    assert frame_range(300, 30.0, None, 2.0) == (0, 60)
    with pytest.raises(ValueError, match="holds no frame"):
        frame_range(300, 30.0, 12.0, 20.0)  # starts after the 10 s video ends
    with pytest.raises(ValueError, match="nothing to sample"):
        frame_range(0, 30.0)


@pytest.mark.parametrize("clip, video_fps, fps, lo, hi, expected", [
    (300, 30.0, 2.0, 4, 128, 20),   # 10 s * 2 fps = 20
    (225, 30.0, 2.0, 4, 128, 14),   # 7.5 s * 2 = 15 -> floored to the temporal patch: 14
    (3000, 30.0, 2.0, 4, 128, 128),  # 100 s * 2 = 200 -> max 128
    (3000, 30.0, 2.0, 4, 127, 126),  # max 127 -> floored to 126
    (60, 30.0, 2.0, 5, 128, 6),     # 2 s * 2 = 4 < min 5, which rounds up to 6
    (3, 30.0, 2.0, 4, 128, 2),      # 3 source frames: at most 3 -> floored to 2
    (1, 30.0, 2.0, 4, 128, 2),      # 1 source frame: one temporal patch (frame repeated)
])
def test_num_frames(clip, video_fps, fps, lo, hi, expected):
    assert num_frames(clip, video_fps, fps, lo, hi, temporal_patch_size=2) == expected


def test_frame_indices_spread_over_clip():
    cfg = VisionConfig()
    # 2 s at 30 fps -> 4 frames: linspace(0, 59, 4) = 0, 19.67, 39.33, 59
    assert frame_indices(60, 30.0, cfg) == [0, 20, 39, 59]
    # segment 2 s..4 s = frames 60..120 (61 frames, 4.07 -> 4): linspace(60, 120, 4)
    assert frame_indices(300, 30.0, cfg, 2.0, 4.0) == [60, 80, 100, 120]
    # 1-frame video: the frame twice (one temporal patch)
    assert frame_indices(1, 25.0, cfg) == [0, 0]
    assert frame_indices(1800, 30.0, cfg)[:3] == [0, 15, 30]  # 60 s -> 120 frames


def test_smart_resize_hand_values():
    # within budget: 360/28 = 12.86 -> 13*28 = 364; 640/28 = 22.86 -> 23*28 = 644
    assert smart_resize(360, 640, 28, 100352, 602112) == (364, 644)
    # too big: beta = sqrt(1080*1920 / 448^2) = 1440/448; 1080/beta = 336 = 12*28;
    # 1920/beta = 597.3 -> 21*28 = 588
    assert smart_resize(1080, 1920, 28, 3136, 200704) == (336, 588)
    # too small: beta = sqrt(100352 / 600) = 12.93; 20*beta/28 = 9.24 -> 10*28; 30*beta/28 = 13.86 -> 14*28
    assert smart_resize(20, 30, 28, 100352, 10**7) == (280, 392)
    # factor 32: 360/32 = 11.25 -> 352, 640/32 = 20 -> 640
    assert smart_resize(360, 640, 32, 131072, 10**8) == (352, 640)
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 2500, 28, 3136, 10**7)


def test_video_budget_per_family():
    per_frame, total = VisionConfig(family="qwen2_5_vl"), VisionConfig(family="qwen3_vl")
    # default total 24576*784 = 19267584 over 128 frames: per temporal patch (x2) for Qwen2.5-VL ...
    assert video_frame_budget(128, per_frame) == 301056
    # ... over all frames for Qwen3-VL
    assert video_frame_budget(128, total) == 150528
    # a tiny total never pushes the budget under 1.05 * video_min_pixels = 105369.6 -> 105369
    assert video_frame_budget(128, dataclasses.replace(per_frame, video_total_pixels=100352)) == 105369
    # a large total is capped by the per-frame maximum
    assert video_frame_budget(2, per_frame) == per_frame.video_max_pixels
    # Qwen3-VL 640x360 at 128 frames: 352x640 > 150528, beta = sqrt(230400/150528) = 1.2372;
    # 360/beta = 291 -> 9*32 = 288; 640/beta = 517.3 -> 16*32 = 512
    assert video_size(360, 640, 128, total) == (288, 512)
    assert video_size(360, 640, 128, per_frame) == (364, 644)


def test_image_size():
    cfg = VisionConfig()
    assert image_size(480, 640, cfg) == (476, 644)  # 17*28, 23*28
    # 3000x4000 > 1280*784: beta = sqrt(12e6/1003520) = 3.458; 867.5 -> 30*28; 1156.7 -> 41*28
    assert image_size(3000, 4000, cfg) == (840, 1148)


def test_matches_qwen_vl_utils_where_semantics_agree():
    """Per-frame families follow qwen-vl-utils: same frame counts and sizes on a grid of inputs."""
    vp = pytest.importorskip("qwen_vl_utils.vision_process")
    cfg = VisionConfig(family="qwen2_5_vl", min_frames=4, max_frames=64)
    for total, video_fps in [(300, 30.0), (1799, 29.97), (90, 25.0), (5, 10.0), (4000, 60.0)]:
        ours = num_frames(total, video_fps, cfg.fps, cfg.min_frames, cfg.max_frames, 2)
        theirs = vp.smart_nframes({"fps": cfg.fps, "min_frames": 4, "max_frames": 64}, total, video_fps)
        assert ours == theirs, (total, video_fps)
    for h, w in [(360, 640), (1080, 1920), (37, 1001), (720, 1280), (64, 96)]:
        n = 64
        budget = cfg.video_total_pixels / n * 2
        theirs = vp.smart_resize(h, w, 28, cfg.video_min_pixels,
                                 max(min(cfg.video_max_pixels, budget), int(cfg.video_min_pixels * 1.05)))
        assert video_size(h, w, n, cfg) == theirs, (h, w)


def test_config_validation_and_key_params():
    with pytest.raises(ValueError, match="known: qwen2_vl"):
        VisionConfig(family="qwen9")
    with pytest.raises(ValueError, match="min_frames"):
        VisionConfig(min_frames=8, max_frames=4)
    with pytest.raises(ValueError, match="backend"):
        VisionConfig(backend="decord")
    with pytest.raises(ValueError, match="video_min_pixels"):
        VisionConfig(video_min_pixels=10**7)
    params = VisionConfig(family="qwen3_vl").key_params()
    assert params["grid_factor"] == 32 and params["temporal_patch_size"] == 2
    assert "backend" not in params and "decode_threads" not in params
