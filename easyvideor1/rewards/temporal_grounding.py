"""Temporal grounding: 1-D IoU of the predicted [start, end] (seconds) with the ground truth.

Accepted answers: `[s, e]` or `{"time": [s, e]}` (JSON, the last one in the answer text, else
in the whole response: Charades-STA's ground truth is `<think>{"time": [s, e], ...}</think>`
with no answer tag); failing JSON, "12.5 - 17 s" / "from 3 to 8 seconds" in the answer text
(accuracy counts, format gets 0.5).
"""

from __future__ import annotations

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_content, answer_text
from easyvideor1.rewards.geometry import (
    Interval,
    as_interval,
    find_last,
    interval_iou,
    strict_json,
    text_interval,
)
from easyvideor1.rewards.verdict import Verdict


def read_interval(text: str) -> Interval | None:
    """The [start, end] a response or ground truth gives, or None."""
    tail = answer_text(text)
    return find_last(tail, as_interval) or find_last(text, as_interval) or text_interval(tail)


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """Accuracy = tIoU(prediction, truth); 0 when no valid interval is found."""
    truth = read_interval(sample.answer)
    if truth is None:
        raise ValueError(
            f"temporal grounding sample {sample.problem_id!r}: no [start, end] with start < end in "
            f"answer {sample.answer!r}; write it as '[12.5, 17.0]' or '{{\"time\": [12.5, 17.0]}}'"
        )
    pred = read_interval(response)
    accuracy = interval_iou(pred, truth) if pred is not None else 0.0
    content = answer_content(response)
    valid = content is not None and as_interval(strict_json(content)) is not None
    return Verdict(accuracy=accuracy, valid=valid, parts={"tiou": accuracy})
