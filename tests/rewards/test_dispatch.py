"""The dispatcher: routing, aliases, unknown types, registering a family, import lightness."""

import subprocess
import sys

import pytest

from easyvideor1.records import Sample
from easyvideor1.rewards import (
    ALIASES,
    TASK_FAMILIES,
    Verdict,
    canonical_type,
    register,
    score,
)

ISSUE_NAMES = ["multiple choice", "numerical", "regression", "temporal grounding", "spatial-temporal grounding",
               "spatial grounding", "tracking", "open-ended", "video qa", "video description", "free-form",
               "math", "ocr", "boolean", "code", "svg-code", "html-code", "llava", "critic"]  # fmt: skip


@pytest.mark.parametrize("name", ISSUE_NAMES)
def test_every_name_from_the_issue_routes(name):
    assert canonical_type(name) in TASK_FAMILIES
    assert canonical_type(name.upper().replace(" ", "_")) == canonical_type(
        name
    )  # case and separators


def test_aliases_point_at_families():
    assert all(target in TASK_FAMILIES for target in ALIASES.values())
    assert canonical_type("Multiple-Choice") == "multiple choice"
    assert canonical_type("llava") == canonical_type("critic") == "preference"


def test_unknown_type_is_an_error_listing_known_ones():
    with pytest.raises(ValueError) as info:
        score("<answer>A</answer>", Sample(problem="q", answer="A", problem_type="essay"))
    message = str(info.value)
    assert (
        "essay" in message
        and "multiple choice" in message
        and "tracking" in message
        and "register" in message
    )


def test_register_a_new_family():
    def exact_upper(response, sample, cfg):
        return Verdict(
            accuracy=float(response.upper() == sample.answer), valid=True, parts={"exact": 1.0}
        )

    register("shout", exact_upper, aliases=("yelling",))
    try:
        s = Sample(problem="q", answer="HI", problem_type="yelling")
        result = score("hi", s)
        assert (
            result.accuracy == 1.0 and result.format == 0.0 and result.overall == pytest.approx(0.9)
        )
    finally:
        TASK_FAMILIES.pop("shout")
        ALIASES.pop("yelling")


def test_scores_and_parts_are_clipped_into_unit_interval():
    register("wild", lambda r, s, c: Verdict(accuracy=3.0, valid=True, parts={"x": -2.0}))
    try:
        result = score(
            "<think>a</think><answer>b</answer>",
            Sample(problem="q", answer="b", problem_type="wild"),
        )
        assert result.accuracy == 1.0 and result.parts == {"x": 0.0} and result.overall == 1.0
    finally:
        TASK_FAMILIES.pop("wild")


def test_import_is_light():
    code = "import sys, easyvideor1.rewards; print(sorted(m for m in ('torch', 'numpy', 'rouge_score', 'math_verify', 'cairosvg', 'httpx') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600
    ).stdout  # (the timeout only ends a hang)
    assert out.strip() == "[]"
