"""The demo's ETA and `demo --tools` (real subprocesses). The plain demo runs end to end, with
what it writes checked, as getting-started shows it (tests/test_docs_run.py)."""

import json
import os
import subprocess
import sys
import time

import pytest

import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)


def test_eta_warns_when_the_demo_would_pass_15_minutes(capsys):
    from easyvideor1.training.demo import Eta

    # Started 14 minutes ago, 1 s per step, 80 steps left: ~15.3 minutes in all.
    eta = Eta(began=time.monotonic() - 14 * 60, steps=100, tail_s=0.0, first=20)
    for step in range(1, 21):
        eta(step, {"time/wall": 1.0})
    out = capsys.readouterr().out
    assert "[demo] ETA: step 20/100 at 1.00 s/step; training ends in ~1.3 min" in out
    assert "WARNING: the demo will take ~15 min" in out and out.count("WARNING") == 1
    quick = Eta(began=time.monotonic(), steps=100, tail_s=0.0, first=20)
    for step in range(1, 21):
        quick(step, {"time/wall": 1.0})
    assert "WARNING" not in capsys.readouterr().out


@pytest.mark.parametrize("placement", [[], ["--async"]], ids=["colocated", "async"])
def test_demo_with_tools_reports_the_flash_task(tmp_path, placement):
    """`demo --tools` (and `--async`: a rollout process runs the tool loop): the flash task joins
    the suite, its rollouts may call crop_video, and demo_results.json reports flash's accuracy
    and tool-call rate (a tiny budget: the wiring)."""
    out = tmp_path / "demo"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = forkserver.run([sys.executable, "-m", "easyvideor1.cli", "demo", "--tools", *placement, "--out", str(out),
                           "--steps", "2", "--train-samples", "22", "--val-samples", "9"],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| flash | accuracy | 0.25 |" in proc.stdout and "| flash | tool-call rate |" in proc.stdout
    results = json.loads((out / "train" / "demo_results.json").read_text())
    for when in ("before", "after"):
        assert {"val/accuracy/flash", "val/tool_call_rate/flash"} <= set(results[when]), when
    val = [json.loads(line) for line in (out / "data" / "val.jsonl").read_text().splitlines()]
    assert sum(row["problem_id"].endswith("-flash") for row in val) == 1
    assert all(row["tools"] == (["crop_video"] if row["task"] == "flash" else []) for row in val)  # per sample
    metrics = [json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    assert all("tools/calls_per_response" in m for m in metrics)
