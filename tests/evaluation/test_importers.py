"""Official release layouts (TempCompass, ODV-Bench, Video-MME-v2) and clip records mapped to
source-video segments (LiveSports-3K, ODV-Bench), on fixtures written in those layouts."""

from __future__ import annotations

import pytest
from evalfixtures import answer, mc

from easyvideor1.data.loading import DataError
from easyvideor1.evaluation.adapters import BENCHMARKS


def rows_for(bench, samples, responses):
    return [bench.result_row(s, r) for s, r in zip(samples, responses)]


def test_tempcompass_official_multi_choice(tmp_path, write_json):
    data = {"1034419625": {
        "action": [{"question": "What is the man doing?\nA. dunking\nB. dribbling\nC. passing", "answer": "A. dunking"},
                   {"question": "Which activity?\nA. passing\nB. dribbling\nC. dunking", "answer": "C. dunking"}],
        "direction": [{"question": "Which way?\nA. left to right\nB. right to left", "answer": "A. left to right"}]}}
    write_json("questions/multi-choice.json", data)
    bench = BENCHMARKS["tempcompass"]
    samples = bench.load(tmp_path)  # found as questions/multi-choice.json under the data root
    first = samples[0]
    assert (first.problem, first.options, first.answer) == ("What is the man doing?",
                                                          ["A. dunking", "B. dribbling", "C. passing"], "A")
    assert first.videos == [str(tmp_path / "videos/1034419625.mp4")] and first.problem_id == "1034419625/action/0"
    rows = rows_for(bench, samples, [answer("A"), answer("A"), answer("A")])
    agg = bench.aggregate(rows)
    assert {k: v.score for k, v in agg.categories["dimension"].items()} == {"action": 0.5, "direction": 1.0}
    assert agg.overall == pytest.approx(2 / 3)


def test_tempcompass_yes_no_and_caption_matching(tmp_path, write_json):
    yes_no = write_json("questions/yes_no.json", {"v1": {"speed": [{"question": "Is it slow motion?", "answer": "yes"}]}})
    cm = write_json("questions/caption_matching.json", {"v1": {"order": [{
        "question": "Which caption matches the video better?\nCaption A: first jump.\nCaption B: first run.",
        "answer": "Caption B: first run."}]}})
    bench = BENCHMARKS["tempcompass"]
    (yn,) = bench.load(tmp_path, annotation_file=yes_no)
    assert (yn.problem_type, yn.answer) == ("boolean", "yes")
    (c,) = bench.load(tmp_path, annotation_file=cm)
    assert (c.problem_type, c.options, c.answer) == ("multiple choice", ["A. first jump.", "B. first run."], "B")
    assert bench.result_row(c, answer("B")).score == 1.0 and bench.result_row(yn, answer("no")).score == 0.0
    bad = write_json("questions/multi-choice.json", {"v": {"action": [{"question": "no options", "answer": "A"}]}})
    with pytest.raises(DataError, match="v/action/0: cannot read the options"):
        bench.load(tmp_path, annotation_file=bad)


def test_odvbench_official_file_samples_the_visible_prefix(tmp_path, write_json):
    records = [{"video": "TS_Retrieval/test_video/a.mp4", "question": "What will the car do?",
                "candidates": ["stop", "turn left", "go straight", "reverse"], "answer": "turn left",
                "start": 0, "end": 7.5, "subtask": "Motion Prediction", "task": "single dynamic objects"},
               {"video": "TR_Analysis/CAP-DATA/10/1.mp4", "question": "Is there risk ahead?",
                "candidates": ["yes", "no"], "answer": "no", "start": 0, "end": 3.0,
                "subtask": "Risk", "task": "multi-object interaction scenarios or events"}]
    write_json("ODVbench.json", records)
    bench = BENCHMARKS["odvbench"]
    samples = bench.load(tmp_path)
    s = samples[0]
    assert (s.answer, s.options[1], s.video_start, s.video_end) == ("B", "B. turn left", 0.0, 7.5)
    assert s.videos == [str(tmp_path / "TS_Retrieval/test_video/a.mp4")]
    agg = bench.aggregate(rows_for(bench, samples, [answer("B"), answer("A")]))
    assert agg.overall == 0.5 and agg.categories["subtask"]["Motion Prediction"].score == 1.0


def test_clip_records_read_their_source_video_segment(tmp_path, write_json):
    (tmp_path / "videos").mkdir()
    (tmp_path / "videos/I0rOeSG6_Y4.mp4").write_bytes(b"")  # the source video (content unused here)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/dashcam_7.mp4").write_bytes(b"")
    write_json("livesports3k_qa.json", [
        mc("a", "When?", ["A: now", "B: later"], "A", path="I0rOeSG6_Y4_300.745_350.676.mp4"),
        mc("b", "When?", ["A: now", "B: later"], "A", path="missing_1.0_2.0.mp4")])
    write_json("odvbench.json", [mc("c", "What next?", ["A. stop", "B. go"], "B", path="12_dashcam_7_s0_e4.5.mp4")])
    a, b = BENCHMARKS["livesports3k_qa"].load(tmp_path)
    assert a.videos == [str(tmp_path / "videos/I0rOeSG6_Y4.mp4")] and (a.video_start, a.video_end) == (300.745, 350.676)
    assert a.extra["original_videos"] == [str(tmp_path / "I0rOeSG6_Y4_300.745_350.676.mp4")]
    assert b.videos == [str(tmp_path / "missing_1.0_2.0.mp4")] and b.video_start is None  # no source: clip as given
    (c,) = BENCHMARKS["odvbench"].load(tmp_path)
    assert c.videos == [str(tmp_path / "sub/dashcam_7.mp4")] and (c.video_start, c.video_end) == (0.0, 4.5)


def test_videomme_v2_parquet_groups(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    opts = ["A. one", "B. two", "C. three", "D. four"]
    rows = []
    for g, (gtype, structure) in enumerate([("relevance", "None"), ("logic", "[1, [2, 3], 4]")]):
        for q in range(4):
            rows.append({"video_id": f"00{g + 1}", "question": f"g{g}q{q}", "options": opts, "answer": "B",
                         "level": float(g + 1), "group_type": gtype, "group_structure": structure,
                         "second_head": "Perception" if g == 0 else "Reasoning", "third_head": "x"})
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "test.parquet")
    bench = BENCHMARKS["videomme_v2"]
    samples = bench.load(tmp_path)
    assert len(samples) == 8 and samples[5].options == opts and samples[5].videos == [str(tmp_path / "002.mp4")]
    assert bench.labels(samples[5]) == {"group": "1", "position": "1", "level": "2", "group_type": "logic",
                                        "group_structure": "[1, [2, 3], 4]", "second_head": "Reasoning",
                                        "third_head": "x"}
    # group 0 (consistency): 3 of 4 right -> 9/16; group 1 (coherence): q1 right, q2 wrong, q3, q4
    # right -> leading run 2 with the parallel rule -> 4/12. Rows arrive out of order.
    right, wrong = answer("B"), answer("C")
    responses = [right, right, wrong, right, right, wrong, right, right]
    results = rows_for(bench, samples, responses)[::-1]
    agg = bench.aggregate(results)
    assert agg.overall == pytest.approx((9 / 16 + 4 / 12) / 2)
    assert agg.metrics["avg_accuracy"] == pytest.approx(6 / 8)
    assert {k: v.score for k, v in agg.categories["level"].items()} == pytest.approx({"1": 9 / 16, "2": 4 / 12})
