"""The demo's training step under config variants, side by side in one run.

Steps of the variants are interleaved (A, B, A, B, ...) from the same data, so a machine busy
with other work slows them alike: compare the ratios. `before` is the demo as it ran until
2026-12-05 (the patch embedding a Conv3d, a thread per core), `demo` as it runs now (a matmul,
one thread; threads set per step with `torch.set_num_threads`). Prints the mean per-stage wall times
(prepare = frames + processor, rollout = decoding, update = forward + backward + optimizer) and
the process's CPU seconds per step (cpu/step, all threads).

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/demo_step.py [--steps 8] [--work DIR] [--model DIR]
       [--variant NAME=override,override ...]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

from easyvideor1.config import load_config
from easyvideor1.data.loading import load_samples
from easyvideor1.data.synth import write_suite
from easyvideor1.models.patch_embed import use_conv_patch_embed
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.threads import usable_cores
from easyvideor1.training.demo import demo_config_path, demo_overrides
from easyvideor1.training.setup import build_run
from easyvideor1.training.trainer import train_step
from easyvideor1.vision.cache_build import build_cache

STAGES = ("cpu/step", "time/step", "time/prepare", "time/rollout", "time/old_logprob", "time/update")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8, help="timed steps per variant (after 2 warm-up steps)")
    ap.add_argument("--work", default=None, help="folder for model, data and cache (default: a temp dir)")
    ap.add_argument("--model", default=None,
                    help="an HF model folder to start from, e.g. a trained demo's runs/demo/train/hf_model (its "
                         "short answers are the steady state); default: a new random tiny model (long garbage)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=OVERRIDES",
                    help="extra variant: a name, '=', comma-separated config overrides")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = Path(args.work or tempfile.mkdtemp(prefix="demo_step_"))
    model = args.model or build_tiny_model("qwen2_5_vl", work / "model", seed=0)
    paths = write_suite(work / "data", num_train=256, num_val=8, seed=0)
    base = demo_overrides(model, paths, work / "cache", work / "run", seed=0)
    cfg = load_config(demo_config_path(), base)
    build_cache(load_samples(paths["train"]), cfg.vision, work / "cache", workers=2, progress=False)
    # "before": the demo's settings as they ran before 2026-12-05: the vision tower's patch
    # embedding as the transformers Conv3d (models/patch_embed.py) and a thread per core
    # (cli.MOST_THREADS); the other variants run as the demo does, one thread
    variants = {"before": [], "demo": []}
    threads = {"before": usable_cores()}
    for spec in args.variant:
        name, _, overrides = spec.partition("=")
        variants[name] = [o for o in overrides.split(",") if o]
    runs = {}
    for name, extra in variants.items():
        runs[name] = build_run(load_config(demo_config_path(), [*base, *extra, "logging.progress=false",
                                                               "checkpoint.every=0", "checkpoint.resume=never",
                                                               f"logging.out_dir={work / 'run' / name}"]))
    use_conv_patch_embed(runs["before"].model)
    times = {name: [] for name in runs}
    for step in range(1, args.steps + 3):
        for name, run in runs.items():
            run.step = step
            torch.set_num_threads(threads.get(name, 1))
            cpu = time.process_time()
            metrics = train_step(run, step)
            metrics["cpu/step"] = time.process_time() - cpu  # this process's CPU seconds: less
            # swayed by other work on the machine than the wall-clock stage timers
            if step > 2:
                times[name].append(metrics)
    print(f"mean over {args.steps} steps (s); ratio to 'before' in brackets")
    print(f"{'variant':<10}" + "".join(f"{s:>20}" for s in STAGES) + f"{'tokens/resp':>14}")
    ref = {s: statistics.mean(m.get(s, 0.0) for m in times["before"]) for s in STAGES}
    for name, rows in times.items():
        cells = []
        for s in STAGES:
            v = statistics.mean(m.get(s, 0.0) for m in rows)
            cells.append(f"{v:8.3f} ({v / ref[s]:4.2f})" if ref[s] > 0 else f"{v:8.3f}       ")
        length = statistics.mean(m.get("response/length", 0.0) for m in rows)
        print(f"{name:<10}" + "".join(f"{c:>20}" for c in cells) + f"{length:14.1f}")


if __name__ == "__main__":
    main()
