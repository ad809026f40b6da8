"""tests/budget.py: a test over the per-test budget is named in the summary and fails nothing; with
`EV1_TEST_BUDGET_S` set it fails, naming itself; the summary gives the reference and the suite's
wall and CPU time in its units. Real pytest runs in subprocesses over a planted test file."""

import os
import re
import subprocess
import sys
from pathlib import Path

import budget

TESTS = Path(__file__).resolve().parent

PLANTED = '''
import time
import pytest

@pytest.fixture(scope="module")
def slow_fixture():
    time.sleep(3)

def test_slow_in_its_module_fixture(slow_fixture):
    pass

def test_fast():
    pass

def test_slow_in_its_call():
    time.sleep(3)
'''


def _pytest(tmp_path, xdist: bool = False, **env_vars) -> tuple[int, str]:
    (tmp_path / "test_planted.py").write_text(PLANTED)
    env = {**os.environ, "PYTHONPATH": str(TESTS), **env_vars}
    for key in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "EV1_TEST_BUDGET_S", "EV1_TEST_BUDGET_UNITS"):
        if key not in env_vars:
            env.pop(key, None)
    plugins = ["-n", "2"] if xdist else ["-p", "no:xdist"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "budget", *plugins,
                           "-p", "no:randomly", str(tmp_path / "test_planted.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def test_a_test_over_the_budget_is_named_and_fails_nothing(tmp_path):
    rc, out = _pytest(tmp_path, EV1_TEST_BUDGET_UNITS="1")  # one unit: well under the planted 3 s sleeps
    assert rc == 0, out
    assert "3 passed" in out, out
    unit = float(re.search(r"reference: 1 unit = (\d+\.\d+) s here \(matmul \d+\.\d+ s \+ Python \d+\.\d+ s, "
                           r"one thread\)", out).group(1))
    assert unit > 0, out
    assert re.search(r"suite: wall \d+ min \d+ s = [\d,]+ units; CPU [\d,]+ s = [\d,]+ units", out), out
    over = re.search(r"over the per-test budget of 1 units \(\d+ s here\): 2 \(a report, not a failure; "
                     r"EV1_TEST_BUDGET_S=N makes N seconds a limit\)\n((?:  .*\n){2})", out)
    assert over, out
    named = over.group(1)
    # the module fixture's time counts for the first test of the module
    assert "test_planted.py::test_slow_in_its_module_fixture" in named and "test_planted.py::test_slow_in_its_call" in named
    assert "test_fast" not in named, out


def test_the_report_reaches_the_master_under_xdist(tmp_path):
    rc, out = _pytest(tmp_path, xdist=True, EV1_TEST_BUDGET_UNITS="1")
    assert rc == 0 and "3 passed" in out, out
    assert re.search(r"over the per-test budget of 1 units \(\d+ s here\): 2 ", out), out
    cpu = float(re.search(r"CPU ([\d,]+) s = ", out).group(1).replace(",", ""))
    assert cpu >= 1, out  # two workers each imported pytest and ran a test: not the master's alone


def test_a_hard_limit_fails_the_tests_over_it(tmp_path):
    rc, out = _pytest(tmp_path, EV1_TEST_BUDGET_S="1")
    assert rc == 1, out
    assert "2 failed, 1 passed" in out, out
    assert re.search(r"test_planted.py::test_slow_in_its_module_fixture took \d+ s \(setup (?:[3-9]|\d\d+) s \+ call \d+ s\), "
                     r"over the per-test budget of 1 s \(EV1_TEST_BUDGET_S\)", out), out
    assert re.search(r"test_planted.py::test_slow_in_its_call took \d+ s \(setup \d+ s \+ call (?:[3-9]|\d\d+) s\)", out), out
    assert "FAILED test_planted.py::test_fast" not in out, out


def test_summary_lines_scale_the_budget_with_the_reference():
    times = {"a": 100.0, "b": 150.0}
    slow = budget.summary_lines(times, {"matmul": 1.0, "python": 1.0, "unit": 2.0}, 600.0, 1200.0, 100)
    fast = budget.summary_lines(times, {"matmul": 0.25, "python": 0.25, "unit": 0.5}, 600.0, 1200.0, 100)
    assert slow[-1].endswith(": none") and "(200 s here)" in slow[-1]  # 100 units of 2 s: neither is over
    assert "(50 s here): 2" in fast[2] and fast[3].strip() == "150 s = 300 units  b"
    assert slow[1] == "suite: wall 10 min 0 s = 300 units; CPU 1,200 s = 600 units (the workers and every process they waited for)"
