"""Training step time with frames (a) preloaded in memory, (b) from the frame cache,
(c) decoded on the fly: one run, same config, data, seeds and model (paper Figure 3).

Prints the mean step time of each mode and the ratios (b)/(a) (target <= 1.05) and (c)/(b)
(target >= 1.47), and the per-stage times (prepare = frames + processor, rollout, old/ref
log-prob, update). A fourth run, (b) with `training.shared_prefix=false` (one sequence per
response), gives the whole-step ratio of the group-shared prompt.

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/train_step.py [--clips 4] [--seconds 60] [--steps 4]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

from decode_cache import make_clip

from easyvideor1.config import load_config
from easyvideor1.data.loading import load_samples
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.setup import build_run
from easyvideor1.training.trainer import train_step
from easyvideor1.vision.cache import FrameSource
from easyvideor1.vision.cache_build import build_cache


class PreloadedFrames:
    """Mode (a): every sample's frames decoded once up front and kept in memory."""

    def __init__(self, source: FrameSource, samples):
        self.frames = {s.problem_id: source.frames_for_sample(s) for s in samples}

    def frames_for_sample(self, sample):
        return self.frames[sample.problem_id]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--steps", type=int, default=4, help="timed steps per mode (after 1 warm-up step)")
    ap.add_argument("--work", default=None, help="folder for clips and cache (default: a temp dir)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = Path(args.work or tempfile.mkdtemp(prefix="train_step_"))
    (work / "clips").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(args.clips):
        clip = work / "clips" / f"clip{i}.mp4"
        if not clip.exists():
            make_clip(clip, args.seconds)
        rows.append({"problem_id": f"c{i}", "problem": "What colour is the first square?", "answer": "A",
                     "problem_type": "multiple choice", "options": ["A. red", "B. green", "C. blue", "D. white"],
                     "videos": [str(clip)], "offline_output": "<think>red</think><answer>A</answer>"})
    data = work / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = build_tiny_model("qwen2_5_vl", work / "model", seed=0)
    overrides = [f"model.path={model}", f"data.train_files=[{data}]", f"logging.out_dir={work / 'run'}",
                 "model.dtype=float32", "vision.fps=2.0", "vision.max_frames=64", "vision.video_min_pixels=3136",
                 "vision.video_max_pixels=12544", f"training.rollout_batch_size={args.clips}",
                 f"training.mini_batch_size={args.clips}", "training.micro_batch_size=8", "rollout.n=4",
                 "rollout.max_tokens=16", "hybrid.enable=true", "algorithm.disable_kl=true", "logging.progress=false",
                 "checkpoint.resume=never", "data.shuffle=false"]
    cfg = load_config(None, overrides)
    t0 = time.perf_counter()
    build_cache(load_samples(data), cfg.vision, work / "cache", workers=2, progress=False)
    print(f"cache built in {time.perf_counter() - t0:.1f} s (offline, not part of a step)")

    runs = {}
    for mode in ("preloaded", "cache", "decode", "cache_plain"):
        # a fresh model from disk each: every mode computes the same steps
        run = build_run(load_config(None, overrides + ["training.shared_prefix=false"]) if mode == "cache_plain"
                        else cfg)
        if mode in ("cache", "cache_plain"):
            run.prompts.frames = FrameSource(cfg.vision, work / "cache", "cache_only")
        elif mode == "decode":
            run.prompts.frames = FrameSource(cfg.vision, None, "realtime")
        else:
            run.prompts.frames = PreloadedFrames(FrameSource(cfg.vision, None, "realtime"), run.loader.samples)
        runs[mode] = run
    timed = {mode: [] for mode in runs}
    for step in range(1, 2 + args.steps):  # modes interleaved step by step: load swings hit all three
        for mode, run in runs.items():
            metrics = train_step(run, step)
            if step > 1:  # step 1 warms up
                timed[mode].append(metrics)
    results = {mode: {k: sum(m[k] for m in ms) / len(ms) for k in ms[0] if k.startswith("time/")}
               for mode, ms in timed.items()}
    print(f"\nmean step time over {args.steps} steps ({args.clips} clips of {args.seconds:.0f} s 640x360, "
          f"2 fps, <= 64 frames, n=4):")
    stages = sorted({k for r in results.values() for k in r if k != "time/step"})
    print(f"{'mode':<12} {'step s':>8} " + " ".join(f"{s.split('/')[1]:>12}" for s in stages))
    for mode, r in results.items():
        print(f"{mode:<12} {r['time/step']:8.3f} " + " ".join(f"{r.get(s, 0):12.3f}" for s in stages))
    a, b, c = (results[m]["time/step"] for m in ("preloaded", "cache", "decode"))
    print(f"\n(b) cache / (a) preloaded = {b / a:.3f}   (target <= 1.05)")
    print(f"(c) decode / (b) cache    = {c / b:.2f}   (target >= 1.47; paper: 1.47)")
    plain = results["cache_plain"]
    print(f"shared prefix off / on (b): step {plain['time/step'] / b:.2f}x, "
          + ", ".join(f"{k.split('/')[1]} {plain[k] / results['cache'][k]:.2f}x"
                      for k in ("time/old_logprob", "time/ref_logprob", "time/update") if results["cache"].get(k, 0.0) > 1e-3))


if __name__ == "__main__":
    main()
