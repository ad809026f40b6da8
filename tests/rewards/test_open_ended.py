"""Open-ended answers: ROUGE-1/2/L F1 mean, hand-computed, exact short answers, CJK."""

import pytest

from easyvideor1.records import Sample
from easyvideor1.rewards import score
from easyvideor1.rewards.open_ended import normalize, rouge


def qa(answer, ptype="open-ended"):
    return Sample(problem="What happens?", answer=answer, problem_type=ptype, problem_id="oe-1")


def test_rouge_hand_computed():
    # ref: the man opens the door / pred: the woman opens the window (5 tokens each)
    # R1: overlap the x2 + opens = 3 -> P = R = 3/5 ; R2: only "opens the" of 4 bigrams -> 1/4
    # RL: LCS "the opens the" = 3 -> 3/5 ; mean = (0.6 + 0.25 + 0.6) / 3
    parts = rouge("the woman opens the window", "the man opens the door")
    assert parts["rouge1"] == pytest.approx(0.6)
    assert parts["rouge2"] == pytest.approx(0.25)
    assert parts["rougeL"] == pytest.approx(0.6)
    assert parts["rouge"] == pytest.approx((0.6 + 0.25 + 0.6) / 3)


def test_rouge2_left_out_for_one_token_references():
    # ref "kitchen", pred "a big kitchen": R1 P = 1/3, R = 1 -> F = 0.5 ; RL the same ; R2 dropped
    parts = rouge("a big kitchen", "kitchen")
    assert parts["rouge"] == pytest.approx(0.5)


def test_cjk_tokens():
    # ref 厨房 -> [厨, 房]; pred 在厨房里 -> [在, 厨, 房, 里]
    # R1: P = 2/4, R = 1 -> 2/3 ; R2: 厨房 is 1 of 3 pred bigrams, 1 of 1 ref -> 0.5 ; RL = R1
    parts = rouge("在厨房里", "厨房")
    assert parts["rouge"] == pytest.approx((2 / 3 + 0.5 + 2 / 3) / 3)


@pytest.mark.parametrize(
    "response, answer, accuracy",
    [
        (
            "<think>The fight moves inside.</think><answer>Kitchen</answer>",
            "<answer>Kitchen</answer>",
            1.0,
        ),
        (
            "<think>..</think><answer>the kitchen.</answer>",
            "Kitchen",
            1.0,
        ),  # exact after normalising
        ("<think>..</think><answer>KITCHEN</answer>", "kitchen", 1.0),
        ("<think>..</think><answer>a big kitchen</answer>", "kitchen", 0.5),
        (
            "<think>..</think><answer>the woman opens the window</answer>",
            "the man opens the door",
            (0.6 + 0.25 + 0.6) / 3,
        ),
        ("<think>..</think><answer>garage</answer>", "kitchen", 0.0),
        (
            "<think>..</think><answer>[299, 170, 829, 463]</answer>",
            "<answer>[299, 170, 829, 463]</answer>",
            1.0,
        ),
        ("<think>..</think><answer>26 seconds</answer>", "26 seconds", 1.0),
        ("<think>..</think><answer></answer>", "kitchen", 0.0),
        (
            "They are in the kitchen",
            "kitchen",
            2 * (1 / 5) / (1 / 5 + 1),
        ),  # untagged: R1 = RL = F(P=1/5, R=1) = 1/3
    ],
)
def test_open_ended_cases(response, answer, accuracy):
    assert score(response, qa(answer)).accuracy == pytest.approx(accuracy)


def test_long_caption_scores_between_zero_and_one():
    reference = (
        "A man in a red hoodie explains derivatives on a whiteboard, writing the limit definition."
    )
    partial = "A man explains derivatives at a whiteboard."
    result = score(
        f"<think>.</think><answer>{partial}</answer>", qa(reference, "video description")
    )
    assert 0.2 < result.accuracy < 0.8 and result.format == 1.0


@pytest.mark.parametrize(
    "alias", ["video qa", "video description", "free-form", "Open_Ended", "caption"]
)
def test_aliases_route_here(alias):
    assert score("<think>.</think><answer>Kitchen</answer>", qa("kitchen", alias)).accuracy == 1.0


def test_normalize_and_empty_reference():
    assert normalize("The  Kitchen!") == "kitchen"
    with pytest.raises(ValueError, match="oe-1"):
        score("<answer>x</answer>", qa("   "))
