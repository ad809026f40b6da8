"""Peak memory of one piece of work, measured in a fresh process (Linux /proc), for the benchmarks.

    print_rise(work)            in the child: run `work()`, print {"rise_mib", "method"} as JSON
    child_rise(script, args)    in the parent: run `script --memory-child args...`, read that JSON

The rise is the peak resident set during `work` (VmHWM, reset through /proc/self/clear_refs just
before it) over the resident set before it, so model loading is not counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def print_rise(work: Callable[[], object]) -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        method = "VmHWM after clear_refs"
    except OSError:
        method = "VmHWM (not reset: the peak of model loading may hide the work's)"
    before = status_kib("VmRSS")
    work()
    print(json.dumps({"rise_mib": (status_kib("VmHWM") - before) / 1024, "method": method}))


def child_rise(script: str, args: list[str]) -> dict:
    cmd = [sys.executable, script, "--memory-child", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=os.environ.copy())
    return json.loads(out.stdout.strip().splitlines()[-1])
