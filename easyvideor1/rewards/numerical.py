"""Numerical answers: read numbers written every way models write them, compare with tolerance.

Parsed forms: integers, decimals, signs (also the Unicode minus), thousands separators
("1,234,567"), scientific notation, fractions ("3/4", "\\frac{3}{4}"), percentages ("45%" reads
as 45: the number as written, so "45%" matches an answer "45" or "45%"), and English number
words ("twenty-one", "one hundred and five", "three thousand"). The *last* number of the answer
text is the prediction ("there are 3 red and 2 blue, so 5 in total" -> 5).

Correct when the ground truth is an integer and the prediction equals it exactly, else when
within `numerical_rel_tol` (default 1%) of it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_content, answer_text
from easyvideor1.rewards.verdict import Verdict

_UNITS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60,
    "seventy": 70, "eighty": 80, "ninety": 90,
}  # fmt: skip
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
_WORD = "|".join(sorted([*_UNITS, *_SCALES], key=len, reverse=True))
_NUMERAL = (
    r"(?<![\w.])(?P<sign>[-+−])?(?P<num>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:[eE](?P<exp>[-+]?\d+))?(?:\s*/\s*(?P<den>\d+(?:\.\d+)?)(?![\d.]))?(?P<pct>\s*%)?"
)
_TOKEN = re.compile(
    r"\\d?frac\{\s*(?P<fnum>-?\d+(?:\.\d+)?)\s*\}\{\s*(?P<fden>\d+(?:\.\d+)?)\s*\}"
    rf"|{_NUMERAL}|(?P<word>\b(?:{_WORD})\b)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Number:
    """One number found in text; `integral` when written as a whole number (no point, no fraction)."""

    value: float
    integral: bool


def _words_value(words: list[str]) -> int:
    total, current = 0, 0
    for word in words:
        if word in _UNITS:
            current += _UNITS[word]
        elif word == "hundred":
            current = max(current, 1) * 100
        else:
            total += max(current, 1) * _SCALES[word]
            current = 0
    return total + current


_PRONOUN_ONE = re.compile(r"\b(?:the|this|that|which|no|every|each|any|some|another)\s+$", re.I)


def _continues(prev: str, word: str, gap: str) -> bool:
    """Whether number word `word` extends the number ending in `prev` ("twenty" + "one")."""
    if re.fullmatch(r"\s+and\s+", gap, re.IGNORECASE):
        return prev in _SCALES and word not in _SCALES
    if not re.fullmatch(r"\s*-\s*|\s+", gap):
        return False
    if word in _SCALES:
        return prev not in _SCALES or _SCALES[prev] < _SCALES[word]
    if prev in _SCALES:
        return True
    return 20 <= _UNITS[prev] <= 90 and 1 <= _UNITS[word] <= 9


def parse_numbers(text: str) -> list[Number]:
    """Every number in `text`, in order.

    >>> [n.value for n in parse_numbers("1,234 people, 3/4 of them, twenty-one cats, 45%")]
    [1234.0, 0.75, 21.0, 45.0]
    """
    found: list[Number] = []
    words: list[str] = []

    def flush() -> None:
        if words:
            found.append(Number(float(_words_value(words)), True))
            words.clear()

    last_end = -1
    for match in _TOKEN.finditer(text):
        if match.group("word") is not None:
            word = match.group("word").lower()
            if word == "one" and _PRONOUN_ONE.search(
                text[max(0, match.start() - 16) : match.start()]
            ):
                continue  # "the one on the left"
            if words and not _continues(words[-1], word, text[last_end : match.start()]):
                flush()
            words.append(word)
            last_end = match.end()
            continue
        flush()
        number = _numeral(match)
        if number is not None:
            found.append(number)
    flush()
    return found


def _numeral(match: re.Match) -> Number | None:
    try:
        if match.group("fnum") is not None:
            den = float(match.group("fden"))
            return Number(float(match.group("fnum")) / den, False) if den else None
        value = float(match.group("num").replace(",", ""))
        integral = "." not in match.group("num")
        if match.group("exp") is not None:
            value *= 10.0 ** int(match.group("exp"))
            integral = False
        if match.group("den") is not None:
            den = float(match.group("den"))
            if not den:
                return None
            value, integral = value / den, False
    except (OverflowError, ValueError):
        return None
    if match.group("sign") in ("-", "−"):
        value = -value
    return Number(value, integral) if math.isfinite(value) else None


def last_number(text: str) -> Number | None:
    """The last number in `text`, or None."""
    numbers = parse_numbers(text)
    return numbers[-1] if numbers else None


def read_prediction(response: str) -> Number | None:
    """The predicted number: last number of the answer text, else of the whole response."""
    return last_number(answer_text(response)) or last_number(response)


def read_truth(sample: Sample, family: str) -> Number:
    """The ground-truth number of a sample, or a ValueError naming the sample."""
    truth = last_number(answer_text(sample.answer))
    if truth is None:
        raise ValueError(
            f"{family} sample {sample.problem_id!r}: no number in answer {sample.answer!r}; "
            "write it as e.g. '12', '3.5' or '<answer>12</answer>'"
        )
    return truth


def valid_number_answer(response: str) -> bool:
    """The `<answer>` content holds exactly one number."""
    content = answer_content(response)
    return content is not None and len(parse_numbers(content)) == 1


def numbers_match(pred: float, truth: Number, rel_tol: float) -> bool:
    """Exact for integer truths, else |pred - truth| <= rel_tol * |truth|."""
    if truth.integral:
        return pred == truth.value
    return abs(pred - truth.value) <= rel_tol * abs(truth.value) + 1e-12


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """1 when the predicted number matches the answer (exact integer / relative tolerance)."""
    truth = read_truth(sample, "numerical")
    pred = read_prediction(response)
    accuracy = (
        1.0 if pred is not None and numbers_match(pred.value, truth, cfg.numerical_rel_tol) else 0.0
    )
    return Verdict(
        accuracy=accuracy, valid=valid_number_answer(response), parts={"match": accuracy}
    )
