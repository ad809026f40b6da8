"""Boolean (yes/no) answers: normalise yes/no/true/false (and 是/否), then compare exactly.

Read from the answer text: the whole text ("Yes.", "**no**"), else its first word ("Yes, the
man ..."), else the last "answer is yes/no"; then the same on the whole response.
"""

from __future__ import annotations

import re

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_content, answer_text
from easyvideor1.rewards.verdict import Verdict

_WORDS = {"yes": "yes", "true": "yes", "y": "yes", "是": "yes", "对": "yes",
          "no": "no", "false": "no", "n": "no", "否": "no", "不是": "no"}  # fmt: skip
_DECOR = " \t\n*_`'\"().!,:;。！，"


def _word(text: str) -> str | None:
    return _WORDS.get(text.strip(_DECOR).lower())


def _lone(text: str) -> str | None:
    return _word(text) if len(text) < 40 else None


def _read(text: str) -> str | None:
    lone = _lone(text)
    if lone:
        return lone
    first = re.match(r"[\s\*_`'\"(]*([A-Za-z]+|是|否)", text)
    if first and _word(first.group(1)) and first.group(1).lower() not in ("y", "n"):
        return _word(first.group(1))
    said = re.findall(r"(?i:answer)\s*(?:is|:|：)\s*[\*_`'\"(]*(yes|no|true|false)\b", text, re.I)
    return _WORDS[said[-1].lower()] if said else None


def read_bool(response: str) -> str | None:
    """'yes', 'no' or None.

    >>> read_bool("<answer>Yes.</answer>"), read_bool("No, he does not."), read_bool("maybe")
    ('yes', 'no', None)
    """
    return _read(answer_text(response)) or _read(response)


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """1 when the normalised yes/no equals the reference's."""
    truth = read_bool(sample.answer)
    if truth is None:
        raise ValueError(
            f"boolean sample {sample.problem_id!r}: answer {sample.answer!r} is not yes/no/true/false"
        )
    accuracy = 1.0 if read_bool(response) == truth else 0.0
    content = answer_content(response)
    valid = content is not None and _lone(content) is not None
    return Verdict(accuracy=accuracy, valid=valid, parts={"match": accuracy})
