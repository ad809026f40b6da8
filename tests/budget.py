"""A pytest plugin: a test whose setup + call takes longer than a budget fails, naming itself.

The suite must finish in 15 minutes on 2 slow cores (no AVX-512, bf16 ~57x slower than fp32), so
a test that grows is found when it is added, not when CI times out. The budget counts wall time
of the test's setup (module fixtures included: the first test of a module pays them) and call,
as pytest's `--durations` reports them; it is meant for a run alone, as CI runs.
`EV1_TEST_BUDGET_S` sets it (default 240 s; `scripts/test_under_load.sh` raises it, since busy
loops beside the suite take a share of the cores; 0 turns it off). Loaded by tests/conftest.py;
tests/test_budget.py checks that a planted slow test fails.
"""

from __future__ import annotations

import os

import pytest

DEFAULT_BUDGET_S = 240.0
_SETUP = pytest.StashKey[float]()


def budget_s() -> float:
    return float(os.environ.get("EV1_TEST_BUDGET_S", DEFAULT_BUDGET_S))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "setup":
        item.stash[_SETUP] = report.duration
        return
    budget = budget_s()
    if report.when != "call" or not report.passed or budget <= 0:
        return
    setup = item.stash.get(_SETUP, 0.0)
    if setup + report.duration > budget:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {setup + report.duration:.0f} s (setup {setup:.0f} s + call "
                           f"{report.duration:.0f} s), over the per-test budget of {budget:.0f} s "
                           f"(EV1_TEST_BUDGET_S): make it cheaper (fp32 and tiny shapes; bf16 is ~57x slower "
                           f"than fp32 on CPUs without AVX-512) or split it")
