"""`make test`'s worker count (scripts/test_workers.sh): one per core, at most one per 3 GiB of
available memory, at least one; TEST_WORKERS overrides it."""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GIB_KIB = 1024 * 1024


def _workers(*args, cgroup=None):
    env = {**os.environ, "CGROUP": str(cgroup)} if cgroup else None
    out = subprocess.run(["bash", str(ROOT / "scripts/test_workers.sh"), *map(str, args)], capture_output=True,
                         text=True, check=True, env=env).stdout
    return int(out)


@pytest.mark.parametrize("cores, mem_kib, expected", [
    (2, 24 * GIB_KIB, 2),      # this machine: one per core
    (64, 100 * GIB_KIB, 33),   # memory bounds it: 100 // 3
    (4, 7 * GIB_KIB, 2),       # 7 // 3
    (2, 2 * GIB_KIB, 1),       # under 3 GiB: still one
    (1, 0, 1),
])
def test_one_per_core_bounded_by_memory(cores, mem_kib, expected):
    assert _workers(cores, mem_kib) == expected


def _files(root, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    return root


@pytest.mark.parametrize("files, expected", [
    # cgroup v2: 1.5 cores of quota -> 2 cores -> 2 workers; 8 GiB limit, 1 GiB used -> 7 // 3 = 2
    ({"cpu.max": "150000 100000", "memory.max": str(8 << 30), "memory.current": str(1 << 30)}, 2),
    ({"cpu.max": "100000 100000", "memory.max": "max", "memory.current": "0"}, 1),  # one core
    ({"cpu.max": "max 100000", "memory.max": "max", "memory.current": "0"}, None),  # no limits
    # cgroup v1: -1 is no quota; a limit near 2^63 is no limit
    ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000",
      "memory/memory.limit_in_bytes": str(5 << 30), "memory/memory.usage_in_bytes": "0"}, 1),
    ({"cpu/cpu.cfs_quota_us": "100000", "cpu/cpu.cfs_period_us": "100000",
      "memory/memory.limit_in_bytes": "9223372036854771712", "memory/memory.usage_in_bytes": "0"}, 1),
])
def test_a_containers_cgroup_limits_lower_it(tmp_path, files, expected):
    cgroup = _files(tmp_path / "cg", files)
    before = _workers(cgroup=tmp_path / "none")  # no cgroup files: nproc and MemAvailable only
    got = _workers(cgroup=cgroup)
    after = _workers(cgroup=tmp_path / "none")  # MemAvailable moves while other tests run
    assert got in {u if expected is None else min(expected, u) for u in (before, after)}


def test_make_test_uses_it_unless_test_workers_is_set():
    env = {k: v for k, v in os.environ.items() if k not in ("TEST_WORKERS", "MAKEFLAGS", "MAKELEVEL")}

    def workers_in(command_env):
        dry = subprocess.run(["make", "-n", "test"], cwd=ROOT, env=command_env, capture_output=True, text=True,
                             check=True).stdout
        return int(re.search(r"-n (\d+) --dist loadfile", dry).group(1))

    before = _workers()  # available memory moves while other tests run: the count read just before or after
    assert workers_in(env) in {before, _workers()}
    assert workers_in({**env, "TEST_WORKERS": "3"}) == 3
