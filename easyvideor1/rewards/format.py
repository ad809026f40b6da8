"""The format reward and the `<think>` / `<answer>` tag reading every family shares.

format = 1    the response is `<think>...</think>` (or none, with `think="optional"`) then
              `<answer>...</answer>`, nothing else around them, and the answer content is valid
              for the task (the family says so: a letter, a number, JSON of the right shape...);
format = 0.5  the tags are right but the content is not valid for the task;
format = 0    anything else (missing, repeated, nested or out-of-order tags, text outside them).

Departure from upstream: upstream gave format 1 to any tag structure, whatever the content.
"""

from __future__ import annotations

import re

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_REQUIRED = re.compile(r"<think>.*?</think>\s*<answer>(.*?)</answer>", re.DOTALL)
_OPTIONAL = re.compile(r"(?:<think>.*?</think>\s*)?<answer>(.*?)</answer>", re.DOTALL)


def answer_content(response: str) -> str | None:
    """Content of the last complete `<answer>...</answer>` (stripped), or None without one.

    >>> answer_content("<think>hm</think><answer> B </answer>")
    'B'
    """
    # rfind rather than a regex: linear even for thousands of unclosed tags
    close = response.rfind("</answer>")
    start = response.rfind("<answer>", 0, close) if close >= 0 else -1
    if start < 0:
        return None
    return response[start + len("<answer>") : response.find("</answer>", start)].strip()


def answer_text(response: str) -> str:
    """Where the final answer most likely is, tagged or not (also applied to ground truths).

    The last `<answer>` content; else the text after an unclosed `<answer>`; else the text
    after the last `</think>` when there is any; else the whole response, stripped.

    >>> answer_text("<answer>C</answer>"), answer_text("<think>a</think> 42"), answer_text("7")
    ('C', '42', '7')
    """
    content = answer_content(response)
    if content is not None:
        return content
    if "<answer>" in response:
        return response.rsplit("<answer>", 1)[1].strip()
    if "</think>" in response:
        tail = response.rsplit("</think>", 1)[1].strip()
        if tail:
            return tail
    return response.strip()


def structure_ok(response: str, think: str = "required") -> bool:
    """True when the tags are exactly `<think>..</think><answer>..</answer>` with a non-empty answer."""
    text = response.strip()
    counts = [text.count(tag) for tag in _TAGS]
    if counts[2] != 1 or counts[3] != 1 or counts[0] != counts[1] or counts[0] > 1:
        return False
    if think == "required" and counts[0] != 1:
        return False
    match = (_REQUIRED if think == "required" else _OPTIONAL).fullmatch(text)
    return bool(match) and bool(match.group(1).strip())


def format_score(response: str, answer_valid: bool, think: str = "required") -> float:
    """1.0, 0.5 or 0.0 as in the module docstring."""
    if not structure_ok(response, think):
        return 0.0
    return 1.0 if answer_valid else 0.5
