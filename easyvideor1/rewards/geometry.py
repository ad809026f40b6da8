"""Intervals, boxes and their IoU, plus reading them from JSON inside free text.

Shapes read (the templates ask for the first of each):
  interval  [s, e]                 or {"time": [s, e]}     seconds, s < e
  box       [x1, y1, x2, y2]       or {"bbox": [...]} / {"bbox_2d": [...]}   x1 < x2, y1 < y2
                                   (also wrapped in a one-element list)
  boxes     {"<frame or second>": box, ...}   or {"boxes": {...}}
Keys of `boxes` are normalised ("18", "18.0" and 18 are the same frame). Degenerate boxes and
intervals (zero or negative size, NaN, inf) are rejected, never scored.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

Interval = tuple[float, float]
Box = tuple[float, float, float, float]
_DECODER = json.JSONDecoder()
_TEXT_SPAN = re.compile(
    r"(?<![\d.])(-?\d++(?:\.\d++)?)\s*+(?:s|sec|secs|seconds?)?\s*+(?:-|–|to|until)\s*+(-?\d++(?:\.\d++)?)",
    re.I,
)


def interval_iou(a: Interval, b: Interval) -> float:
    """1-D IoU of two [start, end] intervals.

    >>> interval_iou((0, 10), (5, 15))  # overlap 5, union 15
    0.3333333333333333
    """
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(a[1], b[1]) - min(a[0], b[0])
    return inter / union if union > 0 else 0.0


def box_iou(a: Box, b: Box) -> float:
    """IoU of two (x1, y1, x2, y2) boxes.

    >>> box_iou((0, 0, 2, 2), (1, 1, 3, 3))  # overlap 1, union 4 + 4 - 1
    0.14285714285714285
    """
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


MAX_SCAN_CHARS = 20_000
MAX_FAILED_DECODES = 256


def strict_json(text: str) -> Any:
    """`text` parsed as one JSON value (a ```json fence around it is allowed), else None."""
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body[: body.rfind("```")] if body.rstrip().endswith("```") else body
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def _numbers(value: Any, n: int) -> tuple[float, ...] | None:
    if not isinstance(value, (list, tuple)) or len(value) != n:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return None
    nums = tuple(float(v) for v in value)
    return nums if all(math.isfinite(v) for v in nums) else None


def as_interval(value: Any) -> Interval | None:
    """[s, e] or {"time": [s, e]} with s < e, else None."""
    if isinstance(value, dict):
        value = value.get("time", value.get("timestamps"))
    nums = _numbers(value, 2)
    return nums if nums is not None and nums[0] < nums[1] else None  # type: ignore[return-value]


def as_box(value: Any) -> Box | None:
    """[x1, y1, x2, y2] or {"bbox"|"bbox_2d"|"box": [...]} with x1 < x2 and y1 < y2, else None.

    A one-element list around either form (Qwen2.5-VL's `[{"bbox_2d": [...], "label": ...}]`) is unwrapped.
    """
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (list, dict)):
        value = value[0]
    if isinstance(value, dict):
        value = next((value[k] for k in ("bbox", "bbox_2d", "box") if k in value), None)
    nums = _numbers(value, 4)
    if nums is None or not (nums[0] < nums[2] and nums[1] < nums[3]):
        return None
    return nums  # type: ignore[return-value]


def frame_key(key: Any) -> str:
    """Normalised key of a frame/second: 18, "18", "18.0" -> "18"; "1.50" -> "1.5"."""
    try:
        number = float(key)
    except (TypeError, ValueError):
        return str(key).strip()
    if not math.isfinite(number):
        return str(key).strip()
    return str(int(number)) if number.is_integer() else repr(number)


def as_boxes(value: Any) -> dict[str, Box | None] | None:
    """{"<frame>": box, ...} or {"boxes": {...}}: normalised keys to boxes (None where invalid)."""
    if isinstance(value, dict) and isinstance(value.get("boxes"), dict):
        value = value["boxes"]
    if not isinstance(value, dict) or "time" in value:
        return None
    return {frame_key(k): as_box(v) for k, v in value.items()}


def find_last(text: str, reader) -> Any:
    """The last-starting JSON value in `text` that `reader` accepts (returns non-None for), or None.

    Scans opening brackets backwards over the last 20k characters and gives up after 256 failed
    decodes, so unbalanced bracket soup costs bounded time (a forward scan was quadratic).
    """
    text = text[-MAX_SCAN_CHARS:]
    pos, failures = len(text), 0
    while failures < MAX_FAILED_DECODES:
        pos = max(text.rfind("{", 0, pos), text.rfind("[", 0, pos))
        if pos < 0:
            return None
        try:
            value, _ = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError):
            failures += 1
            continue
        found = reader(value)
        if found is not None:
            return found
    return None


def text_interval(text: str) -> Interval | None:
    """An interval written in words: "12.5 - 17 s", "from 3 to 8 seconds" (last one wins)."""
    for match in reversed(list(_TEXT_SPAN.finditer(text))):
        start, end = float(match.group(1)), float(match.group(2))
        if math.isfinite(start) and math.isfinite(end) and start < end:
            return (start, end)
    return None
