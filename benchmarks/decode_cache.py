"""Decode and cache speed, side by side in one run (best of --repeat; see the issue's targets).

1. one process decode+sample+resize (easyvideor1) vs qwen_vl_utils.fetch_video, same frames out
2. loading one cache entry vs decoding the clip
3. cache build with 1 vs 2 worker processes over --clips clips
4. cache bytes per clip vs the float32 tensor of the same frames

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/decode_cache.py [--seconds 60] [--clips 8]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: timings swing without it

import argparse
import dataclasses
import logging
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from easyvideor1.records import Sample
from easyvideor1.vision.cache import FrameSource, entry_path, read_entry
from easyvideor1.vision.cache_build import build_cache
from easyvideor1.vision.config import VisionConfig
from easyvideor1.vision.decode import decode_video
from easyvideor1.vision.encode import write_video


def make_clip(path: Path, seconds: float, fps: float = 30.0, height: int = 360, width: int = 640) -> None:
    """A textured background panning under three moving shapes: real motion, real residuals."""
    rng = np.random.default_rng(0)
    texture = rng.integers(0, 256, (height // 8, width // 8 + 64, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
    frames = np.empty((int(seconds * fps), height, width, 3), np.uint8)
    for t in range(len(frames)):
        frame = texture[:, (t * 2) % 512:(t * 2) % 512 + width].copy()
        for k, colour in enumerate([(255, 40, 40), (40, 255, 40), (40, 40, 255)]):
            x = int((t * (2 + k)) % (width - 60))
            y = int(height / 2 + (height / 3) * np.sin(t / (20 + 7 * k)) - 30)
            frame[y:y + 60, x:x + 60] = colour
        frames[t] = frame
    write_video(path, frames, fps)


def best_of(fn, repeat: int) -> tuple[float, object]:
    """Fastest wall time of `repeat` calls, and the last result."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def bench_decode(clip: Path, cfg: VisionConfig, repeat: int, threads: int) -> list[str]:
    """1. our decode vs qwen-vl-utils' fetch_video with the same frame count and size."""
    from qwen_vl_utils import vision_process as qv

    torch.set_num_threads(threads)
    os.environ["TORCHCODEC_NUM_THREADS"] = str(threads)
    ours_cfg = dataclasses.replace(cfg, decode_threads=threads)
    ele = {"video": str(clip), "fps": cfg.fps, "min_frames": cfg.min_frames, "max_frames": cfg.max_frames,
           "min_pixels": cfg.video_min_pixels, "max_pixels": cfg.video_max_pixels,
           "total_pixels": cfg.video_total_pixels}
    logging.getLogger(qv.__name__).setLevel(logging.ERROR)  # it warns that total_pixels caps max_pixels
    qv.fetch_video(ele)  # warm-up (imports, backend choice)
    t_ours, ours = best_of(lambda: decode_video(clip, ours_cfg), repeat)
    t_ref, ref = best_of(lambda: qv.fetch_video(ele), repeat)
    assert tuple(ref.shape) == tuple(ours.pixels.shape), (ref.shape, ours.pixels.shape)
    diff = (ref - ours.pixels.float()).abs()
    speed = (f"   easyvideor1 {t_ours * 1e3:7.0f} ms (uint8, {ours.pixels.numel() / 2**20:.0f} MiB)   "
             f"qwen_vl_utils.fetch_video {t_ref * 1e3:7.0f} ms (float32, {ref.numel() * 4 / 2**20:.0f} MiB)   "
             f"ratio {t_ref / t_ours:.2f}x  (target >= 2x)")
    pixels = (f"   pixels vs fetch_video: max |diff| {diff.max():.0f}, mean {diff.mean():.3f} "
              "(torchvision v1 resizes uint8 via float; ours equals torchvision v2 / HF processors)")
    return [f"1. decode+sample+resize ({threads} thread(s)), {tuple(ours.pixels.shape)}:", speed, pixels]


def bench_cache(clips: list[Path], cfg: VisionConfig, work: Path, repeat: int) -> list[str]:
    """2-4. entry load vs decode, build with 1 vs 2 workers, bytes per clip."""
    samples = [Sample("q", "a", "numerical", "video", videos=[str(c)], problem_id=str(i)) for i, c in enumerate(clips)]
    times = {}
    for workers in (1, 2):
        best = float("inf")
        for r in range(repeat):
            out = work / f"cache_w{workers}_{r}"
            report = build_cache(samples, cfg, out, workers=workers, progress=False)
            assert report.built == len(clips) and report.failed_samples == 0
            best = min(best, report.seconds)
        times[workers] = best
    cache = work / f"cache_w2_{repeat - 1}"
    cached, realtime = FrameSource(cfg, cache, "cache_only"), FrameSource(cfg, None, "realtime")
    torch.set_num_threads(1)
    t_load, frames = best_of(lambda: cached.video(str(clips[0])), repeat)
    t_touch, _ = best_of(lambda: cached.video(str(clips[0])).pixels.clone(), repeat)
    t_decode, decoded = best_of(lambda: realtime.video(str(clips[0])), repeat)
    assert torch.equal(frames.pixels, decoded.pixels)
    entry = entry_path(cache, frames.cache_key)
    read_entry(entry)  # checks it
    nbytes, f32 = entry.stat().st_size, frames.pixels.numel() * 4
    load = (f"2. one entry: load {t_load * 1e3:.2f} ms (memory-mapped), load+copy {t_touch * 1e3:.1f} ms, "
            f"decode {t_decode * 1e3:.0f} ms   ratio decode/load {t_decode / t_load:.0f}x, "
            f"decode/(load+copy) {t_decode / t_touch:.1f}x")
    build = (f"3. cache build, {len(clips)} clips: 1 worker {times[1]:.2f} s, 2 workers {times[2]:.2f} s   "
             f"ratio {times[1] / times[2]:.2f}x  (target >= 1.8x; {os.cpu_count()} CPUs)")
    size = (f"4. bytes per clip: cache {nbytes / 2**20:.2f} MiB vs float32 {f32 / 2**20:.2f} MiB   "
            f"ratio {f32 / nbytes:.5f}x  (target >= 4x; uint8 vs float32 is 4x less the entry header)")
    return [load, build, size]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="clip length (640x360, 30 fps)")
    parser.add_argument("--clips", type=int, default=8, help="clips for the build comparison")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--family", default="qwen2_5_vl")
    parser.add_argument("--workdir", help="where to write clips and caches (default: a temporary dir)")
    args = parser.parse_args()
    cfg = VisionConfig(family=args.family, fps=2.0, max_frames=128)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="easyvideor1-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    clip = work / "clip.mp4"
    if not clip.exists():
        t0 = time.perf_counter()
        make_clip(clip, args.seconds)
        print(f"made {clip} ({args.seconds:g} s, 640x360, 30 fps) in {time.perf_counter() - t0:.1f} s")
    # copies: same decode cost, distinct files (the key holds path, size and mtime)
    clips = [clip] + [Path(shutil.copy(clip, work / f"clip{i}.mp4")) for i in range(1, args.clips)]
    print(f"family {cfg.family}, {cfg.fps:g} fps, <= {cfg.max_frames} frames, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs")
    lines = bench_decode(clip, cfg, args.repeat, threads=1)
    lines += bench_decode(clip, cfg, args.repeat, threads=os.cpu_count() or 1)[:2]
    lines += bench_cache(clips, cfg, work, args.repeat)
    print("\n".join(lines))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
