"""Spatio-temporal grounding: when (tIoU) and where (box IoU per ground-truth frame).

Answer shape (the STVG benchmark file's):
    {"time": [s, e], "boxes": {"<frame or second>": [x1, y1, x2, y2], ...}}
accuracy = 0.5 * tIoU + 0.5 * mean box IoU over the *ground-truth* frames; a frame the response
omits (or gives an invalid box for) scores 0 there. Keys match after normalisation ("18" ==
"18.0"). When the ground truth has no boxes (71 STVG records), accuracy is the tIoU alone.

Departure from upstream: upstream averaged box IoU only over frames present in both, so a model
could answer one easy frame and score as if it had boxed them all.
"""

from __future__ import annotations

from typing import Any

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_content, answer_text
from easyvideor1.rewards.geometry import (
    as_boxes,
    as_interval,
    box_iou,
    find_last,
    interval_iou,
    strict_json,
)
from easyvideor1.rewards.verdict import Verdict


def _tube(value: Any) -> dict | None:
    if not isinstance(value, dict) or "time" not in value:
        return None
    boxes = as_boxes(value.get("boxes", {}))
    return {"time": as_interval(value), "boxes": boxes or {}}


def read_tube(text: str) -> dict | None:
    """{"time": interval | None, "boxes": {key: box | None}} from a response or truth, or None."""
    return find_last(answer_text(text), _tube) or find_last(text, _tube)


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """Accuracy = 0.5 tIoU + 0.5 mean IoU over ground-truth frames (tIoU alone without truth boxes)."""
    truth = read_tube(sample.answer)
    if truth is None or truth["time"] is None or any(b is None for b in truth["boxes"].values()):
        raise ValueError(
            f"spatial-temporal grounding sample {sample.problem_id!r}: answer {sample.answer!r} is "
            'not {"time": [s, e], "boxes": {"<frame>": [x1, y1, x2, y2], ...}} with valid values'
        )
    pred = read_tube(response) or {"time": None, "boxes": {}}
    tiou = interval_iou(pred["time"], truth["time"]) if pred["time"] else 0.0
    parts = {"tiou": tiou}
    if truth["boxes"]:
        ious = [
            box_iou(pred["boxes"][k], box) if pred["boxes"].get(k) else 0.0
            for k, box in truth["boxes"].items()
        ]
        parts["box_iou"] = sum(ious) / len(ious)
        accuracy = 0.5 * tiou + 0.5 * parts["box_iou"]
    else:
        accuracy = tiou
    content = answer_content(response)
    tube = _tube(strict_json(content)) if content is not None else None
    valid = bool(tube and tube["time"] and all(b is not None for b in tube["boxes"].values()))
    return Verdict(accuracy=accuracy, valid=valid, parts=parts)
