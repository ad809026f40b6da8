"""Qwen3.5's linear-attention (Gated DeltaNet) layers: packed vs padded, shared vs plain, SP 2 vs 1 process.

A tiny "medium" Qwen3.5 (random weights, float32; one linear-attention and one full-attention
layer, 2 linear key heads and 4 value heads of dim 64) runs the workloads of two other benchmarks:

- packed vs padded: `long_video.py`'s 8 video prompts of ~200 to ~4,000 tokens, 2 responses each,
  4 sequences per micro-batch; step = the log-prob pass + one update (forward, backward, AdamW);
  peak memory of one step in a fresh subprocess (rise of VmHWM, `peak_memory.py`);
- shared vs plain: `shared_prefix.py`'s group of n = 8 responses (128 tokens) to a ~1,000-token
  video prompt (8:1), one micro-batch; the log-prob pass without gradients, and the update;
- SP 2 vs 1 process: tests/models/ulysses_worker.py (a packed video + text + image row) under
  torchrun with 2 processes at sequence_parallel_size 2 and alone: max |Δ log-prob| of the
  first pass and max |Δ parameter| after its 3 SGD steps (lr 1).

Times are the minimum over `--repeats` runs, the paths interleaved (load swings on a shared
machine hit both); only the ratios mean anything across machines.

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/linear_attention.py [--repeats 3] [--size medium]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import long_video
import shared_prefix
from easyvideor1.models.packing import use_packed_attention
from easyvideor1.models.tiny import build_tiny_model
from peak_memory import child_rise, print_rise

FAMILY = "qwen3_5"
long_video.FAMILY = shared_prefix.FAMILY = FAMILY  # their workloads, on Qwen3.5
SHARED_CASE = shared_prefix.CASES[0]  # n = 8, 8:1
WORKER = Path(__file__).parents[1] / "tests" / "models" / "ulysses_worker.py"


def memory_child(model_dir: str, mode: str) -> None:
    """One packed or padded step of `long_video.py` in this fresh process; prints its rise (JSON)."""
    model, batch, ctx, optimizer, _ = long_video._setup(Path(model_dir), mode)
    print_rise(lambda: long_video._step(model, batch, ctx, optimizer))


def packed_vs_padded(model_dir: Path, repeats: int) -> list[str]:
    runs = {mode: long_video._setup(model_dir, mode) for mode in ("padded", "packed")}
    lens = runs["padded"][4]
    times = {mode: [] for mode in runs}
    for i in range(repeats + 1):  # the first: warm-up
        for mode, (model, batch, ctx, optimizer, _) in runs.items():
            lp, up = long_video._step(model, batch, ctx, optimizer)
            if i:
                times[mode].append(lp + up)
    del runs
    mem = {mode: child_rise(__file__, [str(model_dir), mode])["rise_mib"] for mode in times}
    pad, pack = min(times["padded"]), min(times["packed"])
    return [f"packed vs padded step ({len(lens)} prompts, {min(lens)}-{max(lens)} tokens)", f"{pad:.2f} s",
            f"{pack:.2f} s", f"{pad / pack:.2f}x", f"peak {mem['padded']:.0f} vs {mem['packed']:.0f} MiB"]


def shared_vs_plain(model_dir: Path, repeats: int) -> list[list[str]]:
    _, n, frames, response_len = SHARED_CASE
    model, batch, ctx, prompt_len = shared_prefix._setup(model_dir, n, frames, response_len)
    use_packed_attention(model)  # group rows need the packing-aware attention and linear-attention forwards
    times = {k: {False: [], True: []} for k in ("logprob", "update")}
    for i in range(repeats + 1):
        for shared in (False, True):
            lp = shared_prefix._logprob_pass(model, batch, ctx[shared])
            up = shared_prefix._update(model, batch, ctx[shared])
            if i:
                times["logprob"][shared].append(lp)
                times["update"][shared].append(up)
    rows = []
    for key, what in (("logprob", "log-prob pass"), ("update", "update")):
        plain, shared = min(times[key][False]), min(times[key][True])
        rows.append([f"shared vs plain {what} (n={n}, prompt {prompt_len}, responses {response_len})",
                     f"{plain:.2f} s", f"{shared:.2f} s", f"{plain / shared:.2f}x",
                     "target >= 3x" if key == "logprob" else ""])
    return rows


def sp2_vs_one(model_dir: Path, work: Path) -> list[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(WORKER.parents[2]), os.environ.get("PYTHONPATH", "")])}
    for procs, out in ((1, "one.pt"), (2, "sp2.pt")):
        launcher = [sys.executable] + (["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
                                       if procs == 2 else [])
        subprocess.run(launcher + [str(WORKER), FAMILY, str(model_dir), str(work / out), str(procs)], env=env,
                       check=True, capture_output=True)
    a, b = (torch.load(work / f, weights_only=False) for f in ("one.pt", "sp2.pt"))
    mask = a["first"]["mask"]
    logp = (a["first"]["logprobs"][mask] - b["first"]["logprobs"][mask]).abs().max().item()
    params = max((a["params"][k] - b["params"][k]).abs().max().item() for k in a["params"])
    return [f"SP 2 vs 1 process ({a['first']['length']}-token packed row, {int(mask.sum())} scored)",
            "", "", f"max |Δ logp| {logp:.1e}", f"max |Δ param| after 3 steps {params:.1e}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--size", default="medium", help="tiny model size (models/tiny.py SIZES; k=2 needs >= medium)")
    ap.add_argument("--work", default=None, help="folder for the model and worker outputs (default: a temp dir)")
    ap.add_argument("--memory-child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        memory_child(*args.memory_child)
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="linear_attention_"))
    model_dir = build_tiny_model(FAMILY, work / f"model_{args.size}", seed=0, size=args.size)
    print(f"{FAMILY} tiny '{args.size}', float32, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}; min of {args.repeats}, paths interleaved")
    rows = [packed_vs_padded(model_dir, args.repeats), *shared_vs_plain(model_dir, args.repeats),
            sp2_vs_one(model_dir, work)]
    head = ["measure", "baseline", "new", "ratio", "note"]
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), flush=True)
    print("baseline / new: padded / packed, plain / shared; memory: rise of peak RSS during one step, fresh process "
          "per mode")
    print(f"load average while running: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
