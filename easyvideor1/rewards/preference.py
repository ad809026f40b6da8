"""Preference labels (LLaVA-Critic style pairwise judgements): "Response 1", "Response 2", "Tie".

Normalised forms: "Response 1", "response1", "1", "[[1]]", "the first response", "Response 1
is better", "I prefer response 2" -> "1" / "2"; "Tie", "both are equally good", "[[C]]" ->
"tie". "A"/"B" read as 1/2 only when the whole answer is that letter. Exact match after that.
"""

from __future__ import annotations

import re

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_content, answer_text
from easyvideor1.rewards.verdict import Verdict

_WHOLE = {"1": "1", "2": "2", "a": "1", "b": "2", "c": "tie", "tie": "tie", "first": "1",
          "second": "2", "response 1": "1", "response 2": "2", "response1": "1",
          "response2": "2", "answer 1": "1", "answer 2": "2", "equal": "tie", "draw": "tie"}  # fmt: skip
_NUM = r"(1|2|one|two|first|second|a|b)"
_TO = {"1": "1", "one": "1", "first": "1", "a": "1", "2": "2", "two": "2", "second": "2", "b": "2"}


def read_label(text: str) -> str | None:
    """'1', '2', 'tie' or None.

    >>> read_label("<answer>Response 2</answer>"), read_label("Both are equally good."), read_label("[[1]]")
    ('2', 'tie', '1')
    """
    for part in (answer_text(text), text):
        low = " ".join(re.sub(r"[\[\]\*\.\"'`:!]", " ", part.lower()).split())
        if low in _WHOLE:
            return _WHOLE[low]
        better = re.findall(
            rf"\b(?:response|answer|output)\s*{_NUM}\s+(?:is|was)\s+(?:better|preferred|superior|more)"
            rf"|\bprefer(?:red)?\s+(?:is\s+)?(?:response|answer|output)?\s*{_NUM}\b"
            rf"|\bbetter\s+(?:response|answer|one)\s+is\s+(?:response\s*|answer\s*)?{_NUM}\b"
            rf"|\b(?:the\s+)?{_NUM}\s+(?:response|answer)\s+is\s+better",
            low,
        )
        if better:
            return _TO[next(g for g in better[-1] if g)]
        if re.search(r"\b(tie|equally|equal|same quality|neither is better|both are)\b", low):
            return "tie"
        named = re.findall(r"\b(?:response|answer|output)\s*(1|2)\b", low)
        if len(set(named)) == 1:
            return named[0]
    return None


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """1 when the normalised label equals the reference's."""
    truth = read_label(sample.answer)
    if truth is None:
        raise ValueError(
            f"preference sample {sample.problem_id!r}: answer {sample.answer!r} is not "
            "'Response 1', 'Response 2' or 'Tie'"
        )
    accuracy = 1.0 if read_label(response) == truth else 0.0
    content = answer_content(response)
    valid = (
        content is not None
        and " ".join(re.sub(r"[\[\]\*\.\"'`:!]", " ", content.lower()).split()) in _WHOLE
    )
    return Verdict(accuracy=accuracy, valid=valid, parts={"match": accuracy})
