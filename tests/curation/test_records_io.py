"""The curation outputs' bookkeeping, without a model: ids as the loader gives them, a partial
last line cut on re-open, settings refused on resume."""

from __future__ import annotations

import json

import pytest

from easyvideor1.curation.records_io import CurationSettingsMismatch, IdLog, check_run_settings, stream_records
from easyvideor1.data.loading import load_records


def test_streamed_ids_are_the_loaders(tmp_path):
    rows = [{"problem_id": "a", "problem": "q", "answer": "1", "problem_type": "numerical"},
            {"problem": "q", "answer": "2", "problem_type": "numerical"},
            {"problem_id": "a", "problem": "q", "answer": "3", "problem_type": "numerical"},
            {"problem_id": "b", "problem": "q", "problem_type": "numerical"}]  # no answer: malformed
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{not json\n")
    streamed = list(stream_records(path))
    loaded = load_records(path)
    assert [r.id for r in streamed if r.sample] == [s.problem_id for s in loaded.samples] == ["a", "1", "a#2"]
    assert [r.raw for r in streamed[:3]] == rows[:3]  # the records as read, for filtered.jsonl
    bad = [r for r in streamed if r.sample is None]
    assert [r.id for r in bad] == ["b", "4"] and "answer" in bad[0].problem and "JSON" in bad[1].problem


def test_id_log_cuts_a_partial_last_line_and_refuses_repeats(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "x", "v": 1}\n{"id": "y", "v"')  # killed while writing y
    log = IdLog(path)
    assert log.ids == {"x"} and path.read_text() == '{"id": "x", "v": 1}\n'
    log.append({"id": "y", "v": 2})
    with pytest.raises(ValueError, match="already written"):
        log.append({"id": "x", "v": 3})
    log.close()
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["x", "y"]


def test_resume_under_other_settings_is_refused(tmp_path):
    path = tmp_path / "settings.json"
    check_run_settings(path, {"k": 8, "temperature": 1.0})
    check_run_settings(path, {"temperature": 1.0, "k": 8})  # same settings: fine
    with pytest.raises(CurationSettingsMismatch, match=r"k: 8 != 4"):
        check_run_settings(path, {"k": 4, "temperature": 1.0})
