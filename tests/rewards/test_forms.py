"""Every task family says what answers it reads (`rewards.forms.ANSWER_FORMS`), and its example
record (shown on docs/reference/data-format.md) is a good record: it loads, passes check-data
without media, and its answer, given as a tagged response, scores 1 by its own family's scorer."""

import json

import pytest

from easyvideor1.data.checks import check_file
from easyvideor1.data.loading import load_records
from easyvideor1.rewards import ANSWER_FORMS, TASK_FAMILIES, canonical_type, score
from easyvideor1.rewards.html_code import find_chromium

# html-code renders in Chromium (set-up installs it; its tests skip without it)
FAMILIES = [pytest.param(f, marks=pytest.mark.skipif(f == "html-code" and find_chromium() is None,
                                                     reason="Chromium not installed")) for f in ANSWER_FORMS]


def test_every_family_has_a_form_with_an_example_of_its_type():
    assert list(ANSWER_FORMS) == list(TASK_FAMILIES)
    for name, form in ANSWER_FORMS.items():
        assert form.answer and form.accuracy, name
        assert canonical_type(form.example["problem_type"]) == name


@pytest.mark.parametrize("family", FAMILIES)
def test_the_example_record_loads_checks_and_scores_1(tmp_path, family):
    form = ANSWER_FORMS[family]
    path = tmp_path / "example.jsonl"
    path.write_text(json.dumps(form.example) + "\n")
    report = check_file(str(path), open_media=False)
    assert report.total == 1 and report.problems == [], [str(p) for p in report.problems]
    (sample,) = load_records(path).samples
    response = f"<think>Reading the {sample.data_type}.</think><answer>{sample.answer}</answer>"
    if form.judged:  # scored by an LLM judge reading the answer (tests/evaluation/test_tempcompass_captioning.py)
        with pytest.raises(ValueError, match="LLM judge"):
            score(response, sample)
        return
    result = score(response, sample)
    assert (result.accuracy, result.format, result.overall) == (1.0, 1.0, 1.0), result
