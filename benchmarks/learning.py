"""The cold-start comparison of the paper (section 3.2.1): the demo's steps with hybrid
offline/online groups on and off, from the same random tiny model. Prints validation accuracy
per task before and after for both runs.

Expected: on-policy-only stays near 0 (a random policy almost never produces a well-formed,
correct answer, so GRPO groups carry no signal), while hybrid groups learn.

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/learning.py [--steps N] [--out runs/learning]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
from pathlib import Path

from easyvideor1.training.demo import run_demo, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None, help="training steps of each run (default: the demo's)")
    ap.add_argument("--out", default="runs/learning")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    results = {}
    for name, hybrid in (("hybrid", True), ("on-policy only", False)):
        after = run_demo(Path(args.out) / name.replace(" ", "_"), steps=args.steps, hybrid=hybrid, seed=args.seed)
        results[name] = summary(after)
    print("\nvalidation after training (greedy):")
    print(f"{'run':<16} {'classification acc':>20} {'grounding mIoU':>16}")
    for name, (cls, grd) in results.items():
        print(f"{name:<16} {cls:20.2f} {grd:16.2f}")


if __name__ == "__main__":
    main()
