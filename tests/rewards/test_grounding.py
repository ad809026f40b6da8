"""Temporal, spatial, spatio-temporal grounding and tracking: IoU math and answer reading."""

import json

import pytest

from easyvideor1.records import Sample
from easyvideor1.rewards import score
from easyvideor1.rewards.geometry import (
    as_box,
    as_interval,
    box_iou,
    find_last,
    frame_key,
    interval_iou,
    strict_json,
)


def sample(answer, ptype):
    return Sample(
        problem="Find it.", answer=answer, problem_type=ptype, data_type="video", problem_id="g-1"
    )


def test_iou_hand_computed():
    assert interval_iou((0, 10), (5, 15)) == pytest.approx(5 / 15)
    assert interval_iou((0, 10), (0, 10)) == 1.0
    assert interval_iou((0, 10), (10, 20)) == 0.0  # touching
    assert interval_iou((2, 4), (0, 10)) == pytest.approx(2 / 10)
    assert box_iou((0, 0, 2, 2), (1, 1, 3, 3)) == pytest.approx(1 / 7)
    assert box_iou((0, 0, 10, 10), (0, 0, 10, 5)) == pytest.approx(50 / 100)
    assert box_iou((0, 0, 1, 1), (2, 2, 3, 3)) == 0.0


def test_json_reading_and_keys():
    text = 'text [1, 2] more {"time": [3, 4]} [oops'
    assert find_last(text, as_interval) == (3.0, 4.0)  # the last one the reader accepts
    assert find_last("[1, 2] and [0, 0, 1, 1]", as_interval) == (1.0, 2.0)
    assert find_last("[" * 20000 + "[5, 6]", as_interval) == (5.0, 6.0)  # bracket soup, bounded
    assert strict_json('```json\n{"bbox": [0, 0, 1, 1]}\n```') == {"bbox": [0, 0, 1, 1]}
    assert strict_json("[1, 2] trailing") is None
    assert as_box([{"bbox_2d": [0, 0, 2, 2], "label": "cup"}]) == (0.0, 0.0, 2.0, 2.0)
    assert frame_key("18") == frame_key(18) == frame_key("18.0") == "18"
    assert frame_key(1.5) == "1.5" and frame_key("first") == "first"


TG = "<answer>[10.0, 20.0]</answer>"


@pytest.mark.parametrize(
    "response, accuracy, fmt",
    [
        ("<think>The light turns on at 10 s.</think><answer>[10.0, 20.0]</answer>", 1.0, 1.0),
        ('<think>..</think><answer>{"time": [10, 20]}</answer>', 1.0, 1.0),
        ("<think>..</think><answer>[15, 25]</answer>", 5 / 15, 1.0),
        ("<think>..</think><answer>[0, 40]</answer>", 10 / 40, 1.0),
        ("<think>..</think><answer>[30, 40]</answer>", 0.0, 1.0),
        ("<think>..</think><answer>[20, 10]</answer>", 0.0, 0.5),  # reversed: rejected
        ("<think>..</think><answer>[12, 12]</answer>", 0.0, 0.5),  # zero length
        (
            "<think>..</think><answer>from 10 to 20 seconds</answer>",
            1.0,
            0.5,
        ),  # words: counted, not JSON
        ("<think>..</think><answer>[10, 20, 30]</answer>", 0.0, 0.5),
        (
            "<think>I think [0, 5] at first, then</think><answer>[10, 20]</answer>",
            1.0,
            1.0,
        ),  # the answer wins
        ("The event spans [12.5, 20].", 7.5 / 10, 0.0),  # untagged
        ("<think>..</think><answer>It spans [10, 20].</answer>", 1.0, 0.5),  # JSON inside prose
        ("<think>..</think><answer>It spans [10, 20].</answer>", 1.0, 0.5),  # JSON inside prose
        ("<think>..</think><answer>[NaN, 20]</answer>", 0.0, 0.5),
    ],
)
def test_temporal_cases(response, accuracy, fmt):
    result = score(response, sample(TG, "temporal grounding"))
    assert result.accuracy == pytest.approx(accuracy) and result.format == fmt


