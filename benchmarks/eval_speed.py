"""Evaluation speed on a synthetic long-video benchmark, same engine, model and outputs:

(a) vanilla loop: decode on the fly, fixed batches, wait for the whole batch
(b) frame cache + the same synchronous batches
(c) frame cache + the asynchronous pipeline (loading pool ahead of the engine, longest first)

Prints (a)/(c) (target >= 6x; paper: 6-7x on LVBench) and (b)/(c), and checks that (a) and
(c) give identical greedy predictions. Cache building is offline and not timed.

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/eval_speed.py [--clips 16] [--min-s 120] [--max-s 240]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from decode_cache import make_clip

from easyvideor1.data.loading import load_samples
from easyvideor1.evaluation.evaluator import EvalOptions, Evaluator
from easyvideor1.evaluation.settings import DecodingSettings
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.vision.cache_build import build_cache
from easyvideor1.vision.config import VisionConfig

VISION = VisionConfig(family="qwen2_5_vl", fps=2.0, max_frames=64, video_min_pixels=3136, video_max_pixels=12544,
                      image_min_pixels=3136, image_max_pixels=12544)


def run(model, data, out: Path, cache_dir, mode: str, asynchronous: bool) -> tuple[float, dict]:
    shutil.rmtree(out, ignore_errors=True)
    ev = Evaluator(str(model), engine="hf", preset="qwen2_5_vl_greedy", vision=VISION,
                   sampling=DecodingSettings(temperature=0.0, max_new_tokens=16),
                   options=EvalOptions(out_dir=str(out), cache_dir=cache_dir, cache_mode=mode, dtype="float32",
                                       asynchronous=asynchronous, max_batch=8, load_workers=2, prefetch=16))
    t0 = time.perf_counter()
    ev.run([str(data)])
    elapsed = time.perf_counter() - t0
    rows = [json.loads(l) for l in (out / f"file-{data.stem}.jsonl").read_text().splitlines()]
    return elapsed, {r["id"]: r.get("response") for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=16)
    ap.add_argument("--min-s", type=float, default=120.0)
    ap.add_argument("--max-s", type=float, default=240.0)
    ap.add_argument("--source-fps", type=float, default=10.0)
    ap.add_argument("--work", default=None, help="folder for clips, cache and results (default: temp)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = Path(args.work or tempfile.mkdtemp(prefix="eval_speed_"))
    (work / "clips").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(args.clips):
        seconds = float(rng.uniform(args.min_s, args.max_s))
        clip = work / "clips" / f"long{i:02d}.mp4"
        if not clip.exists():
            make_clip(clip, seconds, fps=args.source_fps)
        rows.append({"problem_id": f"q{i}", "problem": "Which colour is the square that moves fastest?",
                     "answer": "C", "problem_type": "multiple choice", "videos": [str(clip)],
                     "options": ["A. red", "B. green", "C. blue", "D. white"]})
    data = work / "bench.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = build_tiny_model("qwen2_5_vl", work / "model", seed=0)
    t0 = time.perf_counter()
    build_cache(load_samples(data), VISION, work / "cache", workers=2, progress=False)
    print(f"{args.clips} clips of {args.min_s:.0f}-{args.max_s:.0f} s 640x360 @ {args.source_fps:g} fps; "
          f"cache built offline in {time.perf_counter() - t0:.1f} s")
    ta, pa = run(model, data, work / "a", None, "realtime", False)
    tb, pb = run(model, data, work / "b", str(work / "cache"), "cache_only", False)
    tc, pc = run(model, data, work / "c", str(work / "cache"), "cache_only", True)
    print(f"(a) vanilla, decode on the fly: {ta:7.2f} s")
    print(f"(b) cache, synchronous batches: {tb:7.2f} s")
    print(f"(c) cache, async pipeline:      {tc:7.2f} s")
    print(f"(a)/(c) = {ta / tc:.1f}x   (target >= 6x)")
    print(f"(b)/(c) = {tb / tc:.2f}x")
    same = pa == pc and pb == pc
    print(f"identical greedy predictions (a) == (b) == (c): {same}")
    if not same:
        raise SystemExit("predictions differ between modes")


if __name__ == "__main__":
    main()
