"""Multiple choice: the letter extraction cascade, option-text matching, benchmark quirks."""

import pytest

from easyvideor1.records import Sample
from easyvideor1.rewards import score
from easyvideor1.rewards.multiple_choice import extract_letter, option_list, option_map

OPTIONS = [
    "A. The man opens the door",
    "B. The man closes the window",
    "C. The woman sits down",
    "D. Nobody moves",
]


def mc(answer="<answer>C</answer>", options=OPTIONS):
    return Sample(
        problem="What happens?", answer=answer, problem_type="multiple choice", options=options
    )


@pytest.mark.parametrize(
    "response, accuracy",
    [
        ("<think>At 0:05 the woman sits.</think><answer>C</answer>", 1.0),
        ("<think>...</think><answer>(C)</answer>", 1.0),
        ("<think>...</think><answer>**C.**</answer>", 1.0),
        ("<think>...</think><answer>C. The woman sits down</answer>", 1.0),
        ("<think>...</think><answer>Option C</answer>", 1.0),
        ("<think>...</think><answer>The woman sits down</answer>", 1.0),  # option text, no letter
        ("<think>...</think><answer>the woman sits down.</answer>", 1.0),  # case/punctuation
        ("The video shows a woman. So the answer is \\boxed{C}.", 1.0),
        ("Let me think. A is wrong, B is wrong. The correct answer is (C).", 1.0),
        ("The answer is C, not option A.", 1.0),
        ("Option A is tempting but the correct option is C.", 1.0),
        ("I watched it twice.\nFinal answer:\nC", 1.0),  # last lines
        ("<think>I think it is C</think><answer>A</answer>", 0.0),  # the tag decides
        ("<think>...</think><answer>B</answer>", 0.0),
        ("<think>...</think><answer>The man closes the window</answer>", 0.0),
        ("<think>...</think><answer>I am not sure</answer>", 0.0),  # "I" is not an option here
        ("<think>...</think><answer>E</answer>", 0.0),  # out of range
        ("", 0.0),
    ],
)
def test_cascade_cases(response, accuracy):
    assert score(response, mc()).accuracy == accuracy


def test_option_forms():
    assert option_map(["A. cat", "B. dog"]) == {"A": "cat", "B": "dog"}
    assert option_map(["A: cat", "B: dog"]) == {"A": "cat", "B": "dog"}  # OVO-Bench
    assert option_map(["(A) cat", "(B) dog"]) == {"A": "cat", "B": "dog"}
    assert option_map(["cat", "dog"]) == {"A": "cat", "B": "dog"}  # no letters: by position
    assert option_list("['A. cat', \"B. dog's bone\"]") == ["A. cat", "B. dog's bone"]  # file form
    assert option_list("None") == [] and option_list("[]") == [] and option_list(None) == []


def test_letters_limited_to_options():
    two = ["A. yes", "B. no"]
    assert extract_letter("<answer>C</answer>", two) is None
    assert extract_letter("I think so. B", two) == "B"
    assert extract_letter("<answer>J</answer>", None) == "J"  # without options: A-J


def test_ground_truth_as_option_text_and_colon_options():
    # MVBench keeps the option text in `answer`; OVO-Bench writes "A: ..."
    sample = mc(
        answer="Piling something up",
        options=["A. Not sure", "B. Scattering something down", "C. Piling something up"],
    )
    assert score("<think>.</think><answer>C</answer>", sample).accuracy == 1.0
    ovo = mc(
        answer="<answer>B</answer>",
        options=["A: a person with brown shirt", "B: a person with green shirt"],
    )
    assert score("<think>.</think><answer>a person with green shirt</answer>", ovo).accuracy == 1.0
    assert (
        score("<think>.</think><answer>B: a person with green shirt</answer>", ovo).accuracy == 1.0
    )


def test_option_text_matching_is_not_fooled_by_substrings():
    sample = mc(answer="<answer>B</answer>", options=["A. 1", "B. 10", "C. 100"])
    assert score("<think>.</think><answer>10</answer>", sample).accuracy == 1.0
    assert score("<think>.</think><answer>100</answer>", sample).accuracy == 0.0


def test_unreadable_ground_truth_names_the_sample():
    bad = Sample(
        problem="q",
        answer="no idea",
        problem_type="multiple choice",
        options=["A. x", "B. y"],
        problem_id="mc-7",
    )
    with pytest.raises(ValueError, match="mc-7"):
        score("<answer>A</answer>", bad)