def test_charades_ground_truth_in_think_without_answer_tag():
    gt = '<think>{"time": [24.296875, 30.40625], "boxes": {}}</think><[PLHD21_never_used_51bce0c785ca2f68081bfa7d91973934]>'
    s = sample(gt, "temporal grounding")
    assert score(gt, s).accuracy == 1.0
    assert score("<think>.</think><answer>[24.296875, 30.40625]</answer>", s).accuracy == 1.0
    assert score("<think>.</think><answer>[0, 5]</answer>", s).accuracy == 0.0


BOX = "<answer>[0, 0, 10, 10]</answer>"


@pytest.mark.parametrize(
    "response, accuracy, fmt",
    [
        ("<think>The cup is top-left.</think><answer>[0, 0, 10, 10]</answer>", 1.0, 1.0),
        ('<think>..</think><answer>{"bbox": [0, 0, 10, 10]}</answer>', 1.0, 1.0),
        (
            '<think>..</think><answer>[{"bbox_2d": [0, 0, 10, 5], "label": "cup"}]</answer>',
            0.5,
            1.0,
        ),  # Qwen2.5-VL habit
        ('<think>..</think><answer>{"bbox_2d": [0, 0, 10, 5], "label": "cup"}</answer>', 0.5, 1.0),
        ("<think>..</think><answer>[5, 5, 15, 15]</answer>", 25 / 175, 1.0),
        ("<think>..</think><answer>[20, 20, 30, 30]</answer>", 0.0, 1.0),
        (
            "<think>..</think><answer>[10, 10, 0, 0]</answer>",
            0.0,
            0.5,
        ),  # degenerate (corners swapped)
        ("<think>..</think><answer>[0, 0, 0, 10]</answer>", 0.0, 0.5),  # zero width
        ("<think>..</think><answer>[0, 0, 10]</answer>", 0.0, 0.5),
        # two boxes for one object: the last is read (25 / 100), and the shape is wrong
        ("<think>..</think><answer>[[0, 0, 10, 10], [0, 0, 5, 5]]</answer>", 0.25, 0.5),
        ("<think>..</think><answer>top left corner</answer>", 0.0, 0.5),
        ("It is at [0, 0, 10, 10].", 1.0, 0.0),
        ('<think>..</think><answer>[0, 0, "10", 10]</answer>', 0.0, 0.5),  # strings are not numbers
    ],
)
def test_spatial_cases(response, accuracy, fmt):
    result = score(response, sample(BOX, "spatial grounding"))
    assert result.accuracy == pytest.approx(accuracy) and result.format == fmt


STVG = '<answer>{"time": [10, 20], "boxes": {"10": [0, 0, 10, 10], "15": [0, 0, 10, 10]}}</answer>'


@pytest.mark.parametrize(
    "answer, accuracy",
    [
        ({"time": [10, 20], "boxes": {"10": [0, 0, 10, 10], "15": [0, 0, 10, 10]}}, 1.0),
        (
            {"time": [10, 20], "boxes": {"10.0": [0, 0, 10, 10], "15": [0, 0, 10, 10]}},
            1.0,
        ),  # key forms
        (
            {"time": [10, 20], "boxes": {"10": [0, 0, 10, 10]}},
            0.5 + 0.5 * 0.5,
        ),  # omitted frame 15 scores 0
        (
            {"time": [10, 20], "boxes": {"10": [0, 0, 10, 10], "99": [0, 0, 10, 10]}},
            0.75,
        ),  # extra frame ignored
        ({"time": [10, 20], "boxes": {}}, 0.5),
        (
            {"time": [15, 25], "boxes": {"10": [0, 0, 10, 5], "15": [0, 0, 10, 10]}},
            0.5 * (5 / 15) + 0.5 * 0.75,
        ),
        (
            {"time": [10, 20], "boxes": {"10": [10, 10, 0, 0], "15": [0, 0, 10, 10]}},
            0.75,
        ),  # degenerate box: 0
        ({"boxes": {"10": [0, 0, 10, 10]}}, 0.0),  # no time: not a tube
        ({"time": [30, 40], "boxes": {"10": [0, 0, 10, 10], "15": [0, 0, 10, 10]}}, 0.5),
        ({"time": [10, 20], "boxes": {"15": [0, 0, 10, 10]}}, 0.75),
    ],
)
def test_spatiotemporal_cases(answer, accuracy):
    response = f"<think>Tracking the ball.</think><answer>{json.dumps(answer)}</answer>"
    assert score(response, sample(STVG, "spatial-temporal grounding")).accuracy == pytest.approx(
        accuracy
    )


