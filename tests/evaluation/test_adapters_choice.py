"""Multiple-choice style adapters on small fixtures in their converted formats: loading quirks,
prompts, extracted predictions and the aggregate arithmetic (hand-computed below)."""

from __future__ import annotations

import pytest
from evalfixtures import answer, mc

from easyvideor1.evaluation.adapters import (
    BENCHMARKS,
    PAPER_BENCHMARKS,
    get_benchmark,
)
from easyvideor1.evaluation.adapters.base import IMAGE_AFTER_VIDEO_HINT

OPTS = ["A. red", "B. green", "C. blue", "D. black"]


def rows_for(bench, samples, responses):
    return [bench.result_row(s, r) for s, r in zip(samples, responses)]


def test_registry_holds_the_22_paper_benchmarks_and_rejects_unknown_names():
    assert len(PAPER_BENCHMARKS) == 22 and set(PAPER_BENCHMARKS) <= set(BENCHMARKS)
    with pytest.raises(ValueError, match="unknown benchmark 'videomme3'.*videomme, videomme_v2"):
        get_benchmark("videomme3")


def test_videomme_duration_breakdown(tmp_path, write_json):
    durations = ["short", "short", "medium", "medium", "long", "long"]
    records = [mc(i + 1, f"q{i}", OPTS, "B", duration=d, domain="Knowledge" if i < 3 else "Sports",
                  sub_category="x", task_type="Counting Problem") for i, d in enumerate(durations)]
    write_json("videomme.json", records)
    bench = BENCHMARKS["videomme"]
    samples = bench.load(tmp_path)
    assert [s.videos[0] for s in samples] == [str(tmp_path / f"videos/{i + 1}.mp4") for i in range(6)]
    prompt = bench.prompt(samples[0])
    assert "q0" in prompt and "B. green" in prompt
    # short: both right; medium: one right (as option text); long: one wrong, one failed to load
    responses = [answer("B"), "The answer is (B).", answer("B"), "I think it is blue.", answer("A")]
    rows = rows_for(bench, samples[:5], responses) + [bench.failed_row(samples[5], "video does not decode")]
    assert [r.prediction for r in rows[:5]] == ["B", "B", "B", "C", "A"]
    agg = bench.aggregate(rows)
    assert agg.overall == pytest.approx(3 / 6) and agg.count == 6 and agg.failed == 1
    by_duration = agg.categories["duration"]
    assert {k: v.score for k, v in by_duration.items()} == pytest.approx({"short": 1.0, "medium": 0.5, "long": 0.0})
    assert by_duration["long"].failed == 1 and by_duration["long"].count == 2
    assert agg.categories["domain"]["Knowledge"].score == pytest.approx(3 / 3)  # ids 1-3 all right


def test_mvbench_letter_truth_clip_bounds_and_mean_of_task_accuracies(tmp_path, write_json):
    def rec(pid, **kw):  # MVBench's converted form: answer = option text, solution = letter
        return {"video": "x.webm", "question": "q", "options": OPTS, "answer": "green", "problem": f"q{pid}",
                "data_type": "video", "problem_type": "multiple choice", "original_question_type": "",
                "solution": "<answer>B</answer>", "path": f"./v/{pid}.mp4", "subtitle": "", "problem_id": pid, **kw}

    write_json("mvbench.json", [rec(1), rec(2), rec(201), rec(401, start=2.0, end=9.5)])
    bench = BENCHMARKS["mvbench"]
    samples = bench.load(tmp_path)
    assert samples[0].answer == "<answer>B</answer>" and samples[0].extra["original_answer"] == "green"
    assert (samples[3].video_start, samples[3].video_end) == (2.0, 9.5)
    assert [bench.labels(s)["task"] for s in samples] == [
        "action_antonym", "action_antonym", "action_count", "action_localization"]
    rows = rows_for(bench, samples, [answer("B"), answer("C"), answer("B"), answer("B")])
    agg = bench.aggregate(rows)
    # tasks: antonym 1/2, count 1/1, localization 1/1 -> mean 2.5/3; micro 3/4
    assert agg.overall == pytest.approx(2.5 / 3) and agg.metrics["micro"] == pytest.approx(0.75)


