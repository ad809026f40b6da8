"""The README's main command end to end with a tiny budget (a real subprocess): tiny model,
synthetic data, cache, validation before/after, training, report with plots."""

import json
import os
import subprocess
import sys


def test_demo_runs_end_to_end(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    # The 3 steps end the run; the time budget (set, so the bar shows it) must never end it
    # first, however busy the machine. The timeout only ends a hang.
    proc = subprocess.run([sys.executable, "-m", "easyvideor1.cli", "demo", "--out", str(out), "--steps", "3",
                           "--minutes", "20", "--train-samples", "32", "--val-samples", "16"],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| **classification (mean)** | accuracy |" in proc.stdout
    assert "budget_left=" in proc.stderr  # the bar shows the time budget beside its step ETA
    results = json.loads((out / "train" / "demo_results.json").read_text())
    for task in ("colour", "motion", "count", "presence", "when", "where", "image_colour", "image_count"):
        assert f"val/accuracy/{task}" in results["after"], task
    steps = [json.loads(l)["step"] for l in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    report = out / "train" / "report"
    assert (report / "reward.png").stat().st_size > 1000 and "Validation (greedy)" in (report / "README.md").read_text()
    assert (out / "cache" / "manifest.jsonl").exists() and (out / "train" / "checkpoints").is_dir()
