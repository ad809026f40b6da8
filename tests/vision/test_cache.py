"""The cache reader and keys: cached frames equal decoded frames; keys move with every input."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest
import torch

from easyvideor1.records import Sample
from easyvideor1.vision.cache import CacheError, CacheMismatchError, FrameSource, entry_key, entry_path, source_identity
from easyvideor1.vision.cache_build import build_cache
from easyvideor1.vision.config import VisionConfig

CFG = VisionConfig(min_frames=4, max_frames=8, fps=3.0, video_max_pixels=56 * 56 * 4, video_min_pixels=56 * 56,
                   image_max_pixels=28 * 28 * 16)


def _samples(media):
    return [
        Sample("what moves?", "A", "multiple choice", "video", videos=[str(media / "h264.mp4")], problem_id="v1"),
        Sample("segment", "1.5", "numerical", "video", videos=[str(media / "seek.mp4"), str(media / "vp9.webm")],
               images=[str(media / "rgb.png")], video_start=1.0, video_end=3.0, problem_id="v2"),
        Sample("picture", "B", "multiple choice", "image", images=[str(media / "alpha.png")], problem_id="i1"),
        Sample("text only", "4", "numerical", "text", problem_id="t1"),
    ]


@pytest.fixture
def cache(media_dir, tmp_path):
    out = tmp_path / "cache"
    report = build_cache(_samples(media_dir), CFG, out, workers=0, progress=False)
    assert report.failed_samples == 0
    return out


def test_cached_frames_equal_decoded_frames(media_dir, cache):
    cached, realtime = FrameSource(CFG, cache, "cache_only"), FrameSource(CFG, None, "realtime")
    for sample in _samples(media_dir):
        got, want = cached.frames_for_sample(sample), realtime.frames_for_sample(sample)
        assert len(got) == len(want) == len(sample.videos) + len(sample.images)
        for g, w in zip(got, want):
            assert torch.equal(g.pixels, w.pixels) and g.pixels.dtype == torch.uint8
            assert g.metadata == w.metadata and g.cache_key is not None and w.cache_key is None
    assert cached.misses == 0 and cached.hits == 5
    seg = cached.frames_for_sample(_samples(media_dir)[1])[0].metadata
    assert seg.frames_indices[0] == 30 and seg.frames_indices[-1] == 90  # 1 s..3 s at 30 fps


def test_every_parameter_and_the_source_move_the_key(media_dir, tmp_path):
    video = tmp_path / "v.mp4"
    shutil.copy(media_dir / "h264.mp4", video)
    source = source_identity(str(video), "video")
    base = entry_key("video", source, CFG.key_params())
    changed = {"family": "qwen3_vl", "fps": 1.0, "min_frames": 2, "max_frames": 6, "video_min_pixels": 1000,
               "video_max_pixels": 20000, "video_total_pixels": 10**6, "image_min_pixels": 100,
               "image_max_pixels": 10**5}
    key_fields = set(CFG.key_params()) - {"grid_factor", "temporal_patch_size", "video_budget_is_total"}
    assert key_fields == set(changed)  # a new VisionConfig field must be added here
    keys = {base}
    for name, value in changed.items():
        keys.add(entry_key("video", source, dataclasses.replace(CFG, **{name: value}).key_params()))
    # family siblings with the same numbers still differ (the name is in the key) ...
    keys.add(entry_key("video", source, dataclasses.replace(CFG, family="qwen2_vl").key_params()))
    keys.add(entry_key("video", source, CFG.key_params(), start=1.0))
    keys.add(entry_key("video", source, CFG.key_params(), end=2.0))
    keys.add(entry_key("image", source, CFG.key_params()))
    assert len(keys) == 1 + len(changed) + 4
    # ... while the decoder choice does not change the pixels, so not the key
    assert entry_key("video", source, dataclasses.replace(CFG, backend="pyav", decode_threads=0).key_params()) == base
    # touching the file (mtime) or rewriting it (size) changes the key
    st = os.stat(video)
    os.utime(video, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert entry_key("video", source_identity(str(video), "video"), CFG.key_params()) != base
    with open(video, "ab") as f:
        f.write(b"\0")
    assert source_identity(str(video), "video")["size"] == st.st_size + 1
    # same size and mtime, other bytes: only the content hash notices
    data = bytearray(video.read_bytes())
    st = os.stat(video)
    hashed = source_identity(str(video), "video", content_hash=True)
    data[-1] = 1
    video.write_bytes(bytes(data))
    os.utime(video, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert source_identity(str(video), "video") == {k: v for k, v in hashed.items() if k != "sha256"}
    assert source_identity(str(video), "video", content_hash=True) != hashed


def test_cache_with_other_parameters_is_refused(cache):
    other = dataclasses.replace(CFG, fps=1.0, family="qwen3_vl")
    for mode in ("prefer_cache", "cache_only"):
        with pytest.raises(CacheMismatchError) as err:
            FrameSource(other, cache, mode)
        text = str(err.value)
        assert "fps: cache has 3.0, config has 1.0" in text
        assert "grid_factor: cache has 28, config has 32" in text and "max_frames" not in text
    FrameSource(other, cache, "realtime")  # realtime ignores the cache
    with pytest.raises(CacheMismatchError, match="fps"):  # nor can a build mix parameters into it
        build_cache([], other, cache, workers=0, progress=False)


def test_modes_on_misses_and_damaged_entries(media_dir, cache, tmp_path, caplog):
    new_video = tmp_path / "new.mp4"
    shutil.copy(media_dir / "h264.mkv", new_video)
    with pytest.raises(CacheError, match="no cache entry for video .*new.mp4"):
        FrameSource(CFG, cache, "cache_only").video(str(new_video))
    prefer = FrameSource(CFG, cache, "prefer_cache")
    assert prefer.video(str(new_video)).pixels.dtype == torch.uint8 and prefer.misses == 1
    with pytest.raises(CacheError, match="holds no frame cache"):
        FrameSource(CFG, tmp_path / "nowhere", "cache_only")
    # damage an entry: prefer_cache decodes instead (with a warning), cache_only names the file
    video = str(media_dir / "h264.mp4")
    key = entry_key("video", source_identity(video, "video"), CFG.key_params())
    entry = entry_path(cache, key)
    entry.write_bytes(entry.read_bytes()[:100])
    want = FrameSource(CFG, None, "realtime").video(video).pixels
    assert torch.equal(FrameSource(CFG, cache, "prefer_cache").video(video).pixels, want)
    assert "is damaged" in caplog.text
    with pytest.raises(CacheError, match=key):
        FrameSource(CFG, cache, "cache_only").video(video)
    # verify finds and rebuilds it
    report = build_cache(_samples(media_dir), CFG, cache, workers=0, verify=True, progress=False)
    assert (report.rebuilt, report.skipped, report.built) == (1, 4, 0)
    assert torch.equal(FrameSource(CFG, cache, "cache_only").video(video).pixels, want)


def test_cache_only_works_without_the_sources(media_dir, tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    for name in ("h264.mp4", "seek.mp4", "vp9.webm", "rgb.png", "alpha.png"):
        shutil.copy2(media_dir / name, media / name)
    samples = _samples(media)
    build_cache(samples, CFG, tmp_path / "cache", workers=0, progress=False)
    want = [f.pixels for f in FrameSource(CFG, None, "realtime").frames_for_sample(samples[1])]
    shutil.rmtree(media)
    got = FrameSource(CFG, tmp_path / "cache", "cache_only").frames_for_sample(samples[1])
    assert all(torch.equal(g.pixels, w) for g, w in zip(got, want))
    index = json.loads((tmp_path / "cache" / "index.json").read_text())
    assert len(index) == 5
