"""What each task family reads as an answer, and one example record of each.

`ANSWER_FORMS` maps a canonical problem type (a key of `dispatch.TASK_FAMILIES`) to its
`AnswerForm`; `register(name, fn, form=...)` adds one for a new family. The data-format page's
tables are generated from here (scripts/gen_docs.py), and tests/rewards/test_forms.py checks that
every family has a form and that each example loads, passes check-data and scores 1 by its own
family's scorer. Ground truths and responses go through the same readers, so the forms hold for
both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class AnswerForm:
    """The answers a family reads, how it scores them, and one record of the family."""

    answer: str
    """The forms the family reads (Markdown: literal forms in code spans)."""
    accuracy: str
    """How the accuracy is computed."""
    example: dict[str, Any] = field(default_factory=dict)
    """One record in the data schema whose `answer` scores 1 (media paths need not exist)."""
    judged: bool = False
    """Scored by an LLM judge: the ground truth cannot be scored against itself (check-data skips it)."""


ANSWER_FORMS: dict[str, AnswerForm] = {
    "multiple choice": AnswerForm(
        "a letter A-J (`B`, `(B)`, `B. blue`, `\\boxed{B}`), or one option's text (`blue`); options may be "
        "written `A. x`, `A: x`, `(A) x` or plain `x`",
        "exact letter",
        {"problem_id": "colour-1", "problem": "<video>What colour is the square?", "problem_type": "multiple choice",
         "options": ["A. red", "B. blue", "C. green", "D. yellow"], "answer": "B", "videos": ["clips/colour-1.mp4"]}),
    "numerical": AnswerForm(
        "a number: `12`, `3.5`, `3/4`, `\\frac{3}{4}`, `45%`, `1,200`, `twenty-one` (the last number of the answer)",
        "exact for integers, else within 1% (`numerical_rel_tol`)",
        {"problem_id": "count-1", "problem": "How many squares appear in the video?", "problem_type": "numerical",
         "answer": "3", "videos": ["clips/count-1.mp4"]}),
    "regression": AnswerForm(
        "a number",
        "VSI-Bench mean relative accuracy over thresholds 0.50..0.95",
        {"problem_id": "room-1", "problem": "How long is the table, in metres?", "problem_type": "regression",
         "answer": "1.8", "videos": ["rooms/room-1.mp4"]}),
    "temporal grounding": AnswerForm(
        "`[s, e]` or `{\"time\": [s, e]}`, in seconds",
        "temporal IoU",
        {"problem_id": "when-1", "problem": "During which seconds is the square visible? Answer [start, end].",
         "problem_type": "temporal grounding", "answer": "[1.0, 3.5]", "videos": ["clips/when-1.mp4"]}),
    "spatial-temporal grounding": AnswerForm(
        "`{\"time\": [s, e], \"boxes\": {\"<frame>\": [x1, y1, x2, y2], ...}}`",
        "0.5 temporal IoU + 0.5 mean box IoU over the ground truth's frames",
        {"problem_id": "stvg-1", "problem": "When and where is the dog running?",
         "problem_type": "spatial-temporal grounding", "videos": ["clips/stvg-1.mp4"],
         "answer": {"time": [2.0, 4.0], "boxes": {"2": [10, 20, 110, 140], "3": [30, 22, 130, 142]}}}),
    "spatial grounding": AnswerForm(
        "`[x1, y1, x2, y2]`, `{\"bbox\": [...]}` or `{\"bbox_2d\": [...]}`",
        "box IoU (a degenerate box scores 0)",
        {"problem_id": "where-1", "problem": "<image>Give the box of the square as [x1, y1, x2, y2].",
         "problem_type": "spatial grounding", "answer": "[40, 32, 96, 88]", "images": ["images/where-1.png"]}),
    "tracking": AnswerForm(
        "`{\"<frame>\": [x1, y1, x2, y2], ...}` or `{\"boxes\": {...}}`",
        "mean box IoU over the ground truth's frames (a frame left out scores 0)",
        {"problem_id": "track-1", "problem": "Track the ball: a box per frame.", "problem_type": "tracking",
         "answer": {"0": [5, 5, 25, 25], "4": [15, 8, 35, 28], "8": [25, 11, 45, 31]},
         "videos": ["clips/track-1.mp4"]}),
    "open-ended": AnswerForm(
        "text",
        "mean ROUGE-1/2/L F1, 1 on a normalised exact match; or an LLM judge's verdict (`reward.judge`)",
        {"problem_id": "qa-1", "problem": "What does the man do after opening the fridge?",
         "problem_type": "open-ended", "answer": "He pours a glass of milk.", "videos": ["clips/qa-1.mp4"]}),
    "caption-mc": AnswerForm(
        "text (a caption)",
        "an LLM judge answers `mc_question` from the caption alone: 1 when it picks `mc_answer` "
        "(TempCompass captioning; needs the judge)",
        {"problem_id": "caption-1", "problem": "Describe the video.", "problem_type": "caption-mc",
         "answer": "A man dunks a basketball.", "mc_question": "What is the man doing?\nA. passing a ball\n"
         "B. dunking a basketball", "mc_answer": "B. dunking a basketball", "videos": ["clips/caption-1.mp4"]},
        judged=True),
    "math": AnswerForm(
        "an expression, in `<answer>` or `\\boxed{}`",
        "math-verify equivalence (a timeout is an error, not a 0)",
        {"problem_id": "math-1", "problem": "What fraction of the squares are red?", "problem_type": "math",
         "answer": "\\frac{1}{2}", "videos": ["clips/math-1.mp4"]}),
    "ocr": AnswerForm(
        "text",
        "1 - word error rate, clipped to [0, 1]; `exact` part",
        {"problem_id": "sign-1", "problem": "<image>What does the sign say?", "problem_type": "ocr",
         "answer": "OPEN 24 HOURS", "images": ["images/sign-1.png"]}),
    "boolean": AnswerForm(
        "`yes` / `no` / `true` / `false`",
        "exact",
        {"problem_id": "presence-1", "problem": "Is there a square in the video?", "problem_type": "boolean",
         "answer": "yes", "videos": ["clips/presence-1.mp4"]}),
    "code": AnswerForm(
        "a fenced Python block (else the answer text); the record's tests in `tests`, `test_list` "
        "(+ `test_setup_code`) or `test` + `entry_point`",
        "fraction of the record's tests passed, in a sandbox",
        {"problem_id": "code-1", "problem": "Write add(a, b), the sum of two numbers.", "problem_type": "code",
         "answer": "```python\ndef add(a, b):\n    return a + b\n```", "tests": ["assert add(1, 2) == 3"]}),
    "svg-code": AnswerForm(
        "`<svg>...</svg>`",
        "blank-normalised pixel similarity of the renders (cairosvg)",
        {"problem_id": "svg-1", "problem": "<image>Write the SVG of this picture.", "problem_type": "svg-code",
         "answer": "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"64\" height=\"64\">"
                   "<rect x=\"8\" y=\"8\" width=\"32\" height=\"32\" fill=\"red\"/></svg>",
         "images": ["images/svg-1.png"]}),
    "html-code": AnswerForm(
        "an HTML page",
        "blank-normalised pixel similarity of the screenshots (headless Chromium)",
        {"problem_id": "html-1", "problem": "<image>Write the HTML of this page.", "problem_type": "html-code",
         "answer": "<html><body><h1 style=\"color: red\">Hello</h1></body></html>",
         "images": ["images/html-1.png"]}),
    "preference": AnswerForm(
        "`Response 1` / `Response 2` / `Tie` (also `1`, `[[2]]`, `the first response`, ...)",
        "exact",
        {"problem_id": "critic-1", "problem": "Which response answers the question better?\nResponse 1: ...\n"
         "Response 2: ...", "problem_type": "preference", "answer": "Response 1", "videos": ["clips/critic-1.mp4"]}),
}
