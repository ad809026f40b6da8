"""Math: symbolic equivalence via math-verify, and the scorer timeout bound."""

import pytest

from easyvideor1.records import Sample
from easyvideor1.rewards import RewardConfig, score
from easyvideor1.rewards.batch import score_batch


def problem(answer):
    return Sample(problem="Compute it.", answer=answer, problem_type="math", problem_id="m-1")


@pytest.mark.parametrize(
    "response, answer, accuracy",
    [
        ("<think>1/2 of it.</think><answer>\\frac{1}{2}</answer>", "<answer>0.5</answer>", 1.0),
        ("<think>..</think><answer>0.5</answer>", "\\frac{1}{2}", 1.0),
        ("<think>..</think><answer>2/4</answer>", "\\frac{1}{2}", 1.0),
        ("Therefore the result is \\boxed{\\frac{\\sqrt{2}}{2}}.", "\\frac{1}{\\sqrt{2}}", 1.0),
        ("<think>..</think><answer>$x = 3$</answer>", "3", 1.0),
        ("<think>..</think><answer>\\pi</answer>", "\\pi", 1.0),
        ("<think>..</think><answer>2\\pi r</answer>", "2 \\pi r", 1.0),
        ("<think>..</think><answer>x^2 + 2x + 1</answer>", "(x+1)^2", 1.0),
        ("<think>..</think><answer>\\frac{1}{3}</answer>", "\\frac{1}{2}", 0.0),
        ("<think>..</think><answer>0.33</answer>", "\\frac{1}{3}", 0.0),
        ("<think>..</think><answer>I could not solve it</answer>", "7", 0.0),
        ("<think>..</think><answer>\\frac{1}{</answer>", "7", 0.0),  # malformed LaTeX
        ("<think>..</think><answer>-7</answer>", "7", 0.0),
    ],
)
def test_math_cases(response, answer, accuracy):
    assert score(response, problem(answer)).accuracy == accuracy


def test_math_format_validity():
    assert score("<think>.</think><answer>\\frac{1}{2}</answer>", problem("0.5")).format == 1.0
    assert score("<think>.</think><answer>no idea</answer>", problem("0.5")).format == 0.5


PATHOLOGICAL = "<think>huge</think><answer>$2^{2^{2^{2^{2^{10}}}}}$</answer>"


# Only the limit can end PATHOLOGICAL's evaluation: TimeoutError shows it fired (no clock is
# read, so a busy machine cannot fail these). Should it ever not fire, pytest-timeout ends the
# run; its thread method, because math-verify's limit owns SIGALRM.
HANG_GUARD = pytest.mark.timeout(600, method="thread")


@HANG_GUARD
def test_pathological_expression_times_out():
    with pytest.raises(TimeoutError):
        score(PATHOLOGICAL, problem("1"), RewardConfig(math_timeout_s=1))


@HANG_GUARD
def test_timeout_becomes_a_counted_error_in_batch():
    cfg = RewardConfig(math_timeout_s=1)
    results = score_batch(
        [PATHOLOGICAL, "<think>.</think><answer>1</answer>"],
        [problem("1"), problem("1")],
        cfg,
        workers=0,
    )
    assert (
        results[0].error is not None
        and "m-1" in results[0].error
        and "TimeoutError" in results[0].error
    )
    assert results[0].overall == 0.0
    assert results[1].error is None and results[1].accuracy == 1.0


def test_unparseable_ground_truth_names_the_sample():
    with pytest.raises(ValueError, match="m-1"):
        score("<answer>1</answer>", problem("no math here"))
