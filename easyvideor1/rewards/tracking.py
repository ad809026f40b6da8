"""Tracking: mean box IoU over the ground-truth frames.

Answer shape: {"<frame>": [x1, y1, x2, y2], ...} or {"boxes": {...}} (keys normalised, so "3"
and "3.0" match). A ground-truth frame the response omits, or boxes invalidly, scores 0: the
mean is over ground-truth frames, never over the frames the response chose to answer.
"""

from __future__ import annotations

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_content, answer_text
from easyvideor1.rewards.geometry import as_boxes, box_iou, find_last, strict_json
from easyvideor1.rewards.verdict import Verdict


def read_track(text: str) -> dict | None:
    """{frame key: box | None} from a response or ground truth, or None."""
    return find_last(answer_text(text), as_boxes) or find_last(text, as_boxes)


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """Accuracy = mean over ground-truth frames of IoU(predicted box at that frame, truth)."""
    truth = read_track(sample.answer)
    if not truth or any(b is None for b in truth.values()):
        raise ValueError(
            f"tracking sample {sample.problem_id!r}: answer {sample.answer!r} is not a non-empty "
            '{"<frame>": [x1, y1, x2, y2], ...} with valid boxes'
        )
    pred = read_track(response) or {}
    ious = [box_iou(pred[k], box) if pred.get(k) else 0.0 for k, box in truth.items()]
    accuracy = sum(ious) / len(ious)
    content = answer_content(response)
    track = as_boxes(strict_json(content)) if content is not None else None
    valid = bool(track) and all(b is not None for b in track.values())
    return Verdict(accuracy=accuracy, valid=valid, parts={"mean_iou": accuracy})