def test_breakdown_labels_of_motionbench_mlvu_mmvu_livesports(tmp_path, write_json):
    write_json("motionbench.json", [mc(1, "q", OPTS, "A", original_question_type="Camera Motion")])
    write_json("mlvu.json", [mc(1, "q", OPTS, "A", path="./video/test_needle_32.mp4")])
    write_json("mmvu-all.json", [mc(1, "q", OPTS, "A", path="./videos/Chemistry/0.mp4")])
    write_json("livesports3k_qa.json", [mc(1, "q", OPTS, "A", path="abc_1.0_5.0.mp4", q_type_livesports="Who",
                                           ocr_livesports=1)])
    labels = {name: BENCHMARKS[name].labels(BENCHMARKS[name].load(tmp_path)[0])
              for name in ("motionbench", "mlvu", "mmvu-all", "livesports3k_qa")}
    assert labels == {"motionbench": {"question_type": "Camera Motion"}, "mlvu": {"source": "needle"},
                      "mmvu-all": {"question_type": "multiple choice", "discipline": "Chemistry"},
                      "livesports3k_qa": {"question_type": "Who", "ocr": "ocr"}}


def test_videommmu_tracks_image_after_video_and_numerical(tmp_path, write_json):
    records = [mc(1, "<image 1> What sugar is this?", OPTS, "A", path="./dev_Biology_3.mp4",
                  image_path="./images/dev_Biology_3.png"),
               mc(301, "q", OPTS, "C", path="./validation_Art_Theory_2.mp4"),
               {"problem_id": 601, "problem": "How many carbons?", "data_type": "video",
                "problem_type": "numerical", "options": None, "solution": "<answer>12.97</answer>",
                "path": "./test_Chemistry_1.mp4"}]
    write_json("videommmu_with_image.json", records)
    bench = BENCHMARKS["videommmu"]
    samples = bench.load(tmp_path)
    assert samples[0].images == [str(tmp_path / "images/dev_Biology_3.png")]
    assert IMAGE_AFTER_VIDEO_HINT in bench.prompt(samples[0]) and IMAGE_AFTER_VIDEO_HINT not in bench.prompt(samples[1])
    rows = rows_for(bench, samples, [answer("A"), answer("B"), answer("12.97")])
    assert [r.prediction for r in rows] == ["A", "B", "12.97"]
    agg = bench.aggregate(rows)
    assert {k: v.score for k, v in agg.categories["track"].items()} == {
        "Adaptation": 1.0, "Comprehension": 0.0, "Perception": 1.0}
    assert set(agg.categories["subject"]) == {"Biology", "Art_Theory", "Chemistry"}
    assert agg.overall == pytest.approx(2 / 3)


def test_videomathqa_mcq_and_multi_binary(tmp_path, write_json):
    def q(pid, letter, opts, mbin=None):
        extra = {"category": "Counting", "length": "short", **({"mbinary_id": mbin} if mbin is not None else {})}
        return mc(pid, "How many?", opts, letter, **extra)

    five = ["A. 1", "B. 2", "C. 3", "D. 4", "E. 5"]
    records = [q("q1", "B", five)] + [q("q1", "A", ["A. 2", "B. 9"], mbin=i) for i in range(4)]
    records += [q("q2", "C", five)] + [q("q2", "B", ["A. 7", "B. 3"], mbin=10 + i) for i in range(4)]
    write_json("videomathqa.jsonl", records)
    bench = BENCHMARKS["videomathqa"]
    samples = bench.load(tmp_path)
    assert [s.problem_id for s in samples[:3]] == ["q1", "q1#2", "q1#3"]
    # q1: MCQ right, all 4 binaries right; q2: MCQ wrong, 3 of 4 binaries right
    responses = [answer("B")] + [answer("A")] * 4 + [answer("A")] + [answer("B")] * 3 + [answer("A")]
    agg = bench.aggregate(rows_for(bench, samples, responses))
    assert agg.overall == pytest.approx(0.5)  # MCQ: 1 of 2
    assert agg.metrics["mbin"] == pytest.approx(0.5)  # q1 all right, q2 not
    assert agg.metrics["micro"] == pytest.approx(8 / 10)
    assert agg.categories["category"]["Counting"].count == 2  # tables are over MCQ records


