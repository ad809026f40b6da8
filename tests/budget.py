"""A pytest plugin: the suite's time in units of a machine-speed reference, and the tests over a
per-test budget named in the summary.

Machines of one kind differ (an AVX2-only EPYC ran the suite 2.55x slower than the CPU of the
README's figures, ENVIRONMENT.md), so a wall-clock assertion fails a correct test on a slow or busy
machine. Instead the run times a fixed small workload at its start (`easyvideor1.speed`: one-thread
fp32 matmuls and a pure-Python loop, in a fresh interpreter) and prints, beside the CPU line (a
fresh clone, capped to AVX2, on an Intel Xeon):

    reference: 1 unit = 0.63 s here (matmul 0.28 s + Python 0.34 s, one thread)
    suite: wall 26 min 8 s = 2,506 units; CPU 2,828 s = 4,521 units (the workers and every process they waited for)
    over the per-test budget of 300 units (188 s here): none

A test's time is its setup (module fixtures included: the first test of a module pays them) and
call, as `--durations` reports them. The budget (`BUDGET_UNITS`, or `EV1_TEST_BUDGET_UNITS`)
scales with the reference, so a slower machine gets a longer one; a test over it is named, and
fails nothing. A developer who wants a hard limit sets `EV1_TEST_BUDGET_S` (seconds, not scaled):
a test over it then fails, naming itself. Loaded by tests/conftest.py; tests/test_budget.py runs
both on planted slow tests.

CPU time: each xdist worker reports its own CPU and that of every process it started and waited
for (`RUSAGE_CHILDREN`: its test subprocesses, torchrun ranks, vLLM engines, fork servers, when they
are reaped), and the master adds its own. A process nobody waits for (an orphan) is not counted.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import pytest

from easyvideor1.speed import describe_reference

BUDGET_UNITS = 300.0  # ~190 s where 1 unit is 0.63 s (a capped Intel Xeon), longer on a slower CPU
_SETUP = pytest.StashKey[float]()
FALLBACK_UNIT_S = 0.8  # where the reference cannot be measured: about the unit of the README's CPUs
_STATE: dict = {"start": None, "reference": None, "times": {}, "cpu": 0.0}


def hard_budget_s() -> float:
    """`EV1_TEST_BUDGET_S`: a wall-clock limit that fails a test (0 or unset: none)."""
    return float(os.environ.get("EV1_TEST_BUDGET_S") or 0)


def budget_units() -> float:
    return float(os.environ.get("EV1_TEST_BUDGET_UNITS") or BUDGET_UNITS)


def measure_reference() -> dict | None:
    """Time the reference workload (seconds of each part), or None where it cannot run."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:  # a fresh interpreter: this process (xdist's master) imports no torch
        proc = subprocess.run([sys.executable, "-m", "easyvideor1.speed"], capture_output=True, text=True,
                              env=env, timeout=600, check=True)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _cpu_s(who: int | None = None) -> float:
    """CPU seconds of this process and of the children it waited for (`who`: one of the two)."""
    total = 0.0
    for w in ((resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) if who is None else (who,)):
        use = resource.getrusage(w)
        total += use.ru_utime + use.ru_stime
    return total


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config):
    if _is_worker(config):
        return
    _STATE["reference"] = measure_reference()
    _STATE["start"] = time.perf_counter()
    _STATE["cpu0"] = (_cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN))  # the reference is not the suite


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With `EV1_TEST_BUDGET_S` set: a test whose setup + call passes it fails, naming itself."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "setup":
        item.stash[_SETUP] = report.duration
        return
    budget = hard_budget_s()
    if report.when != "call" or not report.passed or budget <= 0:
        return
    setup = item.stash.get(_SETUP, 0.0)
    if setup + report.duration > budget:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {setup + report.duration:.0f} s (setup {setup:.0f} s + call "
                           f"{report.duration:.0f} s), over the per-test budget of {budget:.0f} s "
                           f"(EV1_TEST_BUDGET_S): make it cheaper (fp32 and tiny shapes; bf16 is ~57x slower "
                           f"than fp32 on CPUs without AVX-512) or split it")


def pytest_runtest_logreport(report):
    """Setup + call time per test, where the summary is written (the master under xdist)."""
    if report.when in ("setup", "call"):
        _STATE["times"][report.nodeid] = _STATE["times"].get(report.nodeid, 0.0) + report.duration


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    if _is_worker(session.config):  # trylast: after conftest has stopped the fork servers, so their children count
        session.config.workeroutput["cpu_s"] = _cpu_s()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _STATE["cpu"] += getattr(node, "workeroutput", {}).get("cpu_s", 0.0)


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def summary_lines(times: dict[str, float], reference: dict | None, wall_s: float, cpu_s: float,
                  limit_units: float) -> list[str]:
    """The reference, the suite's wall and CPU time in its units, and the tests over budget."""
    if reference is None:
        lines = ["reference: could not be measured (torch missing?); times in seconds only",
                 f"suite: wall {_minutes(wall_s)}; CPU {cpu_s:,.0f} s"]
        unit = None
    else:
        unit = reference["unit"]
        lines = [f"reference: {describe_reference(reference)}",
                 f"suite: wall {_minutes(wall_s)} = {wall_s / unit:,.0f} units; CPU {cpu_s:,.0f} s = "
                 f"{cpu_s / unit:,.0f} units (the workers and every process they waited for)"]
    scale = unit or FALLBACK_UNIT_S
    limit_s = limit_units * scale
    over = sorted(((t, nodeid) for nodeid, t in times.items() if t > limit_s), reverse=True)
    head = f"over the per-test budget of {limit_units:.0f} units ({limit_s:.0f} s here)"
    if not over:
        return lines + [f"{head}: none"]
    return lines + [f"{head}: {len(over)} (a report, not a failure; EV1_TEST_BUDGET_S=N makes N seconds a limit)"] + [
        f"  {t:.0f} s = {t / scale:.0f} units  {nodeid}" for t, nodeid in over]


def pytest_terminal_summary(terminalreporter):
    config = terminalreporter.config
    if _is_worker(config) or _STATE["start"] is None:
        return
    wall = time.perf_counter() - _STATE["start"]
    own0, kids0 = _STATE["cpu0"]
    cpu = _cpu_s(resource.RUSAGE_SELF) - own0
    if _STATE["cpu"]:  # xdist: the workers' own figures (a reaped worker would count twice in RUSAGE_CHILDREN)
        cpu += _STATE["cpu"]
    else:  # one process ran the tests: its children are theirs
        cpu += _cpu_s(resource.RUSAGE_CHILDREN) - kids0
    for line in summary_lines(_STATE["times"], _STATE["reference"], wall, cpu, budget_units()):
        terminalreporter.write_line(line)
