"""Format reward: tag structure x answer validity -> 1 / 0.5 / 0, and tag reading."""

import pytest

from easyvideor1.records import Sample
from easyvideor1.rewards import RewardConfig, score
from easyvideor1.rewards.format import (
    answer_content,
    answer_text,
    format_score,
    structure_ok,
)

MC = Sample(
    problem="Which?",
    answer="<answer>B</answer>",
    problem_type="multiple choice",
    options=["A. cat", "B. dog"],
)


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<think>The dog barks.</think><answer>B</answer>", 1.0),
        ("<think>The dog barks.</think>\n\n<answer>B</answer>\n", 1.0),  # whitespace is fine
        ("<think>The dog barks.</think><answer>B. dog</answer>", 1.0),  # letter plus its text
        ("<think>The dog barks.</think><answer>dog</answer>", 0.5),  # right tags, not a letter
        ("<think>hmm</think><answer>The answer is probably B or A</answer>", 0.5),
        ("<think>hmm</think><answer>Z</answer>", 0.5),  # not an option letter
        ("<answer>B</answer>", 0.0),  # think required by default
        ("<think>x</think>B", 0.0),  # no answer tag
        ("Sure! <think>x</think><answer>B</answer>", 0.0),  # text before the tags
        ("<think>x</think><answer>B</answer> Hope this helps", 0.0),  # text after
        ("<think>x</think><answer>A</answer><answer>B</answer>", 0.0),  # two answers
        ("<think>x <answer>A</answer></think><answer>B</answer>", 0.0),  # nested answer tag
        ("<answer>B</answer><think>x</think>", 0.0),  # wrong order
        ("<think>x</think><answer>  </answer>", 0.0),  # empty answer
        ("<think>x</think><think>y</think><answer>B</answer>", 0.0),  # two think blocks
        ("<think>x<answer>B</answer>", 0.0),  # unclosed think
    ],
)
def test_format_reward_on_multiple_choice(response, expected):
    assert score(response, MC).format == expected


def test_think_optional_mode():
    cfg = RewardConfig(think="optional")
    assert score("<answer>B</answer>", MC, cfg).format == 1.0
    assert score("<think>a</think><answer>B</answer>", MC, cfg).format == 1.0
    assert score("<answer>dog</answer>", MC, cfg).format == 0.5
    assert score("B", MC, cfg).format == 0.0
    assert not structure_ok("</think><answer>B</answer>", "optional")  # stray closing tag


def test_format_score_direct():
    assert format_score("<think>a</think><answer>b</answer>", True) == 1.0
    assert format_score("<think>a</think><answer>b</answer>", False) == 0.5
    assert format_score("<answer>b</answer>", True) == 0.0
    assert format_score("<answer>b</answer>", True, "optional") == 1.0


def test_answer_reading():
    assert answer_content("<answer> x </answer> then <answer>y</answer>") == "y"  # last one
    assert answer_content("no tags") is None
    assert answer_text("<think>long</think><answer>B</answer>") == "B"
    assert answer_text("<think>long</think>  C  ") == "C"
    assert answer_text("<think>long</think><answer>truncated") == "truncated"
    assert answer_text("<think>only thoughts</think>") == "<think>only thoughts</think>"
    assert answer_text("plain") == "plain"


def test_weights_combine_overall():
    response = "<think>x</think><answer>dog</answer>"  # right by option text, format 0.5
    result = score(response, MC)
    assert result.accuracy == 1.0 and result.format == 0.5
    assert result.overall == pytest.approx(0.9 * 1.0 + 0.1 * 0.5)
    custom = score(response, MC, RewardConfig(accuracy_weight=0.5, format_weight=0.5))
    assert custom.overall == pytest.approx(0.75)


def test_require_answer_tag_zeroes_untagged_accuracy():
    assert score("<think>x</think>B", MC).accuracy == 1.0
    assert score("<think>x</think>B", MC, RewardConfig(require_answer_tag=True)).accuracy == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [dict(accuracy_weight=0.9, format_weight=0.2), dict(format_weight=-0.1), dict(think="maybe")],
)
def test_bad_config_is_an_error(kwargs):
    with pytest.raises(ValueError):
        RewardConfig(**kwargs)
