"""The fast chaos run (benchmarks/chaos.py with 3 kill points per command): the real `cache`,
`train` (checkpoint every step) and evaluation commands SIGKILLed inside a critical write
(named test hook) and at a seeded random moment, then re-run to completion; each must end
exactly as an uninterrupted run (see the benchmark's docstring for what is compared)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import chaos  # noqa: E402
import forkserver  # noqa: E402

chaos.run, chaos.Popen = forkserver.run, forkserver.Popen  # the commands start without their imports

KILLS = 3


@pytest.mark.parametrize("command", ["cache", "train", "eval"])
def test_killed_at_three_points_ends_as_uninterrupted(command, tmp_path):
    result = chaos.CASES[command](tmp_path, KILLS, seed=0)
    assert result.failures == [], chaos.table([result])
    assert len(result.kills) == KILLS, chaos.table([result])  # every kill landed (a missed one is retried)
    timed = [k for k in result.kills if k.startswith("t+")]
    assert timed and len(timed) < KILLS  # random moments and named points inside writes
