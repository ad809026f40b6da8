"""The results store: append + flush per row, resume by id after a truncated last line or a
SIGKILL, refusal of corrupt files, and the settings-hash checks on resume and comparison."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys

import pytest

from easyvideor1.evaluation import presets
from easyvideor1.evaluation.results import (
    ResultRow,
    ResultStore,
    SettingsMismatch,
    check_comparable,
    check_settings,
    read_results,
)
from easyvideor1.records import Sample
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)


def sample(i: int) -> Sample:
    return Sample(problem=f"q{i}", answer="A", problem_type="multiple choice", problem_id=f"id{i}")


def ok(i: int, score: float = 1.0) -> ResultRow:
    return ResultRow(id=f"id{i}", status="ok", score=score, prediction="A", response="<answer>A</answer>")


def test_resume_after_a_truncated_last_line(tmp_path):
    store = ResultStore.open(tmp_path, "videomme")
    for i in range(3):
        store.append(ok(i))
    store.close()
    path = tmp_path / "videomme.jsonl"
    with open(path, "a", encoding="utf-8") as f:  # a process killed while writing row id3
        f.write(ok(3).to_json()[:25])
    resumed = ResultStore.open(tmp_path, "videomme")
    assert resumed.done_ids() == {"id0", "id1", "id2"}
    samples = [sample(i) for i in range(5)]
    assert [s.problem_id for s in resumed.pending(samples)] == ["id3", "id4"]
    for s in resumed.pending(samples):
        resumed.append(ok(int(s.problem_id[2:])))
    resumed.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["id"] for line in lines] == [f"id{i}" for i in range(5)]


def test_report_reading_does_not_modify_a_partial_file(tmp_path):
    path = tmp_path / "lvbench.jsonl"
    path.write_text(ok(0).to_json() + "\n" + '{"id": "id1", "sta', encoding="utf-8")
    before = path.read_bytes()
    assert [r.id for r in read_results(tmp_path)["lvbench"]] == ["id0"]
    assert path.read_bytes() == before


def test_corrupt_middle_line_and_duplicate_ids_are_errors(tmp_path):
    path = tmp_path / "mvbench.jsonl"
    path.write_text(ok(0).to_json() + "\nnot json\n" + ok(1).to_json() + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="mvbench.jsonl line 2 is not a result row"):
        ResultStore(path)
    path.write_text(ok(0).to_json() + "\n" + ok(0).to_json() + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'id0' is written twice"):
        ResultStore(path)
    store = ResultStore(tmp_path / "new.jsonl")
    store.append(ok(0))
    with pytest.raises(ValueError, match="already has a result"):
        store.append(ok(0))


def test_failed_rows_need_a_reason_and_stay_in_the_denominator(tmp_path):
    with pytest.raises(ValueError, match="needs a reason"):
        ResultRow(id="x", status="failed")
    with pytest.raises(ValueError, match="outside"):
        ResultRow(id="x", status="ok", score=1.5)
    from easyvideor1.evaluation.aggregate import accuracy

    rows = [ok(0), ok(1, 0.0), ResultRow.failed(sample(2), "corrupt video: moov atom not found")]
    agg = accuracy("lvbench", rows)
    assert (agg.overall, agg.count, agg.failed) == (pytest.approx(1 / 3), 3, 1)


WRITER = """
import sys, time
from easyvideor1.evaluation.results import ResultRow, ResultStore
store = ResultStore.open(sys.argv[1], "holmes")
for i in range(300):
    if f"id{i}" in store.done_ids():
        continue
    store.append(ResultRow(id=f"id{i}", status="ok", score=1.0, response="x" * 2000))
    print(i, flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_sigkill_mid_run_then_resume_writes_each_sample_exactly_once(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    # 0.1 s per row: the whole run would take 30 s, so the kill lands mid-run unless this process
    # stalls for that long after the 20th row.
    proc = forkserver.Popen([sys.executable, str(script), str(tmp_path), "0.1"], stdout=subprocess.PIPE, text=True)
    for _ in range(20):  # let it write some rows
        proc.stdout.readline()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    written = len(ResultStore(tmp_path / "holmes.jsonl").done_ids())
    assert 20 <= written < 300
    rerun = forkserver.run([sys.executable, str(script), str(tmp_path), "0"], check=False, capture_output=True,
                           text=True, timeout=600)  # ends a hang only
    assert rerun.returncode == 0, rerun.stderr
    ids = [json.loads(line)["id"] for line in (tmp_path / "holmes.jsonl").read_text().splitlines()]
    assert sorted(ids) == sorted(f"id{i}" for i in range(300)) and len(ids) == 300


def test_resume_with_other_settings_is_refused_listing_them(tmp_path):
    base = presets.settings("qwen3_vl", "models/a")
    check_settings(tmp_path, base)  # first run writes settings.json
    check_settings(tmp_path, presets.settings("qwen3_vl", "models/a"))  # same settings: fine
    other = dataclasses.replace(base, vision=dataclasses.replace(base.vision, fps=1.0), engine="hf")
    with pytest.raises(SettingsMismatch) as e:
        ResultStore.open(tmp_path, "videomme", other)
    assert "vision.fps: 2.0 != 1.0" in str(e.value) and "engine: 'vllm' != 'hf'" in str(e.value)
    assert "sampling" not in str(e.value)  # only the differing settings are listed


def test_comparison_needs_the_same_protocol_but_not_the_same_model(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    check_settings(a, presets.settings("qwen3_vl", "models/base"))
    check_settings(b, presets.settings("qwen3_vl", "models/rl-step-200"))
    check_settings(c, presets.settings("qwen3_vl_greedy", "models/rl-step-200"))
    check_comparable(a, b)
    with pytest.raises(SettingsMismatch, match="sampling.temperature: 0.7 != 0.0"):
        check_comparable(a, c)