def test_open_ended_benchmarks_without_judge_and_their_labels(tmp_path, write_json):
    records = [{"problem_id": 0, "problem": "Which room?", "data_type": "video", "problem_type": "open-ended",
                "options": [], "solution": "<answer>Kitchen</answer>", "path": "video/COIN/a/b.mp4"},
               mc(1, "Which colour?", OPTS, "D", path="video/videoEspresso/c.mp4")]
    write_json("vcrbench.json", records)
    bench = BENCHMARKS["vcrbench"]
    samples = bench.load(tmp_path)
    rows = rows_for(bench, samples, [answer("Kitchen"), answer("A")])
    assert rows[0].score == 1.0 and rows[0].prediction == "Kitchen" and rows[1].score == 0.0
    agg = bench.aggregate(rows)
    assert {k: v.score for k, v in agg.categories["video_source"].items()} == {"COIN": 1.0, "videoEspresso": 0.0}
    write_json("videoreasonbench.json", [{**records[0], "path": "card/state1_op5_start.mp4"}])
    vrb = BENCHMARKS["videoreasonbench"]
    assert vrb.labels(vrb.load(tmp_path)[0]) == {"scene": "card"}


def test_file_benchmark_scores_per_problem_type(tmp_path, write_json):
    records = [{"problem": "How many dots?", "answer": "3", "problem_type": "numerical", "problem_id": "a"},
               {"problem": "Is it red?", "answer": "yes", "problem_type": "boolean", "problem_id": "b"},
               {"problem": "Colour?", "answer": "B", "options": OPTS, "problem_type": "multiple choice",
                "problem_id": "c"}]
    path = write_json("held_out/val.jsonl", records)
    bench = get_benchmark(str(path))
    assert bench.name == "file-val"
    samples = bench.load()
    rows = rows_for(bench, samples, [answer("3"), answer("no"), answer("B")])
    agg = bench.aggregate(rows)
    assert agg.overall == pytest.approx(2 / 3)
    assert {k: v.score for k, v in agg.categories["problem_type"].items()} == {
        "boolean": 0.0, "multiple choice": 1.0, "numerical": 1.0}
    assert get_benchmark("file-val").aggregate(rows).overall == pytest.approx(2 / 3)  # report side


def test_missing_annotation_file_names_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError, match="(?s)Video-MME: no annotation file.*valid_data/videomme.json"):
        BENCHMARKS["videomme"].load(tmp_path)


def test_scorer_error_becomes_a_counted_failed_row(tmp_path, write_json):
    write_json("lvbench.json", [mc(1, "q", OPTS, "Z")])  # a truth no option letter can be read from
    bench = BENCHMARKS["lvbench"]
    row = bench.result_row(bench.load(tmp_path)[0], answer("A"))
    assert row.status == "failed" and "scoring failed" in row.reason and row.score == 0.0
    assert bench.aggregate([row]).failed == 1


@pytest.mark.parametrize("name", ["lvbench", "longvideobench", "holmes", "minerva", "longvideoreason",
                                  "mlvu-dev", "mmvu", "motionbench", "livesports3k_qa"])
def test_plain_multiple_choice_adapters(name, tmp_path, write_json):
    bench = BENCHMARKS[name]
    write_json(bench.files[0], [mc(i, f"question {i}?", OPTS, "C") for i in range(4)])
    samples = bench.load(tmp_path)
    assert all("question 0?" in bench.prompt(samples[0]) and opt in bench.prompt(samples[0]) for opt in OPTS)
    responses = [answer("C"), "<think>it is blue</think> The answer is C.", answer("D")]
    rows = rows_for(bench, samples, responses) + [bench.failed_row(samples[3], "decode error")]
    assert [r.prediction for r in rows] == ["C", "C", "D", ""]
    agg = bench.aggregate(rows)
    assert (agg.overall, agg.count, agg.failed) == (0.5, 4, 1)  # 2 right of 4; the failed one counts


def test_score_fn_carries_the_reward_config(tmp_path, write_json):
    """The pipeline passes its scorer (e.g. one with an LLM judge); here: strict answer tags."""
    import functools

    from easyvideor1.rewards import RewardConfig, score

    write_json("holmes.json", [mc(1, "q", OPTS, "C")])
    bench = BENCHMARKS["holmes"]
    (s,) = bench.load(tmp_path)
    assert bench.result_row(s, "The answer is C.").score == 1.0
    strict = functools.partial(score, cfg=RewardConfig(require_answer_tag=True))
    assert bench.result_row(s, "The answer is C.", score_fn=strict).score == 0.0
