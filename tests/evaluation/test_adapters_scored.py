"""Adapters whose official aggregate is not a plain mean: VSI-Bench, Charades-STA, STVG,
OVO-Bench, Video-MME-v2. Every expected number is worked out by hand in the comments."""

from __future__ import annotations

import json

import pytest
from evalfixtures import answer, mc

from easyvideor1.evaluation.adapters import BENCHMARKS
from easyvideor1.evaluation.adapters.videomme_v2 import logic_score, relevance_score

OPTS = ["A. left", "B. right", "C. back"]


def rows_for(bench, samples, responses):
    return [bench.result_row(s, r) for s, r in zip(samples, responses)]


def test_vsibench_official_combination(tmp_path, write_json):
    def reg(pid, qtype, truth):
        return {"problem_id": pid, "problem": "How far?", "data_type": "video", "problem_type": "regression",
                "original_question_type": qtype, "options": None, "process": "",
                "solution": f"<answer>{truth}</answer>", "path": f"./s/{pid}.mp4", "data_source": "VSIBench"}

    records = [reg(0, "object_counting", 10), reg(1, "object_abs_distance", 2.0),
               mc(2, "dir?", str(OPTS), "A", original_question_type="object_rel_direction_easy"),
               mc(3, "dir?", str(OPTS), "A", original_question_type="object_rel_direction_medium"),
               mc(4, "dir?", str(OPTS), "A", original_question_type="object_rel_direction_hard"),
               mc(5, "route?", str(OPTS), "B", original_question_type="route_planning")]
    write_json("vsibench.json", records)
    bench = BENCHMARKS["vsibench"]
    samples = bench.load(tmp_path)
    assert samples[2].options == OPTS  # options written as the string of a list
    rows = rows_for(bench, samples, [answer("12.2"), answer("2.0"), answer("A"), answer("B"), answer("A"), answer("C")])
    # counting: |12.2-10|/10 = 0.22 < 1-t for t in 0.50..0.75 (6 of 10 thresholds) -> MRA 0.6
    assert rows[0].score == pytest.approx(0.6)
    agg = bench.aggregate(rows)
    # types: counting .6, abs_distance 1, rel_direction = mean(1, 0, 1) = 2/3, route 0 -> mean of 4
    assert agg.overall == pytest.approx((0.6 + 1 + 2 / 3 + 0) / 4)
    assert agg.metrics["mc_accuracy"] == pytest.approx(2 / 4)
    assert agg.metrics["mra"] == pytest.approx((0.6 + 1) / 2)
    assert agg.categories["question_type"]["object_rel_direction_medium"].score == 0.0


def test_charades_miou_and_recall(tmp_path, write_json):
    truth = '<think>{"time": [10.0, 20.0], "boxes": {}}</think><[PLHD21_never_used_x]>'
    records = [{"problem_id": i, "problem": "person opens a door.", "data_type": "video", "options": [],
                "problem_type": "temporal grounding", "path": f"{i}.mp4", "solution": truth} for i in range(4)]
    write_json("charades_sta.json", records)
    bench = BENCHMARKS["charades_sta"]
    samples = bench.load(tmp_path)
    rows = rows_for(bench, samples[:3], [answer("[10, 20]"), answer("[15, 25]"), answer('{"time": [12, 20]}')])
    rows.append(bench.failed_row(samples[3], "generation timed out"))
    assert [r.prediction for r in rows[:3]] == ["[10.0, 20.0]", "[15.0, 25.0]", "[12.0, 20.0]"]
    agg = bench.aggregate(rows)
    # IoUs: 1, 5/15, 8/10, 0 (failed)
    assert agg.overall == pytest.approx((1 + 1 / 3 + 0.8 + 0) / 4)
    assert agg.metrics == pytest.approx({"R@0.3": 3 / 4, "R@0.5": 2 / 4, "R@0.7": 2 / 4})


