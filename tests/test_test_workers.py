"""`make test`'s worker count (scripts/test_workers.sh): two per core, at most one per 3 GiB of
available memory, at least one; TEST_WORKERS overrides it."""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GIB_KIB = 1024 * 1024


def _workers(*args):
    out = subprocess.run(["bash", str(ROOT / "scripts/test_workers.sh"), *map(str, args)], capture_output=True,
                         text=True, check=True).stdout
    return int(out)


@pytest.mark.parametrize("cores, mem_kib, expected", [
    (2, 24 * GIB_KIB, 4),      # this machine: two per core
    (64, 100 * GIB_KIB, 33),   # memory bounds it: 100 // 3
    (2, 7 * GIB_KIB, 2),       # 7 // 3
    (2, 2 * GIB_KIB, 1),       # under 3 GiB: still one
    (1, 0, 1),
])
def test_two_per_core_bounded_by_memory(cores, mem_kib, expected):
    assert _workers(cores, mem_kib) == expected


def test_make_test_uses_it_unless_test_workers_is_set():
    env = {k: v for k, v in os.environ.items() if k not in ("TEST_WORKERS", "MAKEFLAGS", "MAKELEVEL")}

    def workers_in(command_env):
        dry = subprocess.run(["make", "-n", "test"], cwd=ROOT, env=command_env, capture_output=True, text=True,
                             check=True).stdout
        return int(re.search(r"-n (\d+) --dist loadfile", dry).group(1))

    before = _workers()  # available memory moves while other tests run: the count read just before or after
    assert workers_in(env) in {before, _workers()}
    assert workers_in({**env, "TEST_WORKERS": "3"}) == 3
