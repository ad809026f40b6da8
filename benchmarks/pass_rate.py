"""Pass-rate throughput (samples/s, k responses each) on the long-video synthetic set of
`eval_speed.py`, same tiny model, same HF engine, same rewards:

(a) plain loop: for each sample decode its video, generate k, score, write; then the next
(b) the same plain loop reading frames from the frame cache (isolates the cache's share)
(c) `easyvideor1 pass-rate`'s pipeline: frame cache + loading pool ahead of the engine, scoring
    overlapped with generation; `--max-batch k` (one sample's group per HF batch: on 2 CPU cores
    larger batches were slower, 10.3 s vs 5.3 s for 6 samples; on a GPU raise it)

Prints samples/s of each and the ratio (a)/(c) (target >= 3x) and (b)/(c). Cache building is
offline and not timed. Sampling is seeded per sample id in (c) and per sample in (a)/(b), so
the responses differ between modes (only the throughput is compared).

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/pass_rate.py [--clips 16] [--k 8] [--min-s 120] [--max-s 240]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import dataclasses
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

from eval_speed import VISION, long_clip_set

from easyvideor1.curation.pass_rate import pass_rate
from easyvideor1.curation.runner import RunOptions
from easyvideor1.curation.sources import SourceOptions, local_source
from easyvideor1.data.loading import load_samples
from easyvideor1.data.templates import render_prompt
from easyvideor1.models.families import get_family
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.prompts import PromptBuilder
from easyvideor1.rewards.batch import score_batch
from easyvideor1.rollout.base import SamplingParams
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.vision.cache import FrameSource
from easyvideor1.vision.cache_build import build_cache

VISION_ARGS = tuple(f"{f.name}={getattr(VISION, f.name)}" for f in dataclasses.fields(VISION) if f.name != "family")


def plain_loop(model_dir: Path, data: Path, k: int, params: SamplingParams, cache_dir: Path | None) -> float:
    """Seconds for the plain loop over every sample (decode or cache read, generate k, score)."""
    from transformers import AutoConfig

    processor = load_processor(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    family = get_family(VISION.family)
    engine = HFEngine(load_policy(model_dir, dtype="float32").eval(), processor, family, mrope_spec(config),
                      max_batch_size=k)
    frames = FrameSource(VISION, cache_dir, "cache_only" if cache_dir else "realtime")
    builder = PromptBuilder(frames, processor, family, mrope_spec(config), render=render_prompt)
    rows = []
    start = time.perf_counter()
    for sample in load_samples(data):
        prompt = builder.build(sample)
        texts = [r.text for r in engine.generate([prompt], k, params)[0]]
        rewards = score_batch(texts, [sample] * k, workers=0)
        rows.append({"id": sample.problem_id, "pass_rate": sum(r.accuracy for r in rewards) / k})
    return time.perf_counter() - start


def pipeline(model_dir: Path, data: Path, k: int, params: SamplingParams, cache_dir: Path, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    source = local_source(str(model_dir), "hf", SourceOptions(vision=VISION_ARGS, cache_dir=str(cache_dir),
                                                              cache_mode="cache_only", dtype="float32",
                                                              max_batch=k))
    start = time.perf_counter()
    pass_rate(str(data), str(out), source, params, k,
              options=RunOptions(load_workers=2, prefetch=8, score_workers=0))
    elapsed = time.perf_counter() - start
    rows = [json.loads(line) for line in (out / "pass_rates.jsonl").read_text().splitlines()]
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        raise SystemExit(f"pipeline failed samples: {failed[:2]}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=16)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--min-s", type=float, default=120.0)
    ap.add_argument("--max-s", type=float, default=240.0)
    ap.add_argument("--source-fps", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--work", default=None, help="folder for clips, cache and results (default: temp)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = Path(args.work or tempfile.mkdtemp(prefix="pass_rate_"))
    data = long_clip_set(work, args.clips, args.min_s, args.max_s, args.source_fps)
    model = build_tiny_model("qwen2_5_vl", work / "model", seed=0)
    cache = work / "cache"
    if not cache.exists():
        build_cache(load_samples(data), VISION, cache, workers=2, progress=False)
    params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=0)
    print(f"{args.clips} clips of {args.min_s:.0f}-{args.max_s:.0f} s 640x360 @ {args.source_fps:g} fps; "
          f"k={args.k}, {args.max_tokens} tokens per response, tiny Qwen2.5-VL, HF engine")
    ta = plain_loop(model, data, args.k, params, None)
    tb = plain_loop(model, data, args.k, params, cache)
    tc = pipeline(model, data, args.k, params, cache, work / "c")
    n = args.clips
    print(f"(a) plain loop, decode on the fly: {n / ta:6.2f} samples/s")
    print(f"(b) plain loop, frame cache:       {n / tb:6.2f} samples/s")
    print(f"(c) pass-rate pipeline:            {n / tc:6.2f} samples/s")
    print(f"(a)/(c) = {ta / tc:.1f}x   (target >= 3x)")
    print(f"(b)/(c) = {tb / tc:.2f}x")


if __name__ == "__main__":
    main()
