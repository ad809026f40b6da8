"""The real converted annotation files in ../shared/benchmark-annotations (skipped when absent):
every record loads unchanged, a prompt builds, the ground truth given as the response scores
exactly 1.0, and a wrong answer scores below 1.0."""

from __future__ import annotations

import json
import os

import pytest
from benchmark_annotations import ROOT, needs_annotations

from easyvideor1.data.loading import read_records
from easyvideor1.evaluation.adapters import BENCHMARKS
from easyvideor1.rewards.multiple_choice import option_map

# (benchmark, a real file it reads); mlvu-test.json / mmvu-mc.json are copies of mlvu.json / mmvu.json
FILES = [*{
    "videomme": "videomme.json", "mvbench": "mvbench.json", "motionbench": "motionbench.json",
    "lvbench": "lvbench.json", "longvideobench": "longvideobench.json", "mlvu": "mlvu.json",
    "mlvu-dev": "mlvu-dev.json", "holmes": "holmes.json", "minerva": "minerva.json",
    "vcrbench": "vcrbench.json", "videoreasonbench": "videoreasonbench.json",
    "longvideoreason": "longvideoreason.json", "mmvu": "mmvu.json", "mmvu-all": "mmvu-all.json",
    "videommmu": "videommmu_with_image.json", "videomathqa": "videomathqa.jsonl",
    "vsibench": "vsibench.json", "charades_sta": "charades_sta.json", "stvg": "stvg.json",
    "ovobench": "ovobench.json", "livesports3k_qa": "livesports3k_qa.json",
}.items(), ("videommmu", "videommmu.json")]  # fmt: skip
pytestmark = needs_annotations


def wrong_response(sample) -> str:
    """A response that must not score 1.0 for this sample's task type."""
    kind = sample.problem_type
    if kind == "multiple choice":
        from easyvideor1.rewards.multiple_choice import extract_letter

        truth = extract_letter(sample.answer, sample.options)
        letters = [*option_map(sample.options), *"ABCDEFGHIJ"]  # a 1-option record: a letter it lacks
        return f"<answer>{next(k for k in letters if k != truth)}</answer>"
    if kind in ("numerical", "regression"):
        from easyvideor1.rewards.numerical import read_truth

        return f"<answer>{read_truth(sample, kind).value * 3 + 7}</answer>"
    if kind == "boolean":
        return "<answer>no</answer>" if "yes" in sample.answer.lower() else "<answer>yes</answer>"
    if kind in ("temporal grounding", "spatial-temporal grounding"):
        return '<answer>{"time": [100000, 100001], "boxes": {}}</answer>'
    return "<answer>zebra quantum lighthouse</answer>"  # open-ended: unrelated words


@pytest.mark.parametrize("name, file", FILES)
def test_real_file(name, file):
    path = ROOT / file
    bench = BENCHMARKS[name]
    raw = [r for _, r in read_records(path)]
    samples = bench.load(ROOT, annotation_file=path)
    assert len(samples) == len(raw)
    assert len({s.problem_id for s in samples}) == len(samples)  # resume keys are unique
    wrong = []
    for s, r in zip(samples, raw):
        truth = r.get("solution", r.get("answer"))
        truth = truth if isinstance(truth, str) else json.dumps(truth)
        # loaded unchanged: text, answer, options and media path as the record wrote them
        assert s.extra.get("original_problem", s.problem) == r["problem"]
        assert s.answer == truth
        assert os.path.normpath(s.extra.get("original_videos", s.videos)[0]).endswith(os.path.normpath(r["path"]))
        assert bench.prompt(s).strip()
        row = bench.result_row(s, truth)
        assert (row.status, row.score) == ("ok", 1.0), (s.problem_id, truth, row.reason)
        if bench.result_row(s, wrong_response(s)).score >= 1.0:
            wrong.append(s.problem_id)
    assert not wrong, f"{name}: a wrong answer scored 1.0 on {wrong[:10]}"
