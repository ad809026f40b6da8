"""`easyvideor1 check-data` catches each bad-record class, names the record, and exits non-zero."""

import json
import subprocess
import sys

import numpy as np
import pytest

from easyvideor1.data.checks import check_file
from easyvideor1.vision.encode import write_video
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)


@pytest.fixture
def folder(tmp_path):
    frames = np.zeros((8, 56, 56, 3), dtype=np.uint8)
    frames[:, 10:20, 10:20] = 200
    write_video(tmp_path / "ok.mp4", frames, fps=4)
    (tmp_path / "empty.mp4").write_bytes(b"")
    (tmp_path / "text.mp4").write_text("this is not a video")
    (tmp_path / "corrupt.mp4").write_bytes((tmp_path / "ok.mp4").read_bytes()[:200])
    return tmp_path


GOOD = {"problem": "What colour?", "answer": "A", "problem_type": "multiple choice", "options": ["A. red", "B. blue"],
        "videos": ["ok.mp4"]}
CASES = {
    "unknown problem type": (dict(GOOD, problem_type="dance"), "unknown problem_type 'dance'"),
    "missing options": ({k: v for k, v in GOOD.items() if k != "options"}, "without 'options'"),
    "unreadable answer": (dict(GOOD, problem_type="numerical", answer="many", options=None), "cannot be read"),
    "missing video": (dict(GOOD, videos=["gone.mp4"]), "missing"),
    "zero-byte video": (dict(GOOD, videos=["empty.mp4"]), "empty"),
    "not a video": (dict(GOOD, videos=["text.mp4"]), "text.mp4"),
    "corrupt video": (dict(GOOD, videos=["corrupt.mp4"]), "corrupt.mp4"),
    "no problem_type": ({k: v for k, v in GOOD.items() if k != "problem_type"}, "problem_type"),
    "misspelt options": ({**{k: v for k, v in GOOD.items() if k != "options"}, "optoins": GOOD["options"]},
                         "without 'options' (found 'optoins')"),
    "misspelt videos": ({**{k: v for k, v in GOOD.items() if k != "videos"}, "vidoes": ["ok.mp4"]},
                        "misspelt media field (found 'vidoes')"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_bad_record_class(folder, name):
    record, message = CASES[name]
    path = folder / "data.jsonl"
    rows = [dict(GOOD, problem_id="good1"), dict(record, problem_id="bad"), dict(GOOD, problem_id="good2")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = check_file(str(path))
    assert report.total == 3
    assert {p.index for p in report.problems} == {1}, [str(p) for p in report.problems]
    assert any(message in str(p) for p in report.problems), [str(p) for p in report.problems]
    assert all("record 1 (problem_id=bad)" in str(p) for p in report.problems)


def test_cli_exit_status(folder):
    good, bad = folder / "good.jsonl", folder / "bad.jsonl"
    good.write_text(json.dumps(dict(GOOD, problem_id="g")) + "\n")
    bad.write_text(json.dumps(dict(GOOD, problem_id="b", videos=["gone.mp4"])) + "\n")
    cmd = [sys.executable, "-m", "easyvideor1.cli", "check-data"]
    ok = forkserver.run(cmd + [str(good)], capture_output=True, text=True, timeout=600)  # ends a hang only
    assert ok.returncode == 0 and "1 records checked: OK" in ok.stdout
    fail = forkserver.run(cmd + [str(bad)], capture_output=True, text=True, timeout=600)
    assert fail.returncode == 1 and "gone.mp4" in fail.stdout and "1 bad record(s)" in fail.stdout
