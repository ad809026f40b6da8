"""Multiple choice: read one option letter (A-J) from a response, compare with the answer's.

Extraction cascade, first hit wins, run on the answer text and then on the whole response:
`\\boxed{X}`; "the answer is X" / "answer: (X)"; a lone letter ("B", "(B)", "**B.**"); a line
starting "B. ..." / "(B) ..."; the quoted text of exactly one option; the last "(X)"; the same
lone-letter rules on each of the last three lines; a letter ending the text after a sentence. Letters are limited to the sample's options
(so the pronoun "I" is not read as option I when there are four options).

Departures from upstream: options reach the scorer (upstream never passed them, so option-text
matching never ran); options may be written "A. x", "A: x" (OVO-Bench), "(A) x" or plain "x";
`options` may also be the string form of a list, as in the benchmark JSON files.
"""

from __future__ import annotations

import ast
import re

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_content, answer_text
from easyvideor1.rewards.verdict import Verdict

LETTERS = "ABCDEFGHIJ"
_OPTION = re.compile(r"\s*[\(\[]?([A-J])\s*[\.\):：\]]\s*(.*)", re.DOTALL)


def option_list(options: list[str] | str | None) -> list[str]:
    """`options` as a list: accepts a list, None, "None", "" or the string form of a list."""
    if options is None:
        return []
    if isinstance(options, str):
        text = options.strip()
        if text in ("", "None", "null", "[]"):
            return []
        try:
            parsed = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return [line for line in text.splitlines() if line.strip()]
        return [str(o) for o in parsed] if isinstance(parsed, (list, tuple)) else [text]
    return [str(o) for o in options]


def option_map(options: list[str] | str | None) -> dict[str, str]:
    """Letter -> option text. "A. cat" and "A: cat" give {"A": "cat"}; plain texts get A, B, ..."""
    result: dict[str, str] = {}
    for i, raw in enumerate(option_list(options)[: len(LETTERS)]):
        match = _OPTION.fullmatch(raw)
        if match and match.group(1) not in result:
            result[match.group(1)] = match.group(2).strip()
        else:
            result[LETTERS[i]] = raw.strip()
    return result


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def _lone_letter(text: str, cls: str) -> str | None:
    """A text that is just a letter, possibly decorated: "B", "(B)", "**B.**", "Option B"."""
    match = re.fullmatch(
        rf"[\s\*\(\[\"'`]*+(?:(?i:option|choice|answer)[\s:：]*+)?({cls})[\s\*\.\)\]\"'`:：]*+",
        text,
    )
    if match:
        return match.group(1)
    match = re.match(rf"\s*+\**+[\(\[]?({cls})\s*+[\.\):：\]]\**+\s++\S", text)
    return match.group(1) if match else None


def _by_option_text(text: str, options: dict[str, str]) -> str | None:
    norm = _norm(text)
    if not norm:
        return None
    texts = {letter: _norm(option) for letter, option in options.items() if _norm(option)}
    exact = [letter for letter, option in texts.items() if option == norm]
    if len(exact) == 1:
        return exact[0]
    padded = f" {norm} "
    contained = [letter for letter, option in texts.items() if f" {option} " in padded]
    return contained[0] if len(contained) == 1 else None


def _cascade(text: str, options: dict[str, str], cls: str) -> str | None:
    boxed = re.findall(rf"\\boxed\{{\s*+(?:\\text\{{\s*+)?[\(\[]?({cls})[\)\]]?\s*+\}}", text)
    if boxed:
        return boxed[-1]
    for word in ("answer", "option|choice"):  # "the answer is B, not option A" -> B
        phrase = re.findall(
            rf"(?i:{word})(?:\s++(?i:is|would be|should be|will be))?[\s:：\*]*+"
            rf"[\(\[]?({cls})(?![A-Za-z0-9])",
            text,
        )
        if phrase:
            return phrase[-1]
    letter = _lone_letter(text, cls)
    if letter:
        return letter
    if options:
        letter = _by_option_text(text, options)
        if letter:
            return letter
    parens = re.findall(rf"\(({cls})\)", text)
    if parens:
        return parens[-1]
    lines = [line for line in text.splitlines() if line.strip()]
    for line in reversed(lines[-3:]):
        letter = _lone_letter(line, cls)
        if letter:
            return letter
    final = re.search(rf"(?:^|[\.:：!?]\s)\s*+[\(\*]*+({cls})[\)\*]*+\.?\s*+$", text)  # "... so. B"
    return final.group(1) if final else None


def extract_letter(response: str, options: list[str] | str | None = None) -> str | None:
    """The option letter a response chose, or None.

    >>> extract_letter("<think>...</think><answer>(C)</answer>", ["A. x", "B. y", "C. z"])
    'C'
    >>> extract_letter("I think the answer is B because...", None)
    'B'
    >>> extract_letter("Piling something up", ["A. Not sure", "B. Piling something up"])
    'B'
    """
    opts = option_map(options)
    cls = "[" + ("".join(sorted(opts)) if opts else LETTERS) + "]"
    for text in (answer_text(response), response):
        letter = _cascade(text, opts, cls)
        if letter:
            return letter
    return None


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """1 when the response's letter equals the answer's letter, else 0."""
    truth = extract_letter(sample.answer, sample.options)
    if truth is None:
        raise ValueError(
            f"multiple choice sample {sample.problem_id!r}: cannot read an option letter from "
            f"answer {sample.answer!r}; write it as 'B', '<answer>B</answer>' or an option's text"
        )
    opts = option_map(sample.options)
    cls = "[" + ("".join(sorted(opts)) if opts else LETTERS) + "]"
    content = answer_content(response)
    valid = content is not None and _lone_letter(content, cls) is not None
    accuracy = 1.0 if extract_letter(response, sample.options) == truth else 0.0
    return Verdict(accuracy=accuracy, valid=valid, parts={"letter_match": accuracy})
