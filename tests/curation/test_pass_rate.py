"""`easyvideor1 pass-rate` on the synthetic suite with a tiny model: SIGKILL and resume (a real
subprocess), pass rates against rewards recomputed from the stored responses, --min/--max."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

from curationfixtures import TINY

from easyvideor1.cli import main
from easyvideor1.data.loading import load_samples
from easyvideor1.rewards import score
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

K = 4
TIMEOUT_S = 300


def _command(inputs, out, *extra):
    return ["pass-rate", "--model", str(inputs["teacher"]), "--data", str(inputs["data"]), "--out", str(out),
            "--k", str(K), "--engine", "hf", "--max-tokens", "1", *TINY, *extra]


def _rows(out):
    return [json.loads(line) for line in (out / "pass_rates.jsonl").read_text().splitlines()]


def test_sigkill_then_rerun_writes_every_sample_once(curation_inputs, fresh):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    # one sample per batch and one load ahead: the run lasts long enough to be killed in the middle
    slow = ["--load-workers", "1", "--prefetch", "1", "--max-batch", str(K)]
    argv = [sys.executable, "-m", "easyvideor1.cli", *_command(curation_inputs, fresh, *slow)]
    proc = forkserver.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rates = fresh / "pass_rates.jsonl"
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if rates.exists() and rates.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = rates.read_bytes().count(b"\n")
    assert 2 <= first < len(curation_inputs["ids"]), f"killed after {first} rows: not in the middle"

    proc = forkserver.run(argv, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "sample/s" in proc.stderr or "s/sample" in proc.stderr  # the progress bar shows the rate
    ids = [r["id"] for r in _rows(fresh)]
    assert Counter(ids) == Counter(curation_inputs["ids"])  # every sample exactly once
    assert "| all | 13 |" in proc.stdout

    # the corrupt video is reported with its file, the rest are scored
    failed = {r["id"]: r["reason"] for r in _rows(fresh) if r["status"] == "failed"}
    assert list(failed) == ["corrupt-video"] and "corrupt.mp4" in failed["corrupt-video"]


def test_pass_rates_are_mean_accuracies_and_min_max_filter(curation_inputs, fresh, capsys):
    assert main(_command(curation_inputs, fresh, "--score-workers", "0")) == 0
    samples = {s.problem_id: s for s in load_samples(curation_inputs["data"])}
    rows = [r for r in _rows(fresh) if r["status"] == "ok"]
    assert len(rows) == 12
    for row in rows:  # recomputed here, one response at a time, through the dispatcher
        results = [score(text, samples[row["id"]]) for text in row["responses"]]
        assert len(results) == K
        assert abs(row["pass_rate"] - sum(r.accuracy for r in results) / K) < 1e-9, row
        assert row["rewards"] == [r.overall for r in results]
    rates = {r["id"]: r["pass_rate"] for r in rows}
    assert any(0 < v < 1 for v in rates.values()), rates
    assert any(v == 0 for v in rates.values())  # the numerical task is never solved by letters

    def expected(lo, hi):
        return [r for r in curation_inputs["records"] if lo < rates.get(r["problem_id"], -1) < hi]

    def filtered():
        return [json.loads(line) for line in (fresh / "filtered.jsonl").read_text().splitlines()]

    assert filtered() == expected(0.0, 1.0) and filtered()  # the input records, unchanged, in order
    summary = json.loads((fresh / "summary.json").read_text())
    assert summary["types"]["numerical"]["never_solved"] == 3
    assert summary["failed"][0]["id"] == "corrupt-video"
    for ptype in ("multiple_choice", "numerical"):
        assert (fresh / f"pass_rate_{ptype}.png").read_bytes()[:4] == b"\x89PNG"

    # a re-run resumes (nothing left to generate) and re-filters with other bounds
    lo, hi = 0.25, 0.75
    assert main(_command(curation_inputs, fresh, "--score-workers", "0", "--min", str(lo), "--max", str(hi))) == 0
    assert Counter(r["id"] for r in _rows(fresh)) == Counter(curation_inputs["ids"])
    assert filtered() == expected(lo, hi)
    assert f"kept ({lo:g} < rate < {hi:g})" in capsys.readouterr().out

    # settings that change the responses are refused on resume
    assert main(_command(curation_inputs, fresh, "--score-workers", "0", "--temperature", "0.5")) == 2
    assert "temperature" in capsys.readouterr().err
