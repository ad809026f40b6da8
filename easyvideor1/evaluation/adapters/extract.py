"""The prediction shown in result rows, read with the same parsers the scorers use.

Only for display and inspection: the score comes from the scorer, never from this string.
"""

from __future__ import annotations

import json

from easyvideor1.records import Sample
from easyvideor1.rewards.dispatch import canonical_type
from easyvideor1.rewards.format import answer_text
from easyvideor1.rewards.multiple_choice import extract_letter
from easyvideor1.rewards.numerical import read_prediction
from easyvideor1.rewards.spatiotemporal_grounding import read_tube
from easyvideor1.rewards.temporal_grounding import read_interval


def _choice(response: str, sample: Sample) -> str:
    return extract_letter(response, sample.options) or ""


def _number(response: str, sample: Sample) -> str:
    number = read_prediction(response)
    if number is None:
        return ""
    return str(int(number.value)) if number.integral else repr(number.value)


def _interval(response: str, sample: Sample) -> str:
    interval = read_interval(response)
    return json.dumps([round(v, 3) for v in interval]) if interval else ""


def _tube(response: str, sample: Sample) -> str:
    tube = read_tube(response)
    if not tube or not tube["time"]:
        return ""
    return json.dumps({"time": list(tube["time"]), "boxes": {k: list(b) for k, b in tube["boxes"].items() if b}})


def _text(response: str, sample: Sample) -> str:
    return answer_text(response)


EXTRACTORS = {
    "multiple choice": _choice,
    "numerical": _number,
    "regression": _number,
    "temporal grounding": _interval,
    "spatial-temporal grounding": _tube,
}


def extract_prediction(response: str, sample: Sample) -> str:
    """Letter for multiple choice, number for numerical/regression, interval or tube JSON for
    grounding, else the answer text (tag content, or the text after `</think>`)."""
    try:
        family = canonical_type(sample.problem_type)
    except ValueError:
        family = ""
    return EXTRACTORS.get(family, _text)(response, sample)
