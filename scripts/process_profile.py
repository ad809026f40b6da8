"""Where the test suite's CPU time goes, process by process.

Most of the suite's time is spent in the Python processes its tests start (training commands,
torchrun ranks, vLLM's helpers), and each one that loads a model first pays the import of torch,
transformers and torchcodec: several CPU-seconds before it does any work. `pytest --durations`
shows which tests are long, not why; this script shows what they start.

Usage: .venv/bin/python scripts/process_profile.py [--top K] [--log FILE] [PYTEST_ARGS ...]
  PYTEST_ARGS  what pytest runs (default: `make test`'s arguments over tests/)
  --top K      rows per table (default 25)
  --log FILE   also keep the raw log (one JSON object per process)

It puts a `sitecustomize.py` on PYTHONPATH, so every Python process of the run records, when it
exits normally, its pid, parent, wall and CPU seconds, command line and the test that started it
(`PYTEST_CURRENT_TEST`, inherited). Processes that end by a signal or `os._exit` (killed ranks,
SIGKILLed commands of the chaos tests) write nothing; the summary compares the logged CPU with the CPU of all children
of pytest (`getrusage`), so the unlogged share shows. Prints the whole run's CPU and wall time,
then the CPU by kind of process and by test file.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAKE_TEST_ARGS = ["-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder",
                  "--durations=20", "tests"]

HOOK = '''\
import atexit, json, os, resource, sys, time
_start = time.time()
def _forked():  # a fork server's child (tests/forkserver.py) starts its clock at the fork
    global _start
    _start = time.time()
os.register_at_fork(after_in_child=_forked)
def _record():
    usage = resource.getrusage(resource.RUSAGE_SELF)  # a forked child's count starts at the fork
    argv = list(sys.orig_argv)  # the command line; a fork server's child sets the one it became
    row = {"pid": os.getpid(), "ppid": os.getppid(), "wall": round(time.time() - _start, 3),
           "cpu": round(usage.ru_utime + usage.ru_stime, 3), "argv": argv[:8],
           "test": os.environ.get("PYTEST_CURRENT_TEST", "")}
    try:
        with open(os.environ["EV1_PROCESS_LOG"], "a") as f:
            f.write(json.dumps(row) + "\\n")  # one short write: lines of concurrent processes stay whole
    except (OSError, KeyError):
        pass
atexit.register(_record)
'''


def kind(argv: list[str]) -> str:
    """A short name for what a process ran: `-m module [subcommand]`, a script's name, or `-c`."""
    args = [a for a in argv[1:] if a not in ("-u", "-B")]
    if not args:
        return "python"
    if args[0] == "-m" and len(args) > 1:
        if args[1] == "easyvideor1.cli" and len(args) > 2:
            return f"easyvideor1 {args[2]}"
        return args[1]
    if args[0] == "-c":
        code = args[1] if len(args) > 1 else ""
        return "pytest-xdist worker" if "exec(eval(sys.stdin" in code else "-c " + code[:40].replace("\n", " ")
    return Path(args[0]).name


def table(title: str, counts: dict[str, list[float]], top: int, total: float) -> None:
    print(f"\n{title}\n{'CPU s':>9} {'share':>6} {'procs':>6} {'CPU s/proc':>10}  name")
    for name, (n, cpu) in sorted(counts.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{cpu:9.1f} {100 * cpu / total:5.1f}% {int(n):6d} {cpu / n:10.2f}  {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--log", type=Path)
    args, pytest_args = parser.parse_known_args()
    hook_dir = Path(tempfile.mkdtemp(prefix="ev1-profile-"))
    log = args.log or hook_dir / "processes.jsonl"
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    env = {**os.environ, "EV1_PROCESS_LOG": str(log), "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(hook_dir), os.environ.get("PYTHONPATH", "")) if p)}
    start = time.time()
    rc = subprocess.run([sys.executable, "-m", "pytest", *(pytest_args or MAKE_TEST_ARGS)], cwd=ROOT, env=env).returncode
    wall = time.time() - start
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    all_cpu = children.ru_utime + children.ru_stime
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    logged = sum(r["cpu"] for r in rows)
    print(f"\n[process_profile] pytest exit code {rc}; wall {wall / 60:.1f} min; CPU of the whole run "
          f"{all_cpu / 60:.1f} min ({all_cpu / wall:.2f} cores busy on average); {len(rows)} Python processes "
          f"logged {logged / 60:.1f} min (the rest: processes ended by a signal or os._exit, and "
          f"programs that are not Python: ffmpeg, Chromium, node, compilers)")
    by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    by_file: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        for key, counts in ((kind(r["argv"]), by_kind), (r["test"].split("::")[0] or "(no test)", by_file)):
            counts[key][0] += 1
            counts[key][1] += r["cpu"]
    table("CPU by kind of process", by_kind, args.top, all_cpu)
    table("CPU of started processes by test file", by_file, args.top, all_cpu)
    if not args.log:
        shutil.rmtree(hook_dir, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
