"""Property tests: for random and adversarial responses, every family's score never raises,
stays in [0, 1] (overall, accuracy, format and every part), and is deterministic.

2,000 examples per family. Responses mix arbitrary Unicode with fragments that reach each
family's parsers (tags, numbers, letters, JSON pieces, LaTeX, code fences, SVG/HTML).
For html-code the one page fragment is fixed, so Chromium renders it once and later examples
hit the screenshot cache: 2,000 Chromium launches would take ~15 minutes. For code, repeated
programs hit the scorer's per-process run cache (so the determinism check's second call is a
cache hit there); the sandbox's own repeatability is checked in test_code.py.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from easyvideor1.records import Sample
from easyvideor1.rewards import RewardConfig, score
from easyvideor1.rewards.html_code import find_chromium

PROPERTY = settings(
    max_examples=2000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Generous limits (a timeout would break determinism, and none of these programs or expressions
# needs more than a fraction of a second, even on a busy machine); a small window keeps pixel
# comparison cheap.
CFG = RewardConfig(code_timeout_s=10, math_timeout_s=10, html_window=(160, 120))

SVG = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10"><rect width="5" height="10"/></svg>'
PAGE = '<!DOCTYPE html><html><body style="margin:0"><div style="width:50%;height:100px;background:#000"></div></body></html>'
COMMON = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", ".", ",", "-", ":", "(", ")",
          "the answer is ", "**", "Answer: "]  # fmt: skip
FRAGMENTS = {
    "multiple choice": ["A", "B", "C", "D", "I", "J", "(B)", "B.", "\\boxed{C}", "option ", "a red ball", "cube"],
    "numerical": ["3", "-2", "1,234", "3/4", "0.5", "45%", "twenty", "-one", "hundred", " and ", "1e5", "1/0", "\\frac{1}{2}"],
    "regression": ["3", "0", "2.5", "1e308", "-0.0", "1e-300", "seven", "1,000"],
    "temporal grounding": ["[", "]", "{", "}", '"time": ', "1.5", "3", "NaN", "Infinity", "-1", " to ", "s"],
    "spatial-temporal grounding": ["[", "]", "{", "}", '"time": ', '"boxes": ', '"3": ', '"3.0": ', "0", "10", "5", "1e999"],
    "spatial grounding": ["[", "]", "{", "}", '"bbox": ', '"bbox_2d": ', "0", "10", "5", "-3", "1e400", "null"],
    "tracking": ["[", "]", "{", "}", '"boxes": ', '"0": ', '"1": ', "0", "10", "5", '"x"', "true"],
    "open-ended": ["kitchen", "the", "Kitchen", "厨房", "a", "room", "🙂", "\u0000"],
    "math": ["\\frac{1}{2}", "\\boxed{", "}", "x^2", "$", "\\sqrt{2}", "=", "2^{2^{", "1/2", "\\pi", "\\left(", "\\right)"],
    "ocr": ["OPEN", "24", "HOURS", "open", "\t", "  "],
    "boolean": ["yes", "No", "true", "FALSE", "是", "否", "maybe", "y", "n"],
    "code": ["```python\n", "```", "def add(a, b):\n", "    return a + b\n", "return 3", "import os\n", "raise SystemExit\n",
             "x = ", "1", "print('PASS 0')\n"],  # infinite loops are in test_code.py: each costs a timeout
    "svg-code": [SVG, "<svg>", "</svg>", "<rect/>", '<svg xmlns="http://www.w3.org/2000/svg">', "&amp;"],
    "html-code": [PAGE, "html", "body", "div"],
    "preference": ["Response 1", "Response 2", "Tie", "[[1]]", "is better", "equally", "first", "second", "B"],
}  # fmt: skip
SAMPLES = {
    "multiple choice": dict(
        answer="<answer>B</answer>", options=["A. a red ball", "B. a blue cube", "C. cone"]
    ),
    "numerical": dict(answer="<answer>20</answer>"),
    "regression": dict(answer="<answer>2.5</answer>"),
    "temporal grounding": dict(answer="[1.5, 3]"),
    "spatial-temporal grounding": dict(
        answer='{"time": [1, 3], "boxes": {"3": [0, 0, 10, 10], "4": [0, 0, 5, 5]}}'
    ),
    "spatial grounding": dict(answer="[0, 0, 10, 5]"),
    "tracking": dict(answer='{"0": [0, 0, 10, 10], "1": [5, 5, 10, 10]}'),
    "open-ended": dict(answer="the kitchen room"),
    "math": dict(answer="\\frac{1}{2}"),
    "ocr": dict(answer="OPEN 24 HOURS"),
    "boolean": dict(answer="yes"),
    "code": dict(
        answer="def add(a, b):\n    return a + b",
        extra={"tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]},
    ),
    "svg-code": dict(answer=SVG),
    "html-code": dict(answer=PAGE),
    "preference": dict(answer="Response 2"),
}


def responses(family):
    pieces = st.sampled_from(COMMON + FRAGMENTS[family]) | st.text(max_size=8)
    return st.one_of(st.text(max_size=60), st.lists(pieces, max_size=24).map("".join))


def check(response, sample):
    first, second = score(response, sample, CFG), score(response, sample, CFG)
    assert first == second
    for value in (first.overall, first.accuracy, first.format, *first.parts.values()):
        assert 0.0 <= value <= 1.0
    assert first.format in (0.0, 0.5, 1.0) and first.error is None


@pytest.mark.parametrize("family", sorted(FRAGMENTS))
def test_never_raises_bounded_deterministic(family):
    if family == "html-code" and find_chromium() is None:
        pytest.skip("Chromium not installed")
    sample = Sample(
        problem="What is it?", problem_type=family, problem_id=f"prop-{family}", **SAMPLES[family]
    )

    @PROPERTY
    @given(responses(family))
    def run(response):
        check(response, sample)

    run()
