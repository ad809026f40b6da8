"""Prompt templates: every task type renders, and the answer form it requests scores 1.

Round trip: the example answer a template shows is taken from the rendered prompt, made the
ground truth, and answered in the requested structure; it must score overall 1.0. For code the
template's placeholder line is replaced by a real solution, tested against real tests.
"""

import re

import pytest

from easyvideor1.data.templates import TEMPLATE_DIR, render_prompt, template_stem
from easyvideor1.records import Sample
from easyvideor1.rewards import TASK_FAMILIES, score
from easyvideor1.rewards.html_code import find_chromium

EXAMPLE = re.compile(r"<answer>((?:(?!</?answer>).)+)</answer>", re.DOTALL)
OPTIONS = ["A. a red ball", "B. a blue cube", "C. a green cone"]


def example_of(prompt):
    found = EXAMPLE.findall(prompt)
    assert found, "the template shows no example answer"
    return found[-1].strip()


@pytest.mark.parametrize("family", sorted(TASK_FAMILIES))
@pytest.mark.parametrize("data_type", ["video", "image", "text"])
def test_requested_format_round_trips(family, data_type):
    if family == "html-code" and find_chromium() is None:
        pytest.skip("Chromium not installed")
    sample = Sample(
        problem="What is shown?",
        answer="",
        problem_type=family,
        data_type=data_type,
        options=OPTIONS,
    )
    prompt = render_prompt(sample)
    assert "<think>" in prompt and "What is shown?" in prompt
    example = example_of(prompt)
    if family == "code":
        example = example.replace("# your code here", "def double(x):\n    return 2 * x")
        sample.extra["tests"] = ["assert double(3) == 6", "assert double(-1) == -2"]
    if family == "multiple choice":
        assert all(option in prompt for option in OPTIONS)
    sample.answer = example
    if family == "caption-mc":  # judged by an LLM reading the caption (tests/evaluation/test_tempcompass_captioning.py)
        sample.extra.update(mc_question="What happens? A. a dunk B. a pass", mc_answer="A. a dunk")
        with pytest.raises(ValueError, match="LLM judge"):
            score(f"<think>Looking at the {data_type}.</think><answer>{example}</answer>", sample)
        return
    result = score(f"<think>Looking at the {data_type}.</think><answer>{example}</answer>", sample)
    assert (result.overall, result.accuracy, result.format) == (1.0, 1.0, 1.0), (
        family,
        example,
        result,
    )


def test_modality_wording():
    words = {dt: render_prompt(Sample(problem="q", answer="", problem_type="boolean", data_type=dt)).splitlines()[0]
             for dt in ("video", "image", "text")}  # fmt: skip
    assert "video" in words["video"] and "image" in words["image"] and len(set(words.values())) == 3


def test_aliases_share_templates():
    assert template_stem("llava") == template_stem("critic") == "preference"
    assert template_stem("Spatial-Temporal Grounding") == "spatial_temporal_grounding"
    assert all((TEMPLATE_DIR / f"{template_stem(name)}.jinja").exists() for name in TASK_FAMILIES)


def test_override_by_directory_and_by_file(tmp_path):
    sample = Sample(
        problem="Is it raining?", answer="yes", problem_type="boolean", data_type="image"
    )
    (tmp_path / "boolean.jinja").write_text("Q: {{ problem }} ({{ data_type }}) yes/no")
    assert render_prompt(sample, tmp_path) == "Q: Is it raining? (image) yes/no"
    (tmp_path / "boolean.image.jinja").write_text("IMAGE Q: {{ problem }}")  # modality file wins
    assert render_prompt(sample, tmp_path) == "IMAGE Q: Is it raining?"
    single = tmp_path / "mine.jinja"
    single.write_text("{{ extra.hint }} :: {{ problem }}")
    sample.extra["hint"] = "look up"
    assert render_prompt(sample, single) == "look up :: Is it raining?"
    # types the directory lacks still use the shipped templates
    mc = Sample(problem="Which?", answer="A", problem_type="multiple choice", options=OPTIONS)
    assert "A. a red ball" in render_prompt(mc, tmp_path)


def test_missing_template_and_bad_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a file nor a directory"):
        render_prompt(Sample(problem="q", answer="", problem_type="boolean"), tmp_path / "nope")
    (tmp_path / "t.jinja").write_text("{{ undefined_thing }}")
    with pytest.raises(Exception, match="undefined_thing"):
        render_prompt(Sample(problem="q", answer="", problem_type="boolean"), tmp_path / "t.jinja")
