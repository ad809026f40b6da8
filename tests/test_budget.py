"""tests/budget.py: a test whose setup + call passes the budget fails, naming itself; one within
it passes. A real pytest run in a subprocess over a planted test file, with a 1-second budget."""

import os
import re
import subprocess
import sys
from pathlib import Path

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


def test_a_test_over_the_budget_fails_and_is_named(tmp_path):
    (tmp_path / "test_planted.py").write_text(PLANTED)
    env = {**os.environ, "EV1_TEST_BUDGET_S": "1", "PYTHONPATH": str(TESTS)}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "budget",
                           "-p", "no:xdist", "-p", "no:randomly", str(tmp_path / "test_planted.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "2 failed, 1 passed" in out, out
    # the module fixture's time counts for the first test of the module; the numbers depend on the machine
    assert re.search(r"test_planted.py::test_slow_in_its_module_fixture took \d+ s \(setup (?:[3-9]|\d\d+) s \+ call \d+ s\), "
                     r"over the per-test budget of 1 s \(EV1_TEST_BUDGET_S\)", out), out
    assert re.search(r"test_planted.py::test_slow_in_its_call took \d+ s \(setup \d+ s \+ call (?:[3-9]|\d\d+) s\)", out), out
    assert "FAILED test_planted.py::test_fast" not in out, out
