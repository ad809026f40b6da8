"""Spatial grounding: IoU of the predicted box [x1, y1, x2, y2] with the ground-truth box.

Accepted answers: `[x1, y1, x2, y2]`, `{"bbox": [...]}` or `{"bbox_2d": [...]}` (Qwen2.5-VL's
habit); the last valid one in the answer text, else in the whole response. Boxes with
x2 <= x1 or y2 <= y1 are rejected (score 0), never clipped into shape. Coordinates are
compared as given: prediction and truth must use the same frame (pixels or 0-1000).
"""

from __future__ import annotations

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_content, answer_text
from easyvideor1.rewards.geometry import Box, as_box, box_iou, find_last, strict_json
from easyvideor1.rewards.verdict import Verdict


def read_box(text: str) -> Box | None:
    """The box a response or ground truth gives, or None."""
    return find_last(answer_text(text), as_box) or find_last(text, as_box)


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """Accuracy = IoU(prediction, truth); 0 when no valid box is found."""
    truth = read_box(sample.answer)
    if truth is None:
        raise ValueError(
            f"spatial grounding sample {sample.problem_id!r}: no box [x1, y1, x2, y2] with "
            f"x1 < x2, y1 < y2 in answer {sample.answer!r}"
        )
    pred = read_box(response)
    accuracy = box_iou(pred, truth) if pred is not None else 0.0
    content = answer_content(response)
    valid = content is not None and as_box(strict_json(content)) is not None
    return Verdict(accuracy=accuracy, valid=valid, parts={"iou": accuracy})
