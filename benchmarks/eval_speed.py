"""Evaluation speed on a synthetic long-video benchmark, same engine, model and outputs:

(a) vanilla loop: decode on the fly, fixed batches, wait for the whole batch
(b) frame cache + the same synchronous batches
(c) frame cache + the asynchronous pipeline (loading pool ahead of the engine, longest first)
(d) the loop most evaluation scripts use: qwen-vl-utils' `process_vision_info` (its
    `fetch_video`) + the HF processor + `transformers` `model.generate`, in fixed batches

Prints (a)/(c) (target >= 6x; paper: 6-7x on LVBench), (b)/(c) and (d)/(c), and checks that
(a), (b) and (c) give identical greedy predictions; (d) samples frame indices with its own
rule and resizes with torchvision, so its predictions are compared (agreement rate), not
required equal. Cache building is offline and not timed. (d) needs `pip install
qwen-vl-utils` (0.0.14 was used); without it (d) is skipped with a message.

`--size medium --max-new-tokens 128` gives a model for which generation matters: the async
pipeline must then beat synchronous batches on cached frames ((b)/(c) > 1).

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/eval_speed.py [--clips 16] [--min-s 120] [--max-s 240]
       [--size tiny|medium] [--max-new-tokens 16] [--skip a,d]
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


def run(model, data, out: Path, cache_dir, mode: str, asynchronous: bool, max_new_tokens: int) -> tuple[float, dict]:
    shutil.rmtree(out, ignore_errors=True)
    ev = Evaluator(str(model), engine="hf", preset="qwen2_5_vl_greedy", vision=VISION,
                   sampling=DecodingSettings(temperature=0.0, max_new_tokens=max_new_tokens),
                   options=EvalOptions(out_dir=str(out), cache_dir=cache_dir, cache_mode=mode, dtype="float32",
                                       asynchronous=asynchronous, max_batch=8, load_workers=2, prefetch=16))
    t0 = time.perf_counter()
    ev.run([str(data)], report=False)  # the report (frame thumbnails) is not part of the timing
    elapsed = time.perf_counter() - t0
    rows = [json.loads(l) for l in (out / f"file-{data.stem}.jsonl").read_text().splitlines()]
    return elapsed, {r["id"]: r.get("response") for r in rows}


def run_hf_qwen_vl_utils(model_path, data, max_new_tokens: int, batch: int = 8) -> tuple[float, dict] | None:
    """(d): qwen-vl-utils + processor + `generate`, as its README shows, same prompts and budget."""
    try:
        from qwen_vl_utils import process_vision_info
    except ImportError:
        print("(d) skipped: qwen-vl-utils is not installed (pip install qwen-vl-utils)")
        return None
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from easyvideor1.data.templates import render_prompt

    processor = AutoProcessor.from_pretrained(model_path)
    processor.tokenizer.padding_side = "left"
    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).eval()
    samples = load_samples(data)
    t0 = time.perf_counter()
    responses = {}
    for k in range(0, len(samples), batch):
        chunk = samples[k:k + batch]
        messages = [[{"role": "user", "content": [
            {"type": "video", "video": s.videos[0], "fps": VISION.fps, "min_frames": VISION.min_frames,
             "max_frames": VISION.max_frames, "min_pixels": VISION.video_min_pixels,
             "max_pixels": VISION.video_max_pixels, "total_pixels": VISION.video_total_pixels},
            {"type": "text", "text": render_prompt(s)}]}] for s in chunk]
        texts = [processor.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]
        images, videos, video_kwargs = process_vision_info(messages, return_video_kwargs=True,
                                                           return_video_metadata=True)
        videos, metadata = zip(*videos)
        inputs = processor(text=texts, images=images, videos=list(videos), video_metadata=list(metadata),
                           padding=True, return_tensors="pt", do_resize=False, **video_kwargs)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        new = out[:, inputs["input_ids"].shape[1]:]
        for s, text in zip(chunk, processor.batch_decode(new, skip_special_tokens=True)):
            responses[s.problem_id] = text
    return time.perf_counter() - t0, responses


def long_clip_set(work: Path, clips: int, min_s: float, max_s: float, source_fps: float) -> Path:
    """`clips` generated clips of min_s..max_s seconds (seeded; kept between runs) under
    `work/clips`, one multiple-choice question each; returns the sample file."""
    (work / "clips").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(clips):
        seconds = float(rng.uniform(min_s, max_s))
        clip = work / "clips" / f"long{i:02d}.mp4"
        if not clip.exists():
            make_clip(clip, seconds, fps=source_fps)
        rows.append({"problem_id": f"q{i}", "problem": "Which colour is the square that moves fastest?",
                     "answer": "C", "problem_type": "multiple choice", "videos": [str(clip)],
                     "options": ["A. red", "B. green", "C. blue", "D. white"]})
    data = work / "bench.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=16)
    ap.add_argument("--min-s", type=float, default=120.0)
    ap.add_argument("--max-s", type=float, default=240.0)
    ap.add_argument("--source-fps", type=float, default=10.0)
    ap.add_argument("--work", default=None, help="folder for clips, cache and results (default: temp)")
    ap.add_argument("--size", default="tiny", help="tiny model size (tiny, medium)")
    ap.add_argument("--max-new-tokens", type=int, default=16, help="response length limit")
    ap.add_argument("--skip", default="", help="comma-separated runs to skip (a, d)")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    logging.basicConfig(level=logging.WARNING)
    work = Path(args.work or tempfile.mkdtemp(prefix="eval_speed_"))
    data = long_clip_set(work, args.clips, args.min_s, args.max_s, args.source_fps)
    model = build_tiny_model("qwen2_5_vl", work / f"model-{args.size}", seed=0, size=args.size)
    t0 = time.perf_counter()
    build_cache(load_samples(data), VISION, work / "cache", workers=2, progress=False)
    print(f"{args.clips} clips of {args.min_s:.0f}-{args.max_s:.0f} s 640x360 @ {args.source_fps:g} fps; "
          f"cache built offline in {time.perf_counter() - t0:.1f} s")
    n = args.max_new_tokens
    print(f"model: tiny {args.size}, max_new_tokens {n}")
    ta, pa = run(model, data, work / "a", None, "realtime", False, n) if "a" not in skip else (None, None)
    tb, pb = run(model, data, work / "b", str(work / "cache"), "cache_only", False, n)
    tc, pc = run(model, data, work / "c", str(work / "cache"), "cache_only", True, n)
    d = run_hf_qwen_vl_utils(model, data, n) if "d" not in skip else None
    if ta is not None:
        print(f"(a) vanilla, decode on the fly: {ta:7.2f} s")
    print(f"(b) cache, synchronous batches: {tb:7.2f} s")
    print(f"(c) cache, async pipeline:      {tc:7.2f} s")
    if d is not None:
        print(f"(d) qwen-vl-utils + generate:   {d[0]:7.2f} s")
    if ta is not None:
        print(f"(a)/(c) = {ta / tc:.1f}x   (target >= 6x)")
    print(f"(b)/(c) = {tb / tc:.2f}x")
    if d is not None:
        agree = sum(d[1][k].strip() == _answer(pc[k]) for k in pc) / len(pc)
        print(f"(d)/(c) = {d[0] / tc:.1f}x   (d) agrees with (c) on {100 * agree:.0f}% of responses "
              "(its own frame indices and resize)")
    same = pb == pc and (pa is None or pa == pc)
    print(f"identical greedy predictions {'(b) == (c)' if pa is None else '(a) == (b) == (c)'}: {same}")
    if not same:
        raise SystemExit("predictions differ between modes")


def _answer(response: str | None) -> str:
    return (response or "").strip()


if __name__ == "__main__":
    main()
