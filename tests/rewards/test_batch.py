"""Batch scoring: process pool, per-sample timeout, counted errors, metrics per problem_type."""

import glob
import logging
import os
import tempfile
import time

import pytest

from easyvideor1.records import RewardResult, Sample
from easyvideor1.rewards import RewardConfig
from easyvideor1.rewards.batch import ScoringPool, metrics_by_type, score_batch

HANG = "<think>.</think><answer>\n```python\nimport time\ndef add(a, b):\n    time.sleep(60)\n```\n</answer>"
GOOD_CODE = "<think>.</think><answer>\n```python\ndef add(a, b):\n    return a + b\n```\n</answer>"


def mixed():
    samples = [
        Sample(
            problem="q",
            answer="B",
            problem_type="multiple choice",
            options=["A. x", "B. y"],
            problem_id="mc",
        ),
        Sample(problem="q", answer="4", problem_type="numerical", problem_id="num"),
        Sample(
            problem="q",
            answer="def add(a, b): return a + b",
            problem_type="code",
            problem_id="slow",
            extra={"tests": ["assert add(1, 2) == 3"]},
        ),
        Sample(
            problem="q",
            answer="not a letter",
            problem_type="multiple choice",
            options=["A. x"],
            problem_id="broken",
        ),
        Sample(problem="q", answer="[0, 10]", problem_type="temporal grounding", problem_id="tg"),
    ]
    responses = ["<think>.</think><answer>B</answer>", "<think>.</think><answer>5</answer>", HANG,
                 "<think>.</think><answer>A</answer>", "<think>.</think><answer>[0, 5]</answer>"]  # fmt: skip
    return responses, samples


# The pool's per-sample limit in these tests. A sample's clock starts when it is handed to a
# worker, so a fresh worker's start-up counts (~0.5 s idle, a few seconds with the cores busy);
# the limit must stay well above that, and the hanging sample costs exactly this long.
POOL_TIMEOUT_S = 10


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """The pool's scratch folders (and so its sandboxes' homes) go under this test's tmp_path:
    other test runs on the same machine have sandboxes and scratch folders of their own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_pool_with_timeout_and_errors(caplog, scratch):
    responses, samples = mixed()
    cfg = RewardConfig(code_timeout_s=60)  # the sandbox would wait: the pool's limit must cut it
    with caplog.at_level(logging.WARNING):
        results = score_batch(responses, samples, cfg, workers=2, timeout_s=POOL_TIMEOUT_S)
    # (HANG sleeps 60 s: its TimeoutError below can only come from the pool's limit)
    assert [r.accuracy for r in results] == [1.0, 0.0, 0.0, 0.0, 0.5]
    assert results[0].overall == pytest.approx(1.0) and results[1].overall == pytest.approx(0.1)
    assert "TimeoutError" in results[2].error and "'slow'" in results[2].error
    assert "ValueError" in results[3].error and "'broken'" in results[3].error
    assert results[0].error is None and results[4].error is None
    assert "'slow'" in caplog.text and "'broken'" in caplog.text  # logged, not silent
    assert _sandbox_processes_gone(scratch), "the timed-out sample's sandbox process outlived its worker"
    assert not glob.glob(os.path.join(scratch, "ev1-score-*"))

    metrics = metrics_by_type(results, samples)
    assert metrics["multiple choice"].count == 2 and metrics["multiple choice"].errors == 1
    assert metrics["multiple choice"].accuracy == pytest.approx(0.5)
    assert metrics["code"].errors == 1 and metrics["all"].errors == 2 and metrics["all"].count == 5
    assert metrics["all"].format == pytest.approx((1 + 1 + 0 + 0 + 1) / 5)


def _sandbox_processes_gone(scratch, wait_s=60.0):
    """True as soon as no sandbox process whose home lies under `scratch` is alive (a poll:
    `wait_s` only bounds how long a kill may take to land)."""
    home = f"HOME={scratch}{os.sep}".encode()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        alive = []
        for proc in glob.glob("/proc/[0-9]*"):
            try:
                with open(f"{proc}/cmdline", "rb") as f:
                    cmdline = f.read()
                with open(f"{proc}/environ", "rb") as f:
                    environ = f.read()
            except OSError:
                continue
            if b"RLIMIT_AS" in cmdline and b"SETUP" in cmdline and home in environ:
                alive.append(proc)
        if not alive:
            return True
        time.sleep(0.1)
    return False


def test_in_process_matches_pool():
    responses, samples = mixed()
    del responses[2], samples[2]
    assert score_batch(responses, samples, workers=0) == score_batch(responses, samples, workers=2)


def test_pool_is_reused_and_replaces_a_killed_worker(scratch):
    responses, samples = mixed()
    with ScoringPool(RewardConfig(code_timeout_s=60), workers=2, timeout_s=POOL_TIMEOUT_S) as pool:
        pids = sorted(slot.proc.pid for slot in pool._slots)
        first = pool.score(responses[:2], samples[:2])
        assert sorted(slot.proc.pid for slot in pool._slots) == pids  # same workers, no respawn
        second = pool.score(responses[2:3] + responses[:2], samples[2:3] + samples[:2])
        assert "TimeoutError" in second[0].error and second[1:] == first
        assert len(set(slot.proc.pid for slot in pool._slots) - set(pids)) == 1  # one replaced
        assert all(slot.proc.is_alive() for slot in pool._slots)
    assert _sandbox_processes_gone(scratch)


def test_unknown_type_fails_fast_naming_the_sample():
    samples = [
        Sample(problem="q", answer="1", problem_type="numerical"),
        Sample(problem="q", answer="1", problem_type="poem", problem_id="p9"),
    ]
    with pytest.raises(ValueError, match="p9.*poem"):
        score_batch(["1", "1"], samples, workers=0)


def test_length_mismatch():
    with pytest.raises(ValueError, match="2 responses for 1 samples"):
        score_batch(["a", "b"], [Sample(problem="q", answer="1", problem_type="numerical")])


def test_metrics_hand_computed():
    samples = [Sample(problem="q", answer="1", problem_type=t) for t in ("a", "a", "b")]
    results = [
        RewardResult(1.0, 1.0, 1.0),
        RewardResult(0.1, 0.0, 1.0),
        RewardResult(0.0, 0.0, 0.0, error="x"),
    ]
    m = metrics_by_type(results, samples)
    assert (m["a"].count, m["a"].reward, m["a"].accuracy, m["a"].format, m["a"].errors) == (
        2,
        0.55,
        0.5,
        1.0,
        0,
    )
    assert (m["b"].errors, m["all"].count) == (1, 3) and m["all"].reward == pytest.approx(1.1 / 3)
