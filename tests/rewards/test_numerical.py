"""Numerical answers (parsing, tolerance) and regression's mean relative accuracy."""

import pytest

from easyvideor1.records import Sample
from easyvideor1.rewards import RewardConfig, score
from easyvideor1.rewards.numerical import parse_numbers
from easyvideor1.rewards.regression import mean_relative_accuracy

TEN = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))


def num(answer, ptype="numerical"):
    return Sample(problem="How many?", answer=answer, problem_type=ptype)


@pytest.mark.parametrize(
    "text, values",
    [
        ("42", [42.0]),
        ("-3.5 and +2", [-3.5, 2.0]),
        ("−7", [-7.0]),  # Unicode minus
        ("1,234,567 people", [1234567.0]),
        ("3/4 of them", [0.75]),
        ("\\frac{3}{4}", [0.75]),
        ("45%", [45.0]),
        ("1.5e3", [1500.0]),
        ("twenty-one", [21.0]),
        ("one hundred and five", [105.0]),
        ("three thousand two hundred", [3200.0]),
        ("the one on the left has seven", [7.0]),
        ("between 3-5", [3.0, 5.0]),
        ("no numbers here", []),
    ],
)
def test_parse_numbers(text, values):
    assert [n.value for n in parse_numbers(text)] == values


@pytest.mark.parametrize(
    "response, answer, accuracy",
    [
        ("<think>I count 4 chairs.</think><answer>4</answer>", "<answer>4</answer>", 1.0),
        ("<think>...</think><answer>four</answer>", "4", 1.0),
        ("<think>...</think><answer>4.0</answer>", "4", 1.0),
        ("<think>...</think><answer>There are 3 red and 2 blue, so 5 in total</answer>", "5", 1.0),
        ("<think>...</think><answer>4.02</answer>", "4", 0.0),  # integers must match exactly
        ("<think>...</think><answer>5</answer>", "4", 0.0),
        ("<think>...</think><answer>1,200</answer>", "1200", 1.0),
        ("<think>...</think><answer>71.9</answer>", "<answer>71.6</answer>", 1.0),  # within 1%
        ("<think>...</think><answer>73</answer>", "<answer>71.6</answer>", 0.0),  # 1.96% off
        ("<think>...</think><answer>1/2</answer>", "0.5", 1.0),
        ("<think>...</think><answer>50%</answer>", "50", 1.0),
        ("I think the count is 6.", "6", 1.0),  # untagged, lenient
        ("<think>...</think><answer>many</answer>", "6", 0.0),
        ("<think>...</think><answer>-2</answer>", "2", 0.0),
    ],
)
def test_numerical_cases(response, answer, accuracy):
    assert score(response, num(answer)).accuracy == accuracy


def test_numerical_tolerance_is_configurable_and_format_needs_one_number():
    strict = RewardConfig(numerical_rel_tol=0.001)
    assert score("<think>.</think><answer>71.9</answer>", num("71.6"), strict).accuracy == 0.0
    assert score("<think>.</think><answer>5</answer>", num("5")).format == 1.0
    assert score("<think>.</think><answer>5 or 6</answer>", num("6")).format == 0.5


def test_mra_hand_computed():
    # relative error 0.2: passes thresholds t with 0.2 <= 1 - t, i.e. t in {.50,...,.80}: 7 of 10
    assert mean_relative_accuracy(12, 10, TEN) == pytest.approx(0.7)
    assert mean_relative_accuracy(8, 10, TEN) == pytest.approx(0.7)
    # error 0.05: every threshold (0.05 <= 1 - 0.95) -> 1.0 ; error 0.06: all but 0.95 -> 0.9
    assert mean_relative_accuracy(10.5, 10, TEN) == pytest.approx(1.0)
    assert mean_relative_accuracy(10.6, 10, TEN) == pytest.approx(0.9)
    # error 0.5: only t = 0.5 -> 0.1 ; error 0.51: none
    assert mean_relative_accuracy(15, 10, TEN) == pytest.approx(0.1)
    assert mean_relative_accuracy(15.1, 10, TEN) == 0.0
    assert mean_relative_accuracy(0, 0, TEN) == 1.0 and mean_relative_accuracy(0.1, 0, TEN) == 0.0


@pytest.mark.parametrize(
    "response, accuracy",
    [
        ("<think>The sofa looks about 2 m.</think><answer>200</answer>", 1.0),
        ("<think>..</think><answer>230</answer>", 0.8),  # error 0.15: t in {.50, ..., .85}, 8 of 10
        ("<think>..</think><answer>around 180 cm</answer>", 0.9),  # error 0.10: t <= .90, 9 of 10
        ("<think>..</think><answer>260</answer>", 0.5),  # error 0.30: t in {.50, ..., .70}, 5 of 10
        ("<think>..</think><answer>400</answer>", 0.0),  # error 1.0
        ("<think>..</think><answer>nothing</answer>", 0.0),
        ("<think>..</think><answer>two hundred</answer>", 1.0),
    ],
)
def test_regression_cases(response, accuracy):
    assert score(response, num("<answer>200</answer>", "regression")).accuracy == pytest.approx(
        accuracy
    )


def test_regression_ground_truth_must_hold_a_number():
    with pytest.raises(ValueError, match="reg-1"):
        score(
            "<answer>3</answer>",
            Sample(problem="q", answer="big", problem_type="regression", problem_id="reg-1"),
        )
