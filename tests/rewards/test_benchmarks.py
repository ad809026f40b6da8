"""The scorers on the real benchmark annotation files: every ground truth, given as the
response, scores accuracy 1; a wrong answer of the same form does not.

OVO-Bench's non-multiple-choice task codes (CRR, SSR: yes/no; REC: a count) are mapped the way
an evaluation adapter must map them; every other record goes through unchanged.
"""

import json

import pytest
from benchmark_annotations import ROOT, needs_annotations

from easyvideor1.data.loading import load_samples
from easyvideor1.rewards import canonical_type, score
from easyvideor1.rewards.multiple_choice import extract_letter, option_map
from easyvideor1.rewards.spatiotemporal_grounding import read_tube
from easyvideor1.rewards.temporal_grounding import read_interval

FILES = sorted(p.name for p in ROOT.glob("*.json*")) if ROOT.is_dir() else []
OVO_TASKS = {"CRR": "boolean", "SSR": "boolean", "REC": "numerical"}


def samples_of(name):
    for sample in load_samples(ROOT / name):
        if sample.problem_type in OVO_TASKS:
            sample.problem_type = OVO_TASKS[sample.problem_type]
        yield sample


def wrong_answer(sample):
    family = canonical_type(sample.problem_type)
    if family == "multiple choice":
        letters = sorted(option_map(sample.options)) + ["A", "B"]  # 6 records have a single option
        truth = extract_letter(sample.answer, sample.options)
        return f"<answer>{next(letter for letter in letters if letter != truth)}</answer>"
    if family in ("numerical", "regression"):
        from easyvideor1.rewards.numerical import last_number

        return f"<answer>{last_number(sample.answer).value * 3 + 7}</answer>"
    if family == "temporal grounding":
        start, end = read_interval(sample.answer)
        return f"<answer>[{end + 1}, {end + 2}]</answer>"
    if family == "spatial-temporal grounding":
        end = read_tube(sample.answer)["time"][1]
        return json.dumps({"time": [end + 1, end + 2], "boxes": {}})
    if family == "boolean":
        return "<answer>no</answer>" if "yes" in sample.answer.lower() else "<answer>yes</answer>"
    return "<answer>zqx unrelated</answer>"


@needs_annotations
@pytest.mark.parametrize("name", FILES)
def test_ground_truth_scores_one_and_wrong_answers_do_not(name):
    count = 0
    for sample in samples_of(name):
        count += 1
        assert score(sample.answer, sample).accuracy == 1.0, (
            name,
            sample.problem_id,
            sample.answer[:200],
        )
        wrong = score(wrong_answer(sample), sample).accuracy
        assert wrong < 1.0 and (
            wrong == 0.0 or canonical_type(sample.problem_type) == "open-ended"
        ), (name, sample.problem_id)
    assert count > 0


@needs_annotations
def test_perfectly_formatted_ground_truth_scores_overall_one():
    for name in (
        "mvbench.json",
        "vsibench.json",
        "stvg.json",
        "ovobench.json",
        "charades_sta.json",
    ):
        for sample in list(samples_of(name))[:200]:
            family = canonical_type(sample.problem_type)
            if family == "temporal grounding":
                content = json.dumps(list(read_interval(sample.answer)))
            elif family == "multiple choice":
                content = extract_letter(sample.answer, sample.options)
            else:
                from easyvideor1.rewards.format import answer_text

                content = answer_text(sample.answer)
            result = score(f"<think>Watching.</think><answer>{content}</answer>", sample)
            assert result.overall == 1.0, (name, sample.problem_id, content, result)
