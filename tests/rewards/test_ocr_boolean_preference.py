"""OCR (1 - WER), boolean yes/no normalisation, and preference labels."""

import pytest

from easyvideor1.records import Sample
from easyvideor1.rewards import score
from easyvideor1.rewards.ocr import word_accuracy


def make(answer, ptype):
    return Sample(problem="q", answer=answer, problem_type=ptype, problem_id="x-1")


def test_wer_hand_computed():
    assert word_accuracy("STOP HERE", "STOP HERE") == 1.0
    assert word_accuracy("STOP HERE NOW", "STOP HERE") == 0.5  # 1 insertion / 2 words
    assert word_accuracy("STOP THERE", "STOP HERE") == 0.5  # 1 substitution / 2 words
    assert word_accuracy("GO", "STOP HERE") == 0.0  # 1 sub + 1 deletion / 2
    assert word_accuracy("a b c d e", "STOP HERE") == 0.0  # WER 2.5, clipped


@pytest.mark.parametrize(
    "response, accuracy, exact",
    [
        ("<think>The sign reads...</think><answer>OPEN 24 HOURS</answer>", 1.0, 1.0),
        ("<think>..</think><answer>OPEN  24\nHOURS</answer>", 1.0, 1.0),  # whitespace collapsed
        ("<think>..</think><answer>OPEN 24 HOURS DAILY</answer>", 2 / 3, 0.0),
        ("<think>..</think><answer>OPEN 24</answer>", 2 / 3, 0.0),
        ("<think>..</think><answer>open 24 hours</answer>", 1 / 3, 0.0),  # case counts
        ("<think>..</think><answer>CLOSED</answer>", 0.0, 0.0),
        ("<think>..</think><answer></answer>", 0.0, 0.0),
        ("The text says OPEN 24 HOURS", 1 - 4 / 3, 0.0),
        ("<think>..</think><answer>OPEN 42 HOURS</answer>", 2 / 3, 0.0),
        ("<think>..</think>OPEN 24 HOURS", 1.0, 1.0),
    ],
)
def test_ocr_cases(response, accuracy, exact):
    result = score(response, make("<answer>OPEN 24 HOURS</answer>", "ocr"))
    assert result.accuracy == pytest.approx(max(0.0, accuracy))
    assert result.parts["exact"] == exact


@pytest.mark.parametrize(
    "response, answer, accuracy, fmt",
    [
        ("<think>The man waves.</think><answer>Yes</answer>", "<answer>Yes</answer>", 1.0, 1.0),
        ("<think>..</think><answer>yes.</answer>", "Yes", 1.0, 1.0),
        ("<think>..</think><answer>**No**</answer>", "no", 1.0, 1.0),
        ("<think>..</think><answer>True</answer>", "yes", 1.0, 1.0),
        ("<think>..</think><answer>false</answer>", "No", 1.0, 1.0),
        (
            "<think>..</think><answer>Yes, he waves twice.</answer>",
            "yes",
            1.0,
            0.5,
        ),  # right, but not one word
        ("<think>..</think><answer>No</answer>", "yes", 0.0, 1.0),
        ("<think>..</think><answer>maybe</answer>", "yes", 0.0, 0.5),
        ("Looking closely, the answer is no.", "no", 1.0, 0.0),
        ("<think>..</think><answer>是</answer>", "yes", 1.0, 1.0),
        ("<think>..</think><answer>Nobody knows</answer>", "no", 0.0, 0.5),  # "Nobody" is not "no"
        ("<think>..</think><answer>yesterday</answer>", "yes", 0.0, 0.5),
    ],
)
def test_boolean_cases(response, answer, accuracy, fmt):
    result = score(response, make(answer, "boolean"))
    assert (result.accuracy, result.format) == (accuracy, fmt)


@pytest.mark.parametrize(
    "response, answer, accuracy",
    [
        (
            "<think>Response 1 cites the video.</think><answer>Response 1</answer>",
            "Response 1",
            1.0,
        ),
        ("<think>..</think><answer>[[1]]</answer>", "Response 1", 1.0),
        ("<think>..</think><answer>response1</answer>", "Response 1", 1.0),
        (
            "<think>..</think><answer>Response 2 is better than Response 1.</answer>",
            "Response 2",
            1.0,
        ),
        ("<think>..</think><answer>I prefer response 2</answer>", "Response 2", 1.0),
        ("<think>..</think><answer>The better response is Response 1</answer>", "Response 1", 1.0),
        ("<think>..</think><answer>Tie</answer>", "Tie", 1.0),
        ("<think>..</think><answer>Both responses are equally good.</answer>", "tie", 1.0),
        ("<think>..</think><answer>Response 1</answer>", "Response 2", 0.0),
        (
            "<think>..</think><answer>Response 1 and Response 2 both miss it</answer>",
            "Response 1",
            0.0,
        ),
        ("<think>..</think><answer>B</answer>", "Response 2", 1.0),
        ("<think>..</think><answer>no preference stated</answer>", "Response 1", 0.0),
    ],
)
def test_preference_cases(response, answer, accuracy):
    assert score(response, make(answer, "llava")).accuracy == accuracy
    assert score(response, make(answer, "critic")).accuracy == accuracy


@pytest.mark.parametrize(
    "ptype, answer", [("ocr", "  "), ("boolean", "perhaps"), ("preference", "Response 3")]
)
def test_bad_ground_truth_names_the_sample(ptype, answer):
    with pytest.raises(ValueError, match="x-1"):
        score("<answer>yes</answer>", make(answer, ptype))