def test_spatiotemporal_upstream_exploit_is_closed():
    # Upstream averaged only over frames in both: answering one easy frame scored as if all were boxed.
    truth = {str(k): [0, 0, 10, 10] for k in range(10)}
    s = sample(json.dumps({"time": [0, 10], "boxes": truth}), "spatial-temporal grounding")
    lazy = json.dumps({"time": [0, 10], "boxes": {"0": [0, 0, 10, 10]}})
    assert score(f"<think>.</think><answer>{lazy}</answer>", s).accuracy == pytest.approx(
        0.5 + 0.5 * 0.1
    )


def test_spatiotemporal_format_and_empty_truth_boxes():
    s = sample('{"time": [1, 2], "boxes": {}}', "spatial-temporal grounding")
    assert (
        score('<think>.</think><answer>{"time": [1, 2], "boxes": {}}</answer>', s).accuracy == 1.0
    )  # tIoU only
    assert (
        score(
            '<think>.</think><answer>{"time": [1, 2], "boxes": {"1": [1, 1, 0, 0]}}</answer>', s
        ).format
        == 0.5
    )


TRACK = '<answer>{"0": [0, 0, 10, 10], "1": [0, 0, 10, 10], "2": [0, 0, 10, 10], "3": [0, 0, 10, 10]}</answer>'


@pytest.mark.parametrize(
    "answer, accuracy, fmt",
    [
        (
            '{"0": [0, 0, 10, 10], "1": [0, 0, 10, 10], "2": [0, 0, 10, 10], "3": [0, 0, 10, 10]}',
            1.0,
            1.0,
        ),
        (
            '{"boxes": {"0": [0, 0, 10, 10], "1": [0, 0, 10, 10], "2": [0, 0, 10, 10], "3": [0, 0, 10, 10]}}',
            1.0,
            1.0,
        ),
        ('{"0": [0, 0, 10, 10]}', 0.25, 1.0),  # three frames omitted
        (
            '{"0": [0, 0, 10, 5], "1": [0, 0, 10, 5], "2": [0, 0, 10, 5], "3": [0, 0, 10, 5]}',
            0.5,
            1.0,
        ),
        ('{"0.0": [0, 0, 10, 10], "1.0": [0, 0, 10, 10]}', 0.5, 1.0),
        ('{"0": [0, 0, 10, 10], "1": [9, 9, 1, 1]}', 0.25, 0.5),  # one invalid box
        ('{"7": [0, 0, 10, 10]}', 0.0, 1.0),
        ("[0, 0, 10, 10]", 0.0, 0.5),
        ("lost the target", 0.0, 0.5),
        (
            '{"0": [20, 20, 30, 30], "1": [0, 0, 10, 10], "2": [0, 0, 10, 10], "3": [0, 0, 10, 10]}',
            0.75,
            1.0,
        ),
    ],
)
def test_tracking_cases(answer, accuracy, fmt):
    result = score(
        f"<think>Following it.</think><answer>{answer}</answer>", sample(TRACK, "tracking")
    )
    assert result.accuracy == pytest.approx(accuracy) and result.format == fmt


@pytest.mark.parametrize(
    "ptype", ["temporal grounding", "spatial grounding", "spatial-temporal grounding", "tracking"]
)
def test_bad_ground_truth_names_the_sample(ptype):
    with pytest.raises(ValueError, match="g-1"):
        score("<answer>[1, 2]</answer>", sample("somewhere", ptype))