def test_stvg_tiou_and_box_miou(tmp_path, write_json):
    boxed = {"time": [0.0, 10.0], "boxes": {"1": [0, 0, 10, 10], "2": [0, 0, 10, 10]}}
    unboxed = {"time": [0.0, 10.0], "boxes": {}}
    records = [{"problem_id": i, "problem": "Who runs?", "data_type": "video", "options": [], "path": f"{i}.mp4",
                "problem_type": "spatial-temporal grounding", "solution": f"<answer>{json.dumps(t)}</answer>"}
               for i, t in enumerate([boxed, unboxed])]
    write_json("stvg.json", records)
    bench = BENCHMARKS["stvg"]
    samples = bench.load(tmp_path)
    pred0 = {"time": [0, 10], "boxes": {"1": [0, 0, 10, 10]}}  # frame 2 omitted: IoU 0 there
    rows = rows_for(bench, samples, [answer(json.dumps(pred0)), answer('{"time": [5, 10], "boxes": {}}')])
    agg = bench.aggregate(rows)
    # row 0: tIoU 1, box IoU (1 + 0)/2 -> 0.75; row 1: no truth boxes -> tIoU 0.5
    assert [r.score for r in rows] == pytest.approx([0.75, 0.5])
    assert agg.overall == pytest.approx(0.625)
    assert agg.metrics == pytest.approx({"m_tIoU": 0.75, "mIoU": 0.5})


def test_ovobench_forward_tasks_mapped_and_mode_macro_average(tmp_path, write_json):
    def fwd(pid, task, truth):
        return {"data_type": "video", "data_source": "OVO-Bench", "problem_type": task, "problem": "step text",
                "options": [], "path": f"{pid}.mp4", "solution": f"<answer>{truth}</answer>",
                "problem_id": f"ovo_{pid}", "ovo_task": task, "ovo_category": "forward", "ovo_id": pid}

    def back(pid, task, mode):
        return {**mc(f"ovo_{pid}", "Who?", ["A: a man", "B: a dog"], "A"), "ovo_task": task, "ovo_category": mode}

    records = [back(1, "EPM", "backward"), back(2, "EPM", "backward"), back(3, "OCR", "realtime"),
               fwd(4, "REC", "3"), fwd(5, "SSR", "Yes"), fwd(6, "CRR", "No")]
    write_json("ovobench.json", records)
    bench = BENCHMARKS["ovobench"]
    samples = bench.load(tmp_path)
    assert [s.problem_type for s in samples[3:]] == ["numerical", "boolean", "boolean"]
    assert samples[4].extra["original_problem_type"] == "SSR" and samples[4].extra["original_problem"] == "step text"
    assert "step text" in bench.prompt(samples[4]) and "Yes or No" in bench.prompt(samples[4])
    rows = rows_for(bench, samples, [answer("A"), answer("B"), answer("A"), answer("3"), answer("No"), answer("No")])
    agg = bench.aggregate(rows)
    # tasks: EPM 1/2, OCR 1, REC 1, SSR 0, CRR 1; modes: backward .5, realtime 1, forward 2/3
    modes = {k: v.score for k, v in agg.categories["mode"].items()}
    assert modes == pytest.approx({"backward": 0.5, "realtime": 1.0, "forward": 2 / 3})
    assert agg.overall == pytest.approx((0.5 + 1 + 2 / 3) / 3)
    assert agg.metrics["micro"] == pytest.approx(4 / 6)


@pytest.mark.parametrize("correct, expected", [
    ([True, True, True, True], 1.0), ([True, True, True, False], 9 / 16),
    ([False, True, False, True], 4 / 16), ([False] * 4, 0.0)])
def test_videomme_v2_consistency_group(correct, expected):
    assert relevance_score(correct) == pytest.approx(expected)


@pytest.mark.parametrize("structure, correct, expected", [
    ("[1, 2, 3, 4]", [True, True, False, True], 4 / 16),  # truncated at the first error
    ("[1, 2, 3, 4]", [False, True, True, True], 0.0),
    ("[1, [2, 3], 4]", [True, False, True, True], 4 / 12),  # q2/q3 parallel: q1 + q3 count as 2
    ("[1, [2, 3], 4]", [True, True, True, False], 7 / 12),
    ("[[1, 2], 3, 4]", [False, True, False, False], 1 / 10),  # q1/q2 parallel
    ("[[1, 2], 3, 4]", [True, True, True, True], 1.0)])
def test_videomme_v2_coherence_group(structure, correct, expected):
    assert logic_score(correct, structure) == pytest.approx(expected)
    with pytest.raises(ValueError, match="unknown Video-MME-v2 group_structure"):
        logic_score(correct, "[1, 2]")
