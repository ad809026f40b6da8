"""Every benchmark's score and breakdown cell gets an interval of the number it reports: on the
real annotation files (../shared/benchmark-annotations, skipped when absent) with mixed right and
wrong answers, each benchmark's estimand gives back its reported overall and cells, clustered by
the sample's video; a score whose estimand does not match says "not available" instead."""

from __future__ import annotations

import dataclasses

import pytest
from benchmark_annotations import ROOT, needs_annotations
from test_official_scores import right, wrong

from easyvideor1.evaluation.adapters import BENCHMARKS
from easyvideor1.evaluation.intervals import add_intervals
from easyvideor1.evaluation.results import ResultRow

N = 60  # samples per benchmark, spread over the file: enough videos for intervals, several categories
# the benchmarks whose score is not the plain mean over rows, and two whose is
FILES = {"mvbench": "mvbench.json", "ovobench": "ovobench.json", "vsibench": "vsibench.json",
         "videomathqa": "videomathqa.jsonl", "videomme": "videomme.json", "stvg": "stvg.json"}


def answered(bench, samples):
    """Two right answers in three (a third wrong), so scores vary within every category."""
    return [bench.result_row(s, wrong(s) if i % 3 == 2 else right(s)) for i, s in enumerate(samples)]


@needs_annotations
@pytest.mark.parametrize("name, file", list(FILES.items()))
def test_every_number_has_the_interval_of_itself(name, file):
    bench = BENCHMARKS[name]
    samples = bench.load(ROOT, annotation_file=ROOT / file)
    rows = answered(bench, samples[:: max(1, len(samples) // N)][:N])
    agg = bench.aggregate(rows)
    head = add_intervals(bench, rows, agg)
    assert head is not None and head.point() == pytest.approx(agg.overall)
    cells = [(f"{t}={k}", c.ci) for t, table in agg.categories.items() for k, c in table.items()]
    for what, ci in [("overall", agg.ci), *cells]:
        assert not ci.note.startswith("not available"), (name, what, ci)
        assert ci.note or ci.low <= ci.high, (name, what, ci)
    assert agg.ci.units >= agg.ci.clusters >= 1
    assert all(c.startswith("video:") for c in head.clusters)  # clustered by the sample's video
    assert len(set(head.clusters)) == agg.ci.clusters


def group_rows(groups: int, logic: bool) -> list[ResultRow]:
    """Video-MME-v2 rows: groups of 4 on one video each, right on a varying share."""
    rows = []
    for g in range(groups):
        for p in range(4):
            labels = {"group": str(g), "position": str(p), "level": str(1 + g % 3),
                      "group_type": "logic" if logic and g % 2 else "relevance", "group_structure": "[1, 2, 3, 4]",
                      "second_head": "perception" if g % 2 else "reasoning"}
            rows.append(ResultRow(id=str(4 * g + p), status="ok", score=float((g + p) % 3 != 0), labels=labels,
                                  video=f"v{g}.mp4"))
    return rows


def test_videomme_v2_groups_are_the_units_and_a_mismatch_says_not_available():
    bench = BENCHMARKS["videomme_v2"]
    rows = group_rows(24, logic=True)
    agg = bench.aggregate(rows)
    add_intervals(bench, rows, agg)
    assert (agg.ci.units, agg.ci.clusters) == (24, 24) and agg.ci.low < agg.overall < agg.ci.high
    assert all(c.ci.units == c.count for table in agg.categories.values() for c in table.values())
    # without its estimands the overall would be the mean over questions, not over groups: refused
    plain = dataclasses.replace(bench, estimands=None)
    agg = plain.aggregate(rows)
    add_intervals(plain, rows, agg)
    assert agg.ci.low is None and agg.ci.note.startswith("not available") and agg.ci.text() == "n/a"


def test_a_question_of_several_types_counts_in_each_type_cell():
    # LVBench: "a|b" puts a question in both cells, as the table counts it
    bench = BENCHMARKS["lvbench"]
    types = ("key information retrieval", "reasoning", "key information retrieval|reasoning")
    rows = [ResultRow(id=str(i), status="ok", score=float(i % 4 != 0), video=f"v{i // 2}.mp4",
                      labels={"question_type": types[i % 3], "video_type": "sports"}) for i in range(60)]
    agg = bench.aggregate(rows)
    add_intervals(bench, rows, agg)
    cells = agg.categories["question_type"]
    assert {k: c.count for k, c in cells.items()} == {"key information retrieval": 40, "reasoning": 40}
    assert all(c.ci.units == 40 and c.ci.low < c.score <= c.ci.high for c in cells.values())
    assert agg.ci.clusters == 30 and agg.ci.units == 60
