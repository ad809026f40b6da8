"""Asynchronous training against the synchronous loop, on the demo's task and model.

`colocated`: one process generating, scoring and updating in turn, 2 threads (and `colocated-1t`:
the same with 1 thread, because with OMP_WAIT_POLICY=PASSIVE, which every command sets, waking a
second thread for each of the tiny model's small ops can cost more than it gains). `separate` with
`training.max_staleness=1`: a trainer and a rollout process with 1 thread each, generation of
batch s+1 beside the update of step s. Same model, data, seed and steps; each run is the real
loop (`trainer.train`, the rollout process started by it), the runs alternate (colocated,
separate, colocated, ...) so a busy machine slows both alike, each in a process of its own
(`easyvideor1 train`, no export). Steps/s counts the steps after
the warm-up ones (metrics' `time/wall`: each step's wall clock). Prints the ratio and the mean
per-stage times: for `separate`, `rollout_wait` is the trainer idle for a batch, `weight_sync`
the broadcast (with the wait for the rollout process to reach it), `train_wait` the rollout
process idle for weights, `gen` its generation + scoring per batch. Also the whole-run wall
ratio (each process from start to end: imports and start-up included, for `separate` its
rollout process's too) and the trainer's weight sync against its update (the broadcast itself,
`async/sync_s`, apart from its wait for the rollout process to be ready, `async/ready_wait_s`).
`partial`: `separate` with partial rollouts (`rollout.partial`: a stale batch switches to the
weights after step s-1 after `--partial-tokens` decode steps), `arrival`: the same switching as
those weights arrive (`rollout.partial_tokens=0`); their staleness per token is printed.
`--task tools`: the demo's tools task instead (`demo --tools`: the flash task joins the mix,
responses may call crop_video; `TOOL_OVERRIDES`).

Usage: python benchmarks/async_rl.py [--steps 60] [--warmup 3] [--repeats 1] [--task demo|tools]
       [--partial-tokens N] [--work DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from easyvideor1.config import demo_config_path, load_config
from easyvideor1.data.loading import load_samples
from easyvideor1.data.synth import DEMO_TOOLS_MIX, DEMO_TRAIN_MIX, OPT_IN_TASKS, TASKS, write_suite
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.demo import TOOL_OVERRIDES, demo_overrides
from easyvideor1.training.metrics import read_metrics
from easyvideor1.vision.cache_build import build_cache

VARIANTS = {  # name: (overrides, intra-op threads of the process; `separate` halves them per process)
    "colocated": (["rollout.placement=colocated"], 2),
    "colocated-1t": (["rollout.placement=colocated"], 1),
    "separate": (["rollout.placement=separate", "training.max_staleness=1"], 2),
    "partial": (["rollout.placement=separate", "training.max_staleness=1", "rollout.partial=true"], 2),
    "arrival": (["rollout.placement=separate", "training.max_staleness=1", "rollout.partial=true",
                 "rollout.partial_tokens=0"], 2),
}
STAGES = ("time/prepare", "time/rollout", "time/rollout_wait", "time/old_logprob", "time/update", "time/sync",
          "time/weight_sync", "time/train_wait", "async/rollout_s", "async/prepare_s")
TASK_SETS = {  # --task: (tasks, training mix, extra overrides, default --partial-tokens)
    "demo": (TASKS, DEMO_TRAIN_MIX, [], 16),  # answers of up to rollout.max_tokens=40 tokens
    "tools": (TASKS + OPT_IN_TASKS, DEMO_TOOLS_MIX, TOOL_OVERRIDES, 64),  # a flash trajectory: ~225 tokens
}


def run_variant(base: list[str], extra: list[str], threads: int, out: Path, steps: int) -> tuple[list[dict], float]:
    """One `easyvideor1 train` of `steps` steps in a process of its own (`threads` intra-op threads;
    `separate` splits them between the trainer and its rollout process); its metrics rows and its
    wall time from process start to end."""
    overrides = [*base, *extra, f"logging.out_dir={out}", f"training.steps={steps}", "logging.progress=false",
                 "checkpoint.every=0", "checkpoint.resume=never", "checkpoint.export_hf=false"]
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "easyvideor1.cli", "train", demo_config_path(), *overrides],
                          env={**os.environ, "OMP_NUM_THREADS": str(threads)}, capture_output=True, text=True)
    wall = time.monotonic() - began
    if proc.returncode:
        raise RuntimeError(f"{out.name} failed:\n{proc.stderr[-4000:]}")
    return read_metrics(out / "metrics.jsonl"), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="timed steps per run (after the warm-up steps)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps at the start of each run")
    ap.add_argument("--repeats", type=int, default=1, help="runs per variant (alternating)")
    ap.add_argument("--task", choices=sorted(TASK_SETS), default="demo",
                    help="the demo's task (default) or its tools task (`demo --tools`)")
    ap.add_argument("--partial-tokens", type=int, default=None,
                    help="`partial`'s rollout.partial_tokens (default: 16 for the demo task, 64 for tools)")
    ap.add_argument("--work", default=None, help="folder for model, data and runs (default: a temp dir)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = Path(args.work or tempfile.mkdtemp(prefix="async_rl_"))
    tasks, mix, task_overrides, partial_tokens = TASK_SETS[args.task]
    task_overrides = [*task_overrides, f"rollout.partial_tokens={args.partial_tokens or partial_tokens}"]  # `arrival`: 0
    model = build_tiny_model("qwen2_5_vl", work / "model", seed=0)
    paths = write_suite(work / "data", num_train=512, num_val=8, seed=0, tasks=tasks, train_mix=mix)
    base = [*demo_overrides(model, paths, work / "cache", work / "runs", seed=0), *task_overrides]  # out_dir: per run
    cfg = load_config(demo_config_path(), base)
    build_cache(load_samples(paths["train"]), cfg.vision, work / "cache", workers=2, progress=False)
    rows: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    walls: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for r in range(args.repeats):
        for name, (extra, threads) in VARIANTS.items():
            got, wall = run_variant(base, extra, threads, work / "runs" / f"{name}-{r}", args.warmup + args.steps)
            rows[name] += got[args.warmup:]
            walls[name].append(wall)
    rate = {name: len(rs) / sum(m["time/wall"] for m in rs) for name, rs in rows.items()}
    print(f"task {args.task}: {args.steps} timed steps x {args.repeats} run(s) per variant after {args.warmup} "
          f"warm-up steps (CPU capability {torch.backends.cpu.get_cpu_capability()})")
    print(f"{'variant':<10}{'steps/s':>10}" + "".join(f"{s.split('/')[-1]:>14}" for s in STAGES))
    for name, rs in rows.items():
        cells = "".join(f"{statistics.mean(m.get(s, 0.0) for m in rs):>14.3f}" for s in STAGES)
        print(f"{name:<10}{rate[name]:>10.3f}{cells}")
    print(f"separate (k=1) / colocated: {rate['separate'] / rate['colocated']:.2f}x steps per second")
    print(f"separate (k=1) / colocated-1t (the faster colocated setting here?): "
          f"{rate['separate'] / rate['colocated-1t']:.2f}x steps per second")
    for name in ("partial", "arrival"):
        print(f"{name} (k=1, partial rollouts) / colocated: {rate[name] / rate['colocated']:.2f}x, / colocated-1t: "
              f"{rate[name] / rate['colocated-1t']:.2f}x steps per second")
    for name in ("separate", "partial", "arrival"):
        print(f"{name}: staleness per token {statistics.mean(m['async/staleness_mean'] for m in rows[name]):.3f} "
              f"(mean over the timed steps), train_wait {statistics.mean(m['time/train_wait'] for m in rows[name]):.3f} s")
    wall = {name: statistics.mean(w) for name, w in walls.items()}
    print("whole run (process start to end, {} steps): {}".format(
        args.warmup + args.steps, ", ".join(f"{name} {w:.1f} s" for name, w in wall.items())))
    print(f"whole run, colocated / separate (k=1): {wall['colocated'] / wall['separate']:.2f}x, "
          f"colocated-1t / separate: {wall['colocated-1t'] / wall['separate']:.2f}x, colocated / partial: "
          f"{wall['colocated'] / wall['partial']:.2f}x, colocated / arrival: {wall['colocated'] / wall['arrival']:.2f}x")
    update = statistics.mean(m["time/update"] for m in rows["separate"])
    synced = [m for m in rows["separate"] if "async/sync_s" in m] or [{"async/sync_s": 0.0, "async/ready_wait_s": 0.0}]
    sync, ready = (statistics.mean(m[k] for m in synced) for k in ("async/sync_s", "async/ready_wait_s"))
    print(f"separate's weight sync: {sync:.4f} s gather + broadcast per sync ({ready:.4f} s waiting for the "
          f"rollout process to be ready before it), update {update:.3f} s per step: sync / update = "
          f"{sync / update:.1%}")


if __name__ == "__main__":
    main()
