"""Every reported number against hand computation, on fixed hand-made predictions.

1. The real converted annotation files (../shared/benchmark-annotations, skipped when absent):
   for each benchmark, its first four records get a right answer (the ground truth), a wrong
   one, a malformed one ("I am not sure.") and none (generation failed). Right scores 1, the
   other three 0 and the last is failed, so every table below was worked out by hand from the
   records' labels (listed next to each expectation).
2. OVO-Bench's forward test points under the official per-point rule (OVOBenchScore.py).
3. The official-layout importers (LVBench, LongVideoBench, Video-Holmes, MLVU, MINERVA,
   LongVideo-Reason), on small files written here in each release's own format.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_annotations import ROOT, needs_annotations

from easyvideor1.data.loading import DataError
from easyvideor1.evaluation.adapters import BENCHMARKS
from easyvideor1.evaluation.results import ResultRow
from easyvideor1.records import Sample

Q = 0.25  # one right of four


def wrong(sample: Sample) -> str:
    """A response scoring 0 for the first records of these files (checked row by row below)."""
    from easyvideor1.rewards.multiple_choice import extract_letter, option_map
    from easyvideor1.rewards.numerical import read_truth

    kind = sample.problem_type
    if kind == "multiple choice":
        truth = extract_letter(sample.answer, sample.options)
        return f"<answer>{next(k for k in [*option_map(sample.options), *'ABCDEFGHIJ'] if k != truth)}</answer>"
    if kind in ("numerical", "regression"):
        return f"<answer>{read_truth(sample, kind).value * 3 + 7}</answer>"
    if kind in ("temporal grounding", "spatial-temporal grounding"):
        return '<answer>{"time": [100000, 100001], "boxes": {}}</answer>'
    return "<answer>zebra quantum lighthouse</answer>"


def right(sample: Sample) -> str:
    return sample.answer if "<answer>" in sample.answer or "<think>" in sample.answer else f"<answer>{sample.answer}</answer>"


def four_rows(bench, samples):
    rows = [bench.result_row(samples[0], right(samples[0])), bench.result_row(samples[1], wrong(samples[1])),
            bench.result_row(samples[2], "I am not sure."), bench.failed_row(samples[3], "generation failed: timeout")]
    assert [(r.status, r.score) for r in rows] == [("ok", 1.0), ("ok", 0.0), ("ok", 0.0), ("failed", 0.0)]
    return rows


# benchmark, file -> (overall, metrics, {breakdown: {label: (score, count, failed)}}); labels of the
# four records in order are in the comments (the failed one is the fourth)
EXPECTED = {
    # duration short x4; domain Knowledge x4; task Counting, Synopsis, Counting, Object Recognition
    ("videomme", "videomme.json"): (Q, {}, {
        "duration": {"short": (Q, 4, 1)}, "domain": {"Knowledge": (Q, 4, 1)},
        "task_type": {"Counting Problem": (0.5, 2, 0), "Information Synopsis": (0.0, 1, 0),
                      "Object Recognition": (0.0, 1, 1)}}),
    ("mvbench", "mvbench.json"): (Q, {"micro": Q}, {"task": {"action_antonym": (Q, 4, 1)}}),
    # Action Order, Motion-related Objects, Repetition Count, Location-related Motion
    ("motionbench", "motionbench.json"): (Q, {}, {"question_type": {
        "Action Order": (1.0, 1, 0), "Motion-related Objects": (0.0, 1, 0), "Repetition Count": (0.0, 1, 0),
        "Location-related Motion": (0.0, 1, 1)}}),
    ("lvbench", "lvbench.json"): (Q, {}, {}),  # the converted file keeps no question types
    ("longvideobench", "longvideobench.json"): (Q, {}, {}),
    ("mlvu", "mlvu.json"): (Q, {}, {"source": {"surveil": (Q, 4, 1)}}),
    ("mlvu-dev", "mlvu-dev.json"): (Q, {}, {"source": {"needle": (Q, 4, 1)}}),
    ("holmes", "holmes.json"): (Q, {}, {}),
    ("minerva", "minerva.json"): (Q, {}, {}),  # no skills or domains: a note names the release file
    # open-ended x3 then one multiple choice, all videoEspresso; the wrong and malformed answers
    # are open-ended and scored by ROUGE (no judge): the note says so
    ("vcrbench", "vcrbench.json"): (Q, {}, {
        "question_type": {"open-ended": (1 / 3, 3, 0), "multiple choice": (0.0, 1, 1)},
        "video_source": {"videoEspresso": (Q, 4, 1)}}),
    ("videoreasonbench", "videoreasonbench.json"): (Q, {}, {"scene": {"card": (Q, 4, 1)}}),
    # no perspective (a note names the release file); no response has <think>: format 0
    ("longvideoreason", "longvideoreason.json"): (Q, {"format_accuracy": 0.0}, {}),
    # Chemistry, Thermodynamics, Materials_Science, Electromagnetism
    ("mmvu", "mmvu.json"): (Q, {}, {"discipline": {
        "Chemistry": (1.0, 1, 0), "Thermodynamics": (0.0, 1, 0), "Materials_Science": (0.0, 1, 0),
        "Electromagnetism": (0.0, 1, 1)}}),
    ("mmvu-all", "mmvu-all.json"): (Q, {}, {
        "question_type": {"multiple choice": (Q, 4, 1)},
        "discipline": {"Chemistry": (1.0, 1, 0), "Thermodynamics": (0.0, 1, 0), "Materials_Science": (0.0, 1, 0),
                       "Electromagnetism": (0.0, 1, 1)}}),
    # Adaptation x4; Biology, Geography x3
    ("videommmu", "videommmu_with_image.json"): (Q, {}, {
        "track": {"Adaptation": (Q, 4, 1)}, "subject": {"Biology": (1.0, 1, 0), "Geography": (0.0, 3, 1)}}),
    ("videommmu", "videommmu.json"): (Q, {}, {
        "track": {"Adaptation": (Q, 4, 1)}, "subject": {"Biology": (1.0, 1, 0), "Geography": (0.0, 3, 1)}}),
    # Counting/long, Puzzle/medium, Chart/long, Geometry Length/medium; four different questions, so
    # MBin (all of a question's rotations right) is 0 for each
    ("videomathqa", "videomathqa.jsonl"): (Q, {"micro": Q, "mbin": 0.0}, {
        "category": {"Counting": (1.0, 1, 0), "Puzzle": (0.0, 1, 0), "Chart": (0.0, 1, 0),
                     "Geometry Length": (0.0, 1, 1)},
        "length": {"long": (0.5, 2, 0), "medium": (0.0, 2, 1)}}),
    # four object-counting regression records: MRA 1, 0, 0, 0; no multiple-choice record
    ("vsibench", "vsibench.json"): (Q, {"mra": Q, "mc_accuracy": 0.0, "micro": Q}, {
        "question_type": {"object_counting": (Q, 4, 1)}}),
    # IoU 1, 0, 0, 0: recall at every threshold is 1/4
    ("charades_sta", "charades_sta.json"): (Q, {"R@0.3": Q, "R@0.5": Q, "R@0.7": Q}, {}),
    ("stvg", "stvg.json"): (Q, {"m_tIoU": Q, "mIoU": Q}, {}),
    ("ovobench", "ovobench.json"): (Q, {"micro": Q}, {"mode": {"backward": (Q, 4, 1)}, "task": {"EPM": (Q, 4, 1)}}),
    # When, Who, When, What; no ocr x4
    ("livesports3k_qa", "livesports3k_qa.json"): (Q, {}, {
        "question_type": {"When": (0.5, 2, 0), "Who": (0.0, 1, 0), "What": (0.0, 1, 1)},
        "ocr": {"no ocr": (Q, 4, 1)}}),
}


def _check(agg, overall, metrics, categories, count, failed):
    assert agg.overall == pytest.approx(overall) and (agg.count, agg.failed) == (count, failed)
    assert agg.metrics == pytest.approx(metrics)
    got = {name: {k: (c.score, c.count, c.failed) for k, c in table.items()}
           for name, table in agg.categories.items() if table}
    assert got.keys() == categories.keys()
    for name, table in categories.items():
        assert got[name].keys() == table.keys(), name
        for label, (score, n, bad) in table.items():
            assert got[name][label][0] == pytest.approx(score) and got[name][label][1:] == (n, bad), (name, label)


@needs_annotations
@pytest.mark.parametrize("name, file", list(EXPECTED))
def test_hand_made_predictions_on_real_files(name, file):
    bench = BENCHMARKS[name]
    samples = bench.load(ROOT, annotation_file=ROOT / file)[:4]
    agg = bench.aggregate(four_rows(bench, samples))
    _check(agg, *EXPECTED[(name, file)], count=4, failed=1)
    rouge_note = name in ("vcrbench", "videoreasonbench")
    release_note = {"minerva": "minerva.json", "longvideoreason": "test.jsonl"}.get(name)
    assert bool(agg.notes) == (rouge_note or bool(release_note)) and (not rouge_note or "ROUGE" in agg.metric)
    assert not release_note or (len(agg.notes) == 1 and "overall only" in agg.notes[0] and release_note in agg.notes[0])


@needs_annotations
def test_ovobench_forward_points_by_the_official_rule():
    bench = BENCHMARKS["ovobench"]
    by_id = {s.problem_id: s for s in bench.load(ROOT, annotation_file=ROOT / "ovobench.json")}
    plan = [  # (test point, ground truth, response, official score)
        ("ovo_1558_0", "1", "<answer>It happened 1 time</answer>", 1.0),  # REC: digits joined == "1"
        ("ovo_1558_1", "1", "<answer>1 or 2</answer>", 0.0),  # "12" != "1"
        ("ovo_1516_0", "Yes", "<answer>Y</answer>", 1.0),  # SSR: the Y/N shortcut
        ("ovo_1516_1", "Yes", "<answer>yes</answer>", 0.0),  # "Yes" in "yes": case-sensitive, no
        ("ovo_1516_2", "No", "<think>not yet</think><answer>No, not yet</answer>", 1.0),
        ("ovo_1468_0", "No", "I cannot tell.", 0.0),  # CRR, malformed
        ("ovo_1468_1", "No", "<answer>N</answer>", 1.0),
        ("ovo_1468_2", "Yes", "<answer>No</answer>", 0.0),
    ]
    rows = []
    for pid, truth, response, expected in plan:
        s = by_id[pid]
        assert s.answer.endswith(f"<answer>{truth}</answer>") or s.answer == truth, pid
        rows.append(bench.result_row(s, response))
        assert rows[-1].score == expected, (pid, rows[-1])
    rows.append(bench.failed_row(by_id["ovo_1558_2"], "generation failed"))  # REC, missing
    agg = bench.aggregate(rows)
    # REC 1/3 (1558_0 of 1558_0-2), SSR 2/3, CRR 1/3; forward = their mean 4/9 = overall
    _check(agg, 4 / 9, {"micro": 4 / 9, "forward_per_question": 4 / 9},
           {"mode": {"forward": (4 / 9, 9, 1)},
            "task": {"REC": (1 / 3, 3, 1), "SSR": (2 / 3, 3, 0), "CRR": (1 / 3, 3, 0)}}, count=9, failed=1)


def _write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in data))
    else:
        path.write_text(json.dumps(data))
    return path


def test_lvbench_official_question_types_count_a_question_in_each_type(tmp_path):
    meta = [
        {"key": "vidA", "type": "cartoon", "qa": [
            {"uid": 1, "question": "What year?\n(A) 1636\n(B) 1366\n(C) 1363\n(D) 1633", "answer": "D",
             "question_type": ["key information retrieval"], "time_reference": "00:15-00:19"},
            {"uid": 2, "question": "Who speaks first?\n(A) a\n(B) b\n(C) c\n(D) d", "answer": "A",
             "question_type": ["entity recognition", "reasoning"], "time_reference": ""}]},
        {"key": "vidB", "type": "sports", "qa": [
            {"uid": 3, "question": "Why?\n(A) a\n(B) b\n(C) c\n(D) d", "answer": "B",
             "question_type": ["reasoning"], "time_reference": ""},
            {"uid": 4, "question": "When?\n(A) a\n(B) b\n(C) c\n(D) d", "answer": "C",
             "question_type": ["temporal grounding", "reasoning"], "time_reference": ""}]},
    ]
    _write(tmp_path / "data" / "video_info.meta.jsonl", meta)
    (tmp_path / "videos").mkdir()
    (tmp_path / "videos" / "vidA.mp4").write_bytes(b"")
    bench = BENCHMARKS["lvbench"]
    samples = bench.load(tmp_path)
    assert [s.problem_id for s in samples] == ["1", "2", "3", "4"]
    assert samples[0].problem == "What year?" and samples[0].options == ["A. 1636", "B. 1366", "C. 1363", "D. 1633"]
    assert samples[0].videos == [str(tmp_path / "videos" / "vidA.mp4")]
    rows = [bench.result_row(samples[0], "<answer>D</answer>"),  # right: KIR
            bench.result_row(samples[1], "<answer>B</answer>"),  # wrong: ER, reasoning
            bench.result_row(samples[2], "I am not sure."),  # malformed: reasoning
            bench.failed_row(samples[3], "generation failed")]  # missing: TG, reasoning
    agg = bench.aggregate(rows)
    # overall 1/4; reasoning holds questions 2, 3, 4 (0 right); each other type one question
    _check(agg, Q, {}, {
        "question_type": {"key information retrieval": (1.0, 1, 0), "entity recognition": (0.0, 1, 0),
                          "reasoning": (0.0, 3, 1), "temporal grounding": (0.0, 1, 1)},
        "video_type": {"cartoon": (0.5, 2, 0), "sports": (0.0, 2, 1)}}, count=4, failed=1)


def test_longvideobench_official_duration_groups_and_categories(tmp_path):
    records = [
        {"id": "q1", "video_path": "v1.mp4", "question": "What?", "candidates": ["x", "y", "z"], "correct_choice": 2,
         "duration_group": 15, "question_category": "S2E"},
        {"id": "q2", "video_path": "v2.mp4", "question": "Who?", "candidates": ["x", "y"], "correct_choice": 0,
         "duration_group": 600, "question_category": "S2E"},
        {"id": "q3", "video_path": "v3.mp4", "question": "Where?", "candidates": ["x", "y", "z", "w"],
         "correct_choice": 3, "duration_group": 600, "question_category": "T3O"},
        {"id": "q4", "video_path": "v4.mp4", "question": "How?", "candidates": ["x", "y"], "correct_choice": 1,
         "duration_group": 3600, "question_category": "T3O"},
    ]
    _write(tmp_path / "lvb_val.json", records)
    bench = BENCHMARKS["longvideobench"]
    samples = bench.load(tmp_path)
    assert [s.answer for s in samples] == ["C", "A", "D", "B"] and samples[0].options == ["A. x", "B. y", "C. z"]
    assert samples[0].videos == [str(tmp_path / "videos" / "v1.mp4")]
    rows = [bench.result_row(samples[0], "<answer>C</answer>"), bench.result_row(samples[1], "<answer>B</answer>"),
            bench.result_row(samples[2], "hmm"), bench.failed_row(samples[3], "generation failed")]
    _check(bench.aggregate(rows), Q, {}, {
        "duration_group": {"15": (1.0, 1, 0), "600": (0.0, 2, 0), "3600": (0.0, 1, 1)},
        "question_category": {"S2E": (0.5, 2, 0), "T3O": (0.0, 2, 1)}}, count=4, failed=1)
    _write(tmp_path / "test" / "lvb_val.json", [{k: v for k, v in records[0].items() if k != "correct_choice"}])
    with pytest.raises(ValueError, match="withholds answers"):
        bench.load(tmp_path / "test")


def test_holmes_official_question_types(tmp_path):
    def rec(qid, qtype, answer):
        return {"video ID": "vid", "Question ID": qid, "Question Type": qtype, "Question": "Why?",
                "Options": {"A": "a", "B": "b", "C": "c", "D": "d", "E": "e", "F": "f"}, "Answer": answer,
                "Explanation": "..."}

    _write(tmp_path / "test_Video-Holmes.json", [rec("1", "SR", "F"), rec("2", "SR", "A"), rec("3", "TCI", "B"),
                                                  rec("4", "MHR", "C")])
    bench = BENCHMARKS["holmes"]
    samples = bench.load(tmp_path)
    assert samples[0].options[5] == "F. f" and samples[0].videos == [str(tmp_path / "videos" / "vid.mp4")]
    rows = [bench.result_row(samples[0], "<answer>F</answer>"), bench.result_row(samples[1], "<answer>E</answer>"),
            bench.result_row(samples[2], "no idea"), bench.failed_row(samples[3], "generation failed")]
    _check(bench.aggregate(rows), Q, {}, {"question_type": {"SR": (0.5, 2, 0), "TCI": (0.0, 1, 0),
                                                            "MHR": (0.0, 1, 1)}}, count=4, failed=1)


def test_mlvu_official_tasks_m_avg(tmp_path):
    def rec(video, answer, task):
        return {"video": video, "duration": 300, "question": "Q?", "candidates": ["red", "green", "blue"],
                "answer": answer, "question_type": task}

    _write(tmp_path / "json" / "1_plotQA.json", [rec("m1.mp4", "red", "plotQA"), rec("m2.mp4", "blue", "plotQA")])
    _write(tmp_path / "json" / "4_count.json", [rec("c1.mp4", "green", "count"), rec("c2.mp4", "green", "count"),
                                                rec("c3.mp4", "red", "count")])
    _write(tmp_path / "json" / "9_summary.json", [{"video": "s.mp4", "question": "Summarize", "answer": "..."}])
    (tmp_path / "video" / "1_plotQA").mkdir(parents=True)
    (tmp_path / "video" / "1_plotQA" / "m1.mp4").write_bytes(b"")
    bench = BENCHMARKS["mlvu-dev"]
    samples = bench.load(tmp_path)  # the generation task is not read
    assert [s.answer for s in samples] == ["A", "C", "B", "B", "A"]
    assert samples[0].videos == [str(tmp_path / "video" / "1_plotQA" / "m1.mp4")]
    rows = [bench.result_row(samples[0], "<answer>A</answer>"),  # plotQA right
            bench.result_row(samples[1], "<answer>A</answer>"),  # plotQA wrong
            bench.result_row(samples[2], "<answer>B</answer>"),  # count right
            bench.result_row(samples[3], "unsure"),  # count malformed
            bench.failed_row(samples[4], "generation failed")]  # count missing
    # plotQA 1/2, count 1/3: M-Avg = (1/2 + 1/3) / 2 = 5/12; micro 2/5
    _check(bench.aggregate(rows), 5 / 12, {"micro": 2 / 5},
           {"task": {"plotQA": (0.5, 2, 0), "count": (1 / 3, 3, 1)}}, count=5, failed=1)


@needs_annotations
def test_videommmu_delta_knowledge_from_the_question_only_pass(tmp_path):
    from easyvideor1.evaluation import presets
    from easyvideor1.evaluation.report import summarize_run
    from easyvideor1.evaluation.results import ResultStore

    path = ROOT / "videommmu_with_image.json"
    video, baseline = BENCHMARKS["videommmu"], BENCHMARKS["videommmu-question-only"]
    only = baseline.load(ROOT, annotation_file=path)
    assert len(only) == 300 and all(s.data_type == "image" and not s.videos and s.images for s in only)
    assert "end of the video" not in baseline.prompt(only[0])
    settings = presets.settings("qwen2_5_vl_greedy", "m")
    with ResultStore.open(tmp_path, "videommmu", settings) as store:
        s = video.load(ROOT, annotation_file=path)[:4]  # Adaptation: right, right, wrong, missing
        for row in [video.result_row(s[0], right(s[0])), video.result_row(s[1], right(s[1])),
                    video.result_row(s[2], wrong(s[2])), video.failed_row(s[3], "generation failed")]:
            store.append(row)
    with ResultStore.open(tmp_path, "videommmu-question-only", settings) as store:
        for row in four_rows(baseline, only[:4]):  # right, wrong, malformed, missing
            store.append(row)
    agg = summarize_run(tmp_path).aggregates["videommmu"]
    # after = 2/4, before = 1/4: (1/2 - 1/4) / (1 - 1/4) = 1/3
    assert agg.metrics["delta_knowledge"] == pytest.approx(1 / 3)
    assert any("delta_knowledge" in n for n in agg.notes)


def test_minerva_release_file_skills_splits_categories(tmp_path):
    def rec(key, video, qtype, split, category, **answer):
        return {"key": key, "video_id": video, "question": f"{key}?", "answer": answer.pop("answer", "..."),
                **{f"answer_choice_{i}": f"{key} choice {i}" for i in range(5)}, **answer,
                "question_type": qtype, "split": split, "category": category, "reasoning": "..."}

    m3 = rec("m3", "vidC", "Temporal Reasoning, Spatial Navigation", "Short films", "Drama")
    m3["answer"] = m3["answer_choice_4"]  # no answer_id: the choice equal to `answer` (lmms-eval's fallback)
    m2 = rec("m2", "vidA", "", "Sports", "Soccer", answer_id="0")  # a digit string
    m2["question type"] = m2.pop("question_type") or "Counting"  # the README's spelling of the key
    m7 = rec("m7", "vidD", "Counting", "Sports", "Soccer", answer_id=1)
    del m7["answer_choice_3"]
    _write(tmp_path / "minerva.json", [
        rec("m1", "vidA", "Counting,Temporal Reasoning", "Sports", "Basketball", answer_id=2), m2, m3,
        rec("m4", "vidC", "Spatial Navigation", "Short films", "Drama", answer_id=1),
        rec("m5", "https://www.youtube.com/watch?v=vidB", "Counting", "Sports", "Basketball", answer_id=4),
        rec("m6", "vidD", "Counting", "Sports", "Soccer", answer_id=9, answer="none of them"), m7])
    (tmp_path / "videos").mkdir()
    (tmp_path / "videos" / "vidB.mp4").write_bytes(b"")
    bench = BENCHMARKS["minerva"]
    with pytest.raises(DataError, match=r"(?s)2 bad record\(s\).*problem_id=m6\): answer_id 9 is not 0-4.*"
                                        r"problem_id=m7\): missing answer_choice_3"):
        bench.load(tmp_path)  # outside `eval`, a bad record stops the load, naming each one
    bad: list[ResultRow] = []
    samples = bench.load(tmp_path, bad_records=bad)  # as `eval` loads it: the valid ones are scored
    assert [s.problem_id for s in samples] == ["m1", "m2", "m3", "m4", "m5"]
    assert [s.answer for s in samples] == ["C", "A", "E", "B", "E"]
    assert samples[0].options[2] == "C. m1 choice 2" and samples[0].problem == "m1?"
    assert samples[0].videos == [str(tmp_path / "videos" / "vidA.mp4")]
    assert samples[4].videos == [str(tmp_path / "videos" / "vidB.mp4")]  # the id read from the URL
    assert [(r.id, r.status) for r in bad] == [("m6", "failed"), ("m7", "failed")]
    assert "answer_id 9" in bad[0].reason and "minerva.json" in bad[0].reason
    rows = [bench.result_row(samples[0], "<answer>C</answer>"),  # right
            bench.result_row(samples[1], "<answer>B</answer>"),  # wrong
            bench.result_row(samples[2], "I am not sure."),  # malformed
            bench.failed_row(samples[3], "generation failed"),  # missing
            bench.result_row(samples[4], "<think>five</think><answer>E</answer>"),  # right
            *bad]  # the two bad records: failed, in every denominator, in no category (unread)
    agg = bench.aggregate(rows)
    # right: m1, m5 of 7. question_type by whole string; skill: Counting m1 m2 m5, Temporal Reasoning
    # m1 m3, Spatial Navigation m3 m4; split: Sports m1 m2 m5, Short films m3 m4; category: Basketball
    # m1 m5, Soccer m2, Drama m3 m4
    _check(agg, 2 / 7, {}, {
        "question_type": {"Counting, Temporal Reasoning": (1.0, 1, 0), "Counting": (0.5, 2, 0),
                          "Temporal Reasoning, Spatial Navigation": (0.0, 1, 0), "Spatial Navigation": (0.0, 1, 1)},
        "skill": {"Counting": (2 / 3, 3, 0), "Temporal Reasoning": (0.5, 2, 0), "Spatial Navigation": (0.0, 2, 1)},
        "split": {"Sports": (2 / 3, 3, 0), "Short films": (0.0, 2, 1)},
        "category": {"Basketball": (1.0, 2, 0), "Soccer": (0.0, 1, 0), "Drama": (0.0, 2, 1)}}, count=7, failed=3)
    assert agg.notes == []


def test_longvideoreason_release_file_perspectives_and_format(tmp_path):
    options = "\nA. first\nB. second\nC. third\nD. fourth"

    def rec(pid, perspective, letter, video="longvila_videos/abc.mp4", problem=f"What happens?{options}"):
        return {"problem_id": pid, "problem": problem, "data_type": "video", "problem_type": perspective,
                "reasoning": "...", "videos": video, "answer": f"<answer>{letter}</answer>"}

    _write(tmp_path / "longvideo-reason" / "test.jsonl", [
        rec(0, "temporal", "B"), rec(1, "goal", "A", video="longvila_videos/def.webm"), rec(2, "spatial", "D"),
        rec(3, "plot", "C"), rec(4, "plot", "A"),
        rec(379, "goal", "B", problem="What happens?"),  # no options (as upstream's rows 379 and 857)
        rec(6, "humor", "A"), rec(7, "temporal", "E")])
    (tmp_path / "longvila_videos").mkdir()
    (tmp_path / "longvila_videos" / "abc.mp4").write_bytes(b"")
    (tmp_path / "longvideo_eval_subset3").mkdir()  # where the release's archives extract
    (tmp_path / "longvideo_eval_subset3" / "def.webm").write_bytes(b"")
    bench = BENCHMARKS["longvideoreason"]
    bad: list[ResultRow] = []
    samples = bench.load(tmp_path, bad_records=bad)  # found as longvideo-reason/test.jsonl
    assert [s.problem_id for s in samples] == ["0", "1", "2", "3", "4"]
    assert samples[0].problem == "What happens?" and samples[0].options == ["A. first", "B. second", "C. third",
                                                                            "D. fourth"]
    assert [s.answer for s in samples] == ["B", "A", "D", "C", "A"]
    assert samples[0].videos == [str(tmp_path / "longvila_videos" / "abc.mp4")]
    assert samples[1].videos == [str(tmp_path / "longvideo_eval_subset3" / "def.webm")]
    assert [r.id for r in bad] == ["379", "6", "7"]
    assert "option letters found: none" in bad[0].reason and "'humor' is not a reasoning perspective" in bad[1].reason
    assert "'<answer>E</answer>' is not one of its option letters ABCD" in bad[2].reason
    rows = [bench.result_row(samples[0], "<think>the order</think> <answer>B</answer>"),  # right, format
            bench.result_row(samples[1], "<think>a goal</think><answer>C</answer>"),  # wrong, format
            bench.result_row(samples[2], "I am not sure."),  # malformed
            bench.failed_row(samples[3], "generation failed"),  # missing
            bench.result_row(samples[4], "<answer>A</answer>"),  # right, no <think>: not the format
            *bad]
    agg = bench.aggregate(rows)
    # right: 0, 4 of 8; format: 0, 1 of 8; plot holds 3 (missing) and 4 (right)
    _check(agg, 2 / 8, {"format_accuracy": 2 / 8}, {"perspective": {
        "temporal": (1.0, 1, 0), "goal": (0.0, 1, 0), "spatial": (0.0, 1, 0), "plot": (0.5, 2, 1)}},
        count=8, failed=4)
    assert agg.notes == []


def test_report_shows_the_release_breakdown_or_says_it_needs_the_release_file(tmp_path):
    from evalfixtures import mc

    from easyvideor1.evaluation import presets
    from easyvideor1.evaluation.report import markdown, summarize_run
    from easyvideor1.evaluation.results import ResultStore

    options = ["A. one", "B. two", "C. three", "D. four"]
    converted = _write(tmp_path / "converted" / "longvideoreason.json", [mc("1", "Why?", options, "B"),
                                                                         mc("2", "How?", options, "C")])
    release = _write(tmp_path / "release" / "longvideo-reason" / "test.jsonl", [
        {"problem_id": 0, "problem": "Why?\nA. one\nB. two", "data_type": "video", "problem_type": "goal",
         "reasoning": "...", "videos": "longvila_videos/v.mp4", "answer": "<answer>B</answer>"}])
    bench = BENCHMARKS["longvideoreason"]
    settings = presets.settings("qwen2_5_vl_greedy", "m")
    reports = {}
    for kind, path in (("converted", converted), ("release", release)):
        out = tmp_path / f"out-{kind}"
        with ResultStore.open(out, "longvideoreason", settings) as store:
            for s in bench.load(path.parent, annotation_file=path):
                store.append(bench.result_row(s, "<think>t</think><answer>B</answer>"))
        reports[kind] = markdown(summarize_run(out))
    assert "Note:** Accuracy overall only" in reports["converted"] and "test.jsonl" in reports["converted"]
    assert "### by perspective" not in reports["converted"]
    assert "| format_accuracy | 100.0 |" in reports["converted"]  # 2 of 2 responses in the official format
    assert "Note:**" not in reports["release"] and "### by perspective" in reports["release"]
    assert "| goal | 100.0 | 1 | 0 |" in reports["release"]
